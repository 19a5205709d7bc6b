#!/usr/bin/env bash
# Random 4 KiB reads of a volume with read-around and without: the probe
# behind docs/benchmarks.md, lever 44 (mount option read_around=SIZE).
#
#   bench/read_around_probe.sh [--rounds N] [--size SIZE] [--runtime S] [--jobs N]
#                              [--memory-limit SIZE] [--keep-cache] [--dir DIR] CONFIG...
#
# CONFIG is THINFS_BINARY[:MOUNT_OPTIONS], e.g. build/thinfs:read_around=64K
# build/thinfs:read_around=0. Each config gets a pool of its own (twice
# SIZE), mounted with its options, holding one SIZE volume (default 1G)
# written whole and fsynced. Per round (default 5) and config, in an order
# that turns round by round: the caches are dropped (drop_caches), then fio
# reads the volume 4 KiB at a time at random with O_DIRECT (each read one
# FUSE request, never the mount's cache), psync, --jobs jobs (default 1),
# for --runtime seconds (default 6). With --memory-limit SIZE, each daemon
# runs in a memory cgroup of its own limited to SIZE, which holds the host's
# cache of its data file too: a volume that does not fit in memory, where
# what read-around brings in is mostly dropped before it is read. With
# --keep-cache the caches are not dropped between rounds, so a daemon's
# cache, and what the kernel remembers of the pages reclaim evicted from
# it (dropping forgets that too), carries over: a steady state, for use
# with --memory-limit, where each cgroup holds its daemon's cache apart.
# One line per measurement: IOPS, MiB fio read, MiB the disk read
# (/sys/class/block/DEV/stat), their ratio and the disk's read requests. Works in DIR (default
# /var/tmp/read_around_probe; must not exist; removed at the end). Needs
# root, fio and python3 (exit 77 without them).
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=5 size=1G runtime=6 jobs=1 limit='' keep=0 work=/var/tmp/read_around_probe
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --memory-limit) limit=$2; shift 2 ;;
    --keep-cache) keep=1; shift ;;
    -h | --help) header_usage 26; exit 0 ;;
    *) echo "read_around_probe: unknown option $1" >&2; exit 2 ;;
  esac
done
parse_probe_configs read_around_probe 26 "$@"
n=${#bins[@]}

# The memory cgroup hierarchy: cgroup v2 where it holds the memory
# controller, else v1's memory hierarchy.
cg_root='' cg_limit_file='' cg_procs_file=''
if [[ -n $limit ]]; then
  if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    cg_root=/sys/fs/cgroup cg_limit_file=memory.max cg_procs_file=cgroup.procs
    grep -qw memory "$cg_root/cgroup.subtree_control" ||
      echo +memory >"$cg_root/cgroup.subtree_control"
  elif [[ -w /sys/fs/cgroup/memory/tasks ]]; then
    cg_root=/sys/fs/cgroup/memory cg_limit_file=memory.limit_in_bytes cg_procs_file=tasks
  else
    echo "read_around_probe: --memory-limit needs a memory cgroup (v2 or v1)" >&2
    [[ -n ${CI:-} ]] && exit 1
    exit 77
  fi
fi

make_work_dir read_around_probe "$work"
cgroups=()
cleanup() {
  local i c
  for ((i = 0; i < n; i++)); do
    mountpoint -q "$work/mnt$i" && "${bins[i]}" umount "$work/mnt$i" >/dev/null 2>&1
  done
  for c in "${cgroups[@]}"; do
    # The daemon leaves its cgroup when it exits, shortly after the unmount.
    for _ in $(seq 50); do rmdir "$c" 2>/dev/null && break; sleep 0.1; done
  done
  rm -rf "$work"
}
trap cleanup EXIT

stat_file=$(disk_stat_file "$work" read_around_probe) || exit 1
bytes=$(numfmt --from=iec "$size")
for ((i = 0; i < n; i++)); do
  mkdir "$work/mnt$i"
  "${bins[i]}" format "$work/pool$i" --size $((bytes * 2)) >/dev/null
  mount_cmd=("${bins[i]}" mount ${opts[i]:+-o "${opts[i]}"} "$work/pool$i" "$work/mnt$i")
  if [[ -n $limit ]]; then
    cg=$cg_root/read_around_probe.$$.$i
    mkdir "$cg"
    cgroups+=("$cg")
    numfmt --from=iec "$limit" >"$cg/$cg_limit_file"
    # The daemon the mount forks stays in the cgroup; the CLI exits.
    (echo "$BASHPID" >"$cg/$cg_procs_file" && exec "${mount_cmd[@]}")
  else
    "${mount_cmd[@]}"
  fi
  truncate -s "$size" "$work/mnt$i/v"
  fio --name=fill --filename="$work/mnt$i/v" --rw=write --bs=1M --size="$size" --end_fsync=1 \
    --output=/dev/null
done

printf '%-5s %-36s %9s %9s %10s %9s %10s\n' round config IOPS "fio MiB" "disk MiB" disk/fio \
  "disk I/Os"
for ((r = 1; r <= rounds; r++)); do
  for ((k = 0; k < n; k++)); do
    i=$(((k + r - 1) % n))
    if ((!keep)); then
      sync
      echo 3 >/proc/sys/vm/drop_caches
    fi
    read -r ios0 _ sectors0 _ <"$stat_file"
    fio --name=randread --filename="$work/mnt$i/v" --rw=randread --bs=4k --ioengine=psync \
      --direct=1 --numjobs="$jobs" --group_reporting --size="$size" --runtime="$runtime" \
      --time_based --randrepeat=0 --output-format=json --output="$work/fio.json"
    read -r ios1 _ sectors1 _ <"$stat_file"
    python3 -c '
import json, sys
path, r, name, sectors, ios = sys.argv[1:]
text = open(path).read()
read = json.loads(text[text.index("{"):])["jobs"][0]["read"]
disk, got, iops = int(sectors) * 512, read["io_bytes"], read["iops"]
print(f"{r:<5} {name:<36} {iops:9.0f} {got / 2**20:9.1f} {disk / 2**20:10.1f} "
      f"{disk / max(got, 1):9.2f} {ios:>10}")
' "$work/fio.json" "$r" "$(basename "${bins[i]}")${opts[i]:+:${opts[i]}}" $((sectors1 - sectors0)) \
      $((ios1 - ios0))
  done
done
