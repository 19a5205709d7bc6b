#!/usr/bin/env bash
# What a FUSE round trip costs with the client and the server on one CPU,
# left to the scheduler, or on different CPUs: the probe behind
# docs/benchmarks.md, lever 28 (cross-CPU wake-ups on a VM without halt
# polling).
#
#   bench/cpu_placement.sh [--rounds N] [--runtime S] [--dir DIR] THINFS_BINARY [PASSTHROUGH]
#
# Formats a 2 GiB pool, mounts it, writes a 512 MiB volume (fsynced); with
# PASSTHROUGH (build/bench/passthrough_ll_buffered: libfuse's passthrough_ll
# without O_DIRECT on the host file), also serves a 512 MiB file through
# it. The data stay in the host's page cache, and fio reads 4 KiB at random
# with O_DIRECT (psync, QD1, --runtime seconds, default 3), so every read is
# one FUSE round trip and no disk I/O. Per round (default 3) and server,
# three placements, with `taskset` on fio and on every thread of the server:
#   free       fio and server on every CPU, as the scheduler likes;
#   same-cpu   both on CPU 0: the server's wake-ups stay on one CPU;
#   cross-cpu  server on CPU 0, fio on CPU 1: every wake-up crosses.
# Prints one line per measurement (IOPS). Works in DIR (default
# /var/tmp/cpu_placement; must not exist; removed at the end). Needs root,
# fio, taskset, python3, and at least 2 CPUs (exit 77 without them).
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=3 runtime=3 work=/var/tmp/cpu_placement
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    -h | --help) header_usage 21; exit 0 ;;
    *) echo "cpu_placement: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 1 || $# -gt 2 ]]; then
  header_usage 21
  exit 2
fi
require_root_and_fio cpu_placement
if [[ $(nproc) -lt 2 ]]; then
  echo "cpu_placement: needs 2 CPUs, has $(nproc)" >&2
  exit 77
fi
all=0-$(($(nproc) - 1))
bin=$(realpath "$1")
pt=${2:+$(realpath "$2")}
make_work_dir cpu_placement "$work"

pt_pid=
cleanup() {
  mountpoint -q "$work/mnt" && "$bin" umount "$work/mnt" >/dev/null 2>&1
  if [[ -n $pt_pid ]]; then
    mountpoint -q "$work/pt-mnt" && umount "$work/pt-mnt"
    wait "$pt_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/mnt"
"$bin" format "$work/pool" --size 2G >/dev/null
"$bin" mount "$work/pool" "$work/mnt"
truncate -s 512M "$work/mnt/vol"
servers=("thinfs:$(cat "$work/pool/lock"):$work/mnt/vol")
if [[ -n $pt ]]; then
  mkdir -p "$work/pt-src" "$work/pt-mnt"
  truncate -s 512M "$work/pt-src/f"
  start_passthrough cpu_placement "$pt" "$work/pt-src" "$work/pt-mnt" "$work/pt.log"
  pt_pid=$passthrough_pid
  servers+=("passthrough:$pt_pid:$work/pt-mnt/f")
fi
for s in "${servers[@]}"; do
  f=${s##*:}
  fio --name=fill --filename="$f" --rw=write --bs=1M --size=512M --end_fsync=1 --output=/dev/null
done

# IOPS of fio's 4 KiB O_DIRECT random reads of FILE, fio on CPU list CPUS.
read_iops() {
  taskset -c "$2" fio --name=r --filename="$1" --rw=randread --bs=4k --size=512M --direct=1 \
    --ioengine=psync --runtime="$runtime" --time_based --output-format=json \
    --output="$work/fio.json"
  python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['jobs'][0]['read']['iops']))" \
    "$work/fio.json"
}

for r in $(seq "$rounds"); do
  for s in "${servers[@]}"; do
    IFS=: read -r name pid f <<<"$s"
    taskset -a -p -c "$all" "$pid" >/dev/null
    # One warm-up read of every page: the measurement reads the page cache.
    [[ $r -eq 1 ]] && fio --name=warm --filename="$f" --rw=read --bs=1M --size=512M --output=/dev/null
    echo "round $r $name free      $(read_iops "$f" "$all") IOPS"
    taskset -a -p -c 0 "$pid" >/dev/null
    echo "round $r $name same-cpu  $(read_iops "$f" 0) IOPS"
    echo "round $r $name cross-cpu $(read_iops "$f" 1) IOPS"
    taskset -a -p -c "$all" "$pid" >/dev/null
  done
done
