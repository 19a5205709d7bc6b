#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan, THINFS_FUZZ=ON) in
# build-fuzz/ and runs each for SECONDS seconds (default 20), starting from
# the committed seed corpus fuzz/corpus/<target>/ (copied, so that the
# committed corpus only changes by hand). Exits non-zero if a target finds
# a crash; the reproducer is left in build-fuzz/findings/<target>/.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(admin_wire size record_codec record_sealed bitmap_header mount_options thin_xml send_stream); fi

cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DTHINFS_WERROR=ON -DTHINFS_FUZZ=ON \
  -DTHINFS_SANITIZE=ON -DTHINFS_BENCH=OFF -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz -j2 --target "${targets[@]/%/_fuzzer}"

status=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  findings="build-fuzz/findings/$t"
  mkdir -p "$work" "$findings"
  cp -n fuzz/corpus/"$t"/* "$work"/ 2>/dev/null || true
  echo "== $t: ${seconds}s"
  set +e
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "build-fuzz/${t}_fuzzer" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work" >"build-fuzz/$t.log" 2>&1
  rc=$?
  set -e
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|==[0-9]+==.*ERROR|SUMMARY)|^Done [0-9]+ runs' \
    "build-fuzz/$t.log" || true
  if [ "$rc" != 0 ] || [ -n "$(ls -A "$findings")" ]; then
    echo "!! $t: exit $rc, findings in $findings (log build-fuzz/$t.log)"
    status=1
  fi
done
exit $status
