#!/usr/bin/env bash
# 1 MiB sequential reads of a volume whose blocks copy-on-write left
# scattered over the data area, against a snapshot of it that kept the
# contiguous layout: the probe behind docs/benchmarks.md, levers 22 and 31.
#
#   bench/scattered_read.sh [--rounds N] [--size SIZE] [--cow SIZE]
#                           [--cow-bs BS] [--warm] [--dir DIR] THINFS...
#
# Per binary: formats a pool of three times --size, writes a volume `vol`
# of --size (default 1G) in order (fsynced), snapshots it as `snap`, then
# rewrites --cow (default 256M) of `vol` in writes of --cow-bs (default
# 64k: whole blocks; 4k: partial ones, whose copies are owed) at random
# places, so those blocks move to new places in the data area. Then, N
# rounds (default 3) with the binaries alternating, reads `vol` and then
# `snap` with fio (rw=read, bs=1M, psync), and prints MiB/s with the
# disk's read counters around each (/sys/class/block/DEV/stat of the disk
# under the pool, '-' where there is none), then each binary's median
# (min-max) per file and, for every binary after the first, Student's t
# of its MiB/s against the first's (95%, as ministat computes it).
# Cold (default): every cache dropped before each read. --warm: the data file stays in the host's page cache (one untimed read
# first) and fio reads with O_DIRECT, so the kernel's FUSE page cache is
# bypassed as a loop device with --direct-io=on does: the daemon's preads
# from the cached data file are what is timed. Works in DIR (default
# /var/tmp/scattered_read; must not exist; removed at the end). Needs root
# (drop_caches, mount), fio and 3.5 times --size free per binary.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=3 size=1G cow=256M cow_bs=64k warm=0 work=/var/tmp/scattered_read
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --cow) cow=$2; shift 2 ;;
    --cow-bs) cow_bs=$2; shift 2 ;;
    --warm) warm=1; shift ;;
    -h | --help) header_usage 25; exit 0 ;;
    *) echo "scattered_read: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 1 ]]; then
  header_usage 25
  exit 2
fi
require_root_and_fio scattered_read
bins=()
for b in "$@"; do bins+=("$(realpath "$b")"); done
bytes=$(numfmt --from=iec "$size")
make_work_dir scattered_read "$work"
mounted=()
cleanup() {
  for i in "${mounted[@]}"; do "${bins[$i]}" umount "$work/$i/mnt" || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The block device under the work directory, as /sys/class/block names it.
stat_file=$(disk_stat_file "$work" scattered_read) || stat_file=
counters() {  # read I/Os completed and sectors read (fields 1 and 3), or 0 0
  if [[ -n $stat_file ]]; then disk_reads "$stat_file"; else echo 0 0; fi
}

for i in "${!bins[@]}"; do
  d=$work/$i
  mkdir -p "$d/mnt"
  "${bins[$i]}" format "$d/pool" --size "$((3 * bytes))" >/dev/null
  "${bins[$i]}" mount "$d/pool" "$d/mnt"
  mounted+=("$i")
  truncate -s "$bytes" "$d/mnt/vol"
  fio --name=fill --filename="$d/mnt/vol" --rw=write --bs=1M --size="$bytes" --end_fsync=1 \
    --output=/dev/null
  "${bins[$i]}" snapshot "$d/pool" vol snap >/dev/null
  fio --name=cow --filename="$d/mnt/vol" --rw=randwrite --bs="$cow_bs" --size="$bytes" --io_size="$cow" \
    --randrepeat=0 --end_fsync=1 --output=/dev/null
done

# Fields 1 and 3 of the stat file: read I/Os completed, sectors read.
read_args=(--rw=read --bs=1M --size="$bytes" --ioengine=psync)
if ((warm)); then
  read_args+=(--direct=1 --invalidate=0)
  for i in "${!bins[@]}"; do
    for f in vol snap; do
      fio --name=warm --filename="$work/$i/mnt/$f" "${read_args[@]}" --output=/dev/null
    done
  done
else
  read_args+=(--invalidate=1)
fi
: >"$work/samples"
printf '%-5s %-3s %-5s %9s %10s %10s %12s\n' round bin file MiB/s "disk MiB" "disk I/Os" "mean I/O KiB"
for ((r = 1; r <= rounds; r++)); do
  for i in "${!bins[@]}"; do
    for f in vol snap; do
      if ((!warm)); then
        sync
        echo 3 >/proc/sys/vm/drop_caches
      fi
      read -r ios0 sec0 < <(counters)
      fio --name=read --filename="$work/$i/mnt/$f" "${read_args[@]}" \
        --output-format=json --output="$work/out.json"
      read -r ios1 sec1 < <(counters)
      bw=$(fio_mibs "$work/out.json")
      ios=$((ios1 - ios0)) sectors=$((sec1 - sec0))
      if [[ -n $stat_file ]]; then
        disk=("$((sectors / 2048))" "$ios" "$((sectors / 2 / (ios > 0 ? ios : 1)))")
      else
        disk=(- - -)
      fi
      printf '%-5s %-3s %-5s %9s %10s %10s %12s\n' "$r" "$i" "$f" "$bw" "${disk[@]}"
      echo "$i $f $bw" >>"$work/samples"
    done
  done
done
echo "medians (min-max) over $rounds rounds, MiB/s:"
PYTHONPATH="$(dirname "$0")" python3 -B - "$work/samples" "${bins[@]}" <<'PY'
import sys
from fio_report import med_cell, ministat
samples = {}
for line in open(sys.argv[1]):
    i, f, bw = line.split()
    samples.setdefault((int(i), f), []).append(float(bw))
for (i, f), v in sorted(samples.items()):
    print(f"  bin {i} {f:<5} {med_cell(v):>22}  {sys.argv[2 + i]}")
others = sorted({i for i, _ in samples if i > 0})
if others:
    print("Student's t at 95% against bin 0 (ministat's figures):")
for i in others:
    for f in ("vol", "snap"):
        m = ministat(samples[(0, f)], samples[(i, f)])
        if m is None:
            print(f"  bin {i} {f:<5} n/a (needs 2 rounds)")
            continue
        verdict = "proven" if m["proven"] else "not proven"
        print(f"  bin {i} {f:<5} {m['pct']:+.1f}% +- {m['pct_ci']:.1f}%, {verdict}")
PY
