#!/usr/bin/env bash
# Mounts through the thinfs binary while the kernel's FUSE-over-io_uring
# knob (/sys/module/fuse/parameters/enable_uring) flips Y/N, as it does
# when a test that turns it on ends beside another test's mount
# (docs/fuse.md, "Registration"). Runs FuseTest.ReadaheadOptionSetsTheMountsWindow
# (three mounts with the default io_uring=auto) RUNS times and counts the
# runs that fail and those that hang (no end within 40 s; their mounts
# are then taken down).
#   scripts/uring-knob-race.sh [RUNS (20)] [SECONDS between flips (0.004; 0: at once)] [ENGINE]
# ENGINE: a thinfs-engine binary to run in place of build/thinfs-engine
# for the length of the run (e.g. one built at an earlier commit); the
# build's own is put back afterwards. Root only. Leaves the knob N.
set -uo pipefail
cd "$(dirname "$0")/.."

runs="${1:-20}"
nap="${2:-0.004}"
engine="${3:-}"
knob=/sys/module/fuse/parameters/enable_uring
tests=build/tests/e2e_tests
[[ -w $knob ]] || { echo "uring-knob-race: cannot write $knob (root, Linux 6.14+)" >&2; exit 1; }
[[ -x $tests ]] || { echo "uring-knob-race: build $tests first" >&2; exit 1; }

saved=""
flipper=""
log=$(mktemp /tmp/uring-knob-race.XXXXXX)
cleanup() {
  [[ -n $flipper ]] && kill "$flipper" 2>/dev/null && wait "$flipper" 2>/dev/null
  echo N > "$knob"
  [[ -n $saved ]] && mv -f "$saved" build/thinfs-engine
  rm -f "$log"
}
trap cleanup EXIT
if [[ -n $engine ]]; then
  saved=$(mktemp build/thinfs-engine.saved.XXXXXX)
  cp -p build/thinfs-engine "$saved"
  cp "$engine" build/thinfs-engine
fi

# Not started after `cd ... &&`: $! must be the loop's own subshell.
if [[ $nap == 0 ]]; then
  (while :; do echo Y > "$knob"; echo N > "$knob"; done) &
else
  (while :; do echo Y > "$knob"; sleep "$nap"; echo N > "$knob"; sleep "$nap"; done) &
fi
flipper=$!

failed=0
hung=0
for ((i = 1; i <= runs; i++)); do
  timeout 40 "$tests" --gtest_filter=FuseTest.ReadaheadOptionSetsTheMountsWindow >"$log" 2>&1
  rc=$?
  if [[ $rc == 124 ]]; then
    hung=$((hung + 1))
    echo "run $i hung; its daemon's log:"
    cat /tmp/thinfs-e2e-*/daemon.log 2>/dev/null | tail -5
    # The test's own mounts: kill their daemons (the only thinfs mounts of
    # those pools) and take the mounts down.
    for m in $(awk '$2 ~ "^/tmp/thinfs-e2e-" {print $2}' /proc/mounts); do
      d=${m%/mnt}
      for p in $(pgrep -f "thinfs mount $d/pool"); do kill -9 "$p"; done
      umount -l "$m"
      rm -rf "$d"
    done
  elif [[ $rc != 0 ]]; then
    failed=$((failed + 1))
    echo "run $i failed:"
    grep -E "Failure|ended before|refused" "$log" | head -5
  fi
done
echo "uring-knob-race: ${engine:-build/thinfs-engine}, flips every ${nap} s: $failed of $runs runs failed, $hung hung"
[[ $failed == 0 && $hung == 0 ]]
