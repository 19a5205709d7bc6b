#!/usr/bin/env bash
# CPU time a FUSE daemon spends per I/O request, user + system, measured from
# /proc/PID/stat around one fio run with a fixed number of I/Os. Used for the
# levers in docs/benchmarks.md ("Levers tried"): wall-clock IOPS on this
# shared 2-CPU machine mostly measure the scheduler, CPU per request measures
# the daemon's own work, and two daemons can be compared side by side.
#
# usage: bench/daemon_cpu.sh PID FILE FIO-ARGS...
#   e.g. bench/daemon_cpu.sh "$(grep -o '[0-9]*' pool/lock | head -1)" vols/vol \
#          --rw=randread --bs=4k --number_ios=30000
# FILE must be at least 512 MiB (fio --size=512M).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,13p' "$0" >&2
  exit 1
fi
pid=$1
file=$2
shift 2
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
before=$(ticks)
fio --name=j --filename="$file" --size=512M "$@" --output-format=json >"$out"
after=$(ticks)
python3 - "$before" "$after" "$file" "$out" <<'PY'
import json, os, sys
before, after = float(sys.argv[1]), float(sys.argv[2])
job = json.load(open(sys.argv[4]))["jobs"][0]
ios = job["read"]["total_ios"] + job["write"]["total_ios"]
iops = job["read"]["iops"] + job["write"]["iops"]
cpu_us = (after - before) / os.sysconf("SC_CLK_TCK") * 1e6
print("%-16s ios=%d iops=%.0f daemon_cpu_us_per_io=%.1f" % (sys.argv[3], ios, iops, cpu_us / max(ios, 1)))
PY
