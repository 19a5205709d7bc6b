#!/usr/bin/env bash
# What `thinfs mount -o cpu_latency=0` buys and what it costs: the probe
# behind docs/benchmarks.md, lever 37 (fs/cpu_latency.h).
#
#   bench/cpu_latency_cost.sh [--rounds N] [--runtime S] [--dir DIR] [--mount-options O] THINFS_BINARY
#
# Formats a 2 GiB pool and writes a 512 MiB volume (fsynced). Per round
# (default 3), mounts it without and with cpu_latency=0 (in that order on
# odd rounds, the other on even ones; O, e.g. io_uring=off, is added to
# both) and runs two fio jobs of S seconds (default 5) on the volume, free
# on every CPU: 4 KiB O_DIRECT random reads of data the host caches
# (psync, QD1: one FUSE round trip each, no disk I/O) and 4 KiB buffered
# random writes (psync). For each it prints the IOPS, the machine's busy
# CPU time per request (from /proc/stat) and the CPU time the idle CPUs
# spent polling (cpuidle state 0, POLL, summed over CPUs: what the host
# sees as busy on a VM), per second. After the jobs it waits 0.5 s and
# measures 2 s of quiet: the polling there must be ~0, the limit lifted.
# Works in DIR (default /var/tmp/cpu_latency_cost; must not exist; removed
# at the end). Needs root and fio (exit 77 without them). Without cpuidle
# (no /sys/devices/system/cpu/cpu0/cpuidle/state0: a VM whose kernel has no
# cpuidle driver) the polled time reads n/a; the rest is measured.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=3 runtime=5 work=/var/tmp/cpu_latency_cost extra=
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --mount-options) extra=$2; shift 2 ;;
    -h | --help) header_usage 21; exit 0 ;;
    *) echo "cpu_latency_cost: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $# -ne 1 ]]; then
  header_usage 21
  exit 2
fi
require_root_and_fio cpu_latency_cost
cpuidle=1
if [[ ! -r /sys/devices/system/cpu/cpu0/cpuidle/state0/time ]]; then
  echo "cpu_latency_cost: no cpuidle states in /sys/devices/system/cpu/cpu0/cpuidle:" \
    "polled time n/a" >&2
  cpuidle=0
fi
bin=$(realpath "$1")
make_work_dir cpu_latency_cost "$work"

cleanup() {
  mountpoint -q "$work/mnt" && "$bin" umount "$work/mnt" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# Prints: busy jiffies (all CPUs) and POLL-state µs (all CPUs; 0 without
# cpuidle).
sample() {
  local busy poll=0 t
  busy=$(machine_busy_ticks)
  if [[ $cpuidle -eq 1 ]]; then
    for t in /sys/devices/system/cpu/cpu[0-9]*/cpuidle/state0/time; do
      poll=$((poll + $(cat "$t")))
    done
  fi
  echo "$busy $poll"
}

# Runs fio (the arguments) and prints "IOPS busy-µs-per-request poll-ms-per-s".
measure() {
  local b0 p0 b1 p1 t0 t1
  read -r b0 p0 < <(sample)
  t0=$(date +%s%N)
  fio "$@" --runtime="$runtime" --time_based --output-format=json --output="$work/fio.json"
  t1=$(date +%s%N)
  read -r b1 p1 < <(sample)
  python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))['jobs'][0]
iops = j['read']['iops'] + j['write']['iops']
b, p, ns, hz, cpuidle = (float(x) for x in sys.argv[2:])
s = ns / 1e9
polled = f'{p / 1e3 / s:6.1f}' if cpuidle else '   n/a'
print(f'{iops:8.0f} IOPS  {b / hz * 1e6 / (iops * s):6.1f} µs busy CPU/request  {polled} ms polled/s')
" "$work/fio.json" "$((b1 - b0))" "$((p1 - p0))" "$((t1 - t0))" "$(getconf CLK_TCK)" "$cpuidle"
}

mkdir -p "$work/mnt"
"$bin" format "$work/pool" --size 2G >/dev/null
"$bin" mount "$work/pool" "$work/mnt" ${extra:+-o "$extra"}
truncate -s 512M "$work/mnt/vol"
fio --name=fill --filename="$work/mnt/vol" --rw=write --bs=1M --size=512M --end_fsync=1 \
  --output=/dev/null
"$bin" umount "$work/mnt"

for r in $(seq "$rounds"); do
  variants=("off" "0")
  [[ $((r % 2)) -eq 0 ]] && variants=("0" "off")
  for v in "${variants[@]}"; do
    opts=cpu_latency=$v${extra:+,$extra}
    "$bin" mount "$work/pool" "$work/mnt" -o "$opts"
    fio --name=warm --filename="$work/mnt/vol" --rw=read --bs=1M --size=512M --output=/dev/null
    echo "round $r cpu_latency=$v randread4k direct: $(measure --name=r \
      --filename="$work/mnt/vol" --rw=randread --bs=4k --size=512M --direct=1 --ioengine=psync)"
    echo "round $r cpu_latency=$v randwrite4k:        $(measure --name=w \
      --filename="$work/mnt/vol" --rw=randwrite --bs=4k --size=512M --ioengine=psync)"
    sleep 0.5
    read -r _ p0 < <(sample)
    sleep 2
    read -r _ p1 < <(sample)
    quiet=n/a
    [[ $cpuidle -eq 1 ]] && quiet=$(( (p1 - p0) / 2000 ))
    echo "round $r cpu_latency=$v quiet 2 s after:    $quiet ms polled/s"
    "$bin" umount "$work/mnt"
  done
done
