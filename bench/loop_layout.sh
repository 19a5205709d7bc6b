#!/usr/bin/env bash
# Where a file written through ext4 on a loop device over a volume lies in
# the pool, and what a cold sequential read of it asks the disk: the probe
# behind docs/benchmarks.md, levers 38 (a request's blocks as one run) and
# 39 (fresh pages on a VM that reports free memory to its host).
#
#   bench/loop_layout.sh [--rounds N] [--size SIZE] [--wait S] [--dir DIR] CONFIG...
#
# CONFIG is THINFS_BINARY or THINFS_BINARY:MOUNT_OPTIONS. Per CONFIG:
# formats a pool, mounts it, attaches `losetup --direct-io=on` to a volume
# of SIZE + 256 MiB (SIZE default 1G), makes ext4 on it and copies in a
# file of SIZE random bytes (the same bytes for every CONFIG), then `sync`.
# Prints the file's layout: the volume's runs of consecutive pool blocks
# (`thinfs dump`). Then N rounds (default 3), the CONFIGs in turn, in
# reverse order on even rounds: drops every cache, sleeps S seconds
# (default 0; lever 39: 5 lets the balloon report the freed pages), and
# reads the file with `dd bs=1M`, buffered and then with iflag=direct.
# Prints MiB/s, the disk's reads and their mean size, and the busy CPU
# time of the buffered read. Works in DIR (default /var/tmp/loop_layout;
# must not exist; removed at the end). Needs root, python3 and losetup.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=3 size=1G wait=0 work=/var/tmp/loop_layout
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --wait) wait=$2; shift 2 ;;
    -h | --help) header_usage 20; exit 0 ;;
    *) echo "loop_layout: unknown option $1" >&2; exit 2 ;;
  esac
done
parse_probe_configs loop_layout 20 "$@"
bytes=$(numfmt --from=iec "$size")
make_work_dir loop_layout "$work"
stat_file=$(disk_stat_file "$work" loop_layout)

mounted=() pids=() loops=() ext4s=()
cleanup() {
  for m in "${ext4s[@]}"; do umount "$m" || true; done
  for l in "${loops[@]}"; do losetup -d "$l" || true; done
  umount_configs "$work"
  rm -rf "$work"
}
trap cleanup EXIT

label() { echo "${bins[$1]}${opts[$1]:+ -o ${opts[$1]}}"; }

head -c "$bytes" /dev/urandom >"$work/src"
mount_configs "$work" "$((2 * bytes + 512 * 1048576))"
for i in "${!bins[@]}"; do
  d=$work/$i
  mkdir -p "$d/ext4"
  truncate -s "$((bytes + 256 * 1048576))" "$d/mnt/vol"
  l=$(losetup --find --show --direct-io=on "$d/mnt/vol")
  loops+=("$l")
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$l"
  mount "$l" "$d/ext4"
  ext4s+=("$d/ext4")
  cp "$work/src" "$d/ext4/file"
  sync
  "${bins[$i]}" dump "$d/pool" | python3 -c '
import re, sys
runs = blocks = 0
for line in sys.stdin:
    m = re.search(r"<range_mapping .*length=\"(\d+)\"", line)
    if m:
        runs += 1
        blocks += int(m.group(1))
    elif "<single_mapping" in line:
        runs += 1
        blocks += 1
print(f"{sys.argv[1]}: layout: {runs} runs of consecutive pool blocks for {blocks} blocks, "
      f"{blocks / max(runs, 1):.1f} blocks per run")
' "$(label "$i")"
done
rm "$work/src"

read_once() {  # read_once CONFIG ROUND MODE [dd flag]
  local i=$1 r=$2 mode=$3 flag=${4:-} a b t0 t1 c0 c1
  drop_caches
  sleep "$wait"
  a=$(disk_reads "$stat_file") c0=$(machine_busy_ticks) t0=$(date +%s.%N)
  dd if="$work/$i/ext4/file" of=/dev/null bs=1M ${flag:+"$flag"} status=none
  t1=$(date +%s.%N) c1=$(machine_busy_ticks) b=$(disk_reads "$stat_file")
  python3 - "$a" "$b" "$t0" "$t1" "$c0" "$c1" "$bytes" "$r" "$(label "$i")" "$mode" <<'EOF'
import os, sys
(r0, s0), (r1, s1) = (map(int, x.split()) for x in sys.argv[1:3])
secs = float(sys.argv[4]) - float(sys.argv[3])
busy = (int(sys.argv[6]) - int(sys.argv[5])) / os.sysconf("SC_CLK_TCK")
reads = r1 - r0
print(f"round {sys.argv[8]} {sys.argv[9]}: {sys.argv[10]} read {int(sys.argv[7]) / secs / 2**20:.0f} "
      f"MiB/s, {reads} disk reads of {(s1 - s0) * 512 / max(reads, 1) / 1024:.0f} KiB mean, "
      f"busy CPU {busy:.2f} s")
EOF
}

order=("${!bins[@]}")
for r in $(seq 1 "$rounds"); do
  if ((r % 2 == 0)); then
    mapfile -t seq_order < <(printf '%s\n' "${order[@]}" | tac)
  else
    seq_order=("${order[@]}")
  fi
  for i in "${seq_order[@]}"; do
    read_once "$i" "$r" buffered
    read_once "$i" "$r" direct iflag=direct
  done
done
