#!/usr/bin/env bash
# Long fuzz runs for the figures in docs/reliability.md: runs the given
# targets one after the other (start two copies of this script for two
# lanes), each for SECONDS of wall time at nice 19 in one process (one job), on its
# accumulated corpus build-fuzz/corpus/<target>/ (seeded from
# fuzz/corpus/<target>/). Needs the fuzzers built (scripts/fuzz.sh 1 does
# it). Prints per target: CPU seconds, executions, exec per CPU second,
# coverage (cov/ft), corpus size, and any crash (reproducer left in
# build-fuzz/findings/<target>/).
#   scripts/fuzz-long.sh SECONDS TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="$1"
shift
for t in "$@"; do
  work="build-fuzz/corpus/$t"
  findings="build-fuzz/findings/$t"
  mkdir -p "$work" "$findings"
  cp -n fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  log="build-fuzz/$t.long.log"
  set +e
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 /usr/bin/time -f "cpu_seconds %U %S" \
    nice -n 19 "build-fuzz/${t}_fuzzer" -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="$findings/" "$work" >"$log" 2>&1
  rc=$?
  set -e
  cpu=$(awk '/^cpu_seconds/ {print $2 + $3}' "$log")
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  last=$(grep -E '#[0-9]+' "$log" | grep -E 'cov: ' | tail -1)
  echo "$t: rc=$rc cpu_s=$cpu runs=${runs:-?} exec_per_cpu_s=$(awk -v r="${runs:-0}" -v c="${cpu:-0}" 'BEGIN{if (c>0) printf "%d", r/c; else print "?"}') last: $last crashes: $(ls "$findings" | wc -l)"
done
