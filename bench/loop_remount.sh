#!/usr/bin/env bash
# Mount options compared on one and the same pool: cold 1 MiB sequential
# reads of a file in ext4 on a loop device over a volume, the pool mounted
# with each option set in turn, beside the same over a plain file. The
# probe behind docs/benchmarks.md, lever 48: fio_compare.py's -alt targets
# put the other options on a second pool, and two pools written alike
# read up to 30% apart in target 4's seqread1M (their layouts differ),
# which hides a lever's effect there.
#
#   bench/loop_remount.sh [--rounds N] [--size SIZE] [--dir DIR] [--fragment GIB]
#                         [--rw read|write] BINARY OPTIONS...
#
# Formats a pool with BINARY, mounts it, attaches `losetup --direct-io=on`
# to a volume of SIZE + 256 MiB (SIZE default 1G), makes ext4 on it and
# copies in a file of SIZE random bytes; the same on a plain file beside
# the pool. Then N rounds (default 5): per OPTIONS (mount -o; "-" for none;
# OTHER_BINARY@OPTIONS mounts with another build of thinfs, to compare two
# versions of the code on one pool), in reverse order on even rounds,
# unmounts the ext4, the loop device and
# the pool, mounts the pool with those options and attaches them again,
# drops every cache and reads the file with fio (rw=read, bs=1M, psync,
# as fio_compare.py's seqread1M); then the plain file's, the same way.
# Prints MiB/s, the ratio to the plain file's read of the same round, the
# disk's reads and the read requests the engine served (`thinfs status
# --json`, counters.reads, since the mount), then each option set's median
# (min-max) and, for every set after the
# first, Student's t of its MiB/s against the first's (95%, as ministat
# computes it). With --rw write, the job is fio_compare.py's seqwrite1M
# instead (rw=write, bs=1M, end_fsync=1, over the file), and the columns
# count the disk's writes and the write requests the engine served
# (lever 51). With --fragment, each mount is made, and 512 MiB of the
# file read once, while bench/fragment_memory.py holds GIB GiB with every
# other page freed: the daemon's buffers then lie in scattered pages, as
# on a machine that has run for a while (lever 50). Works in DIR (default
# /var/tmp/loop_remount; must not exist; removed at the end). Needs root,
# fio, python3 and losetup.
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"

rounds=5 size=1G work=/var/tmp/loop_remount fragment='' rw=read
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --dir) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --fragment) fragment=$2; shift 2 ;;
    --rw) rw=$2; shift 2 ;;
    -h | --help) header_usage 37; exit 0 ;;
    *) echo "loop_remount: unknown option $1" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 2 ]]; then
  header_usage 37
  exit 2
fi
if [[ $rw != read && $rw != write ]]; then
  echo "loop_remount: --rw is read or write, not $rw" >&2
  exit 2
fi
require_root_and_fio loop_remount
bin=$(realpath "$1")
shift
sets=("$@")
bytes=$(numfmt --from=iec "$size")
make_work_dir loop_remount "$work"
stat_file=$(disk_stat_file "$work" loop_remount)

pool=$work/pool mnt=$work/mnt vol_ext4=$work/vol-ext4 plain_ext4=$work/plain-ext4
vol_loop='' plain_loop='' pool_mounted=0 mount_bin=$bin frag_pid=
cleanup() {
  [[ -n $frag_pid ]] && kill "$frag_pid"
  mountpoint -q "$vol_ext4" && umount "$vol_ext4"
  mountpoint -q "$plain_ext4" && umount "$plain_ext4"
  [[ -n $vol_loop ]] && losetup -d "$vol_loop"
  [[ -n $plain_loop ]] && losetup -d "$plain_loop"
  ((pool_mounted)) && "$mount_bin" umount "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT

# mount_pool OPTIONS: the pool mounted with OPTIONS ("-": none) and the
# loop device attached to its volume.
mount_pool() {
  local o=$1
  mount_bin=$bin
  if [[ $o == *@* ]]; then
    mount_bin=$(realpath "${o%%@*}")
    o=${o#*@}
  fi
  if [[ $o == - ]]; then "$mount_bin" mount "$pool" "$mnt"; else "$mount_bin" mount "$pool" "$mnt" -o "$o"; fi
  pool_mounted=1
  vol_loop=$(losetup --find --show --direct-io=on "$mnt/vol")
}
unmount_pool() {
  umount "$vol_ext4"
  losetup -d "$vol_loop"
  vol_loop=
  "$mount_bin" umount "$mnt"
  pool_mounted=0
}

mkdir -p "$mnt" "$vol_ext4" "$plain_ext4"
"$bin" format "$pool" --size "$((2 * bytes + 512 * 1048576))" >/dev/null
"$bin" mount "$pool" "$mnt"
pool_mounted=1
truncate -s "$((bytes + 256 * 1048576))" "$mnt/vol" "$work/plain"
vol_loop=$(losetup --find --show --direct-io=on "$mnt/vol")
plain_loop=$(losetup --find --show --direct-io=on "$work/plain")
head -c "$bytes" /dev/urandom >"$work/src"
for l in "$vol_loop" "$plain_loop"; do
  mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$l"
done
mount "$vol_loop" "$vol_ext4"
mount "$plain_loop" "$plain_ext4"
cp "$work/src" "$vol_ext4/file"
cp "$work/src" "$plain_ext4/file"
rm "$work/src"
sync

# run_job FILE: runs the job (--rw) on FILE; prints MiB/s, then the
# disk's requests and MiB in the job's direction.
run_job() {
  local f=$1 ios0 sec0 ios1 sec1 extra=()
  [[ $rw == write ]] && extra=(--end_fsync=1)
  drop_caches
  read -r ios0 sec0 < <("disk_${rw}s" "$stat_file")
  fio --name="$rw" --filename="$f" --rw="$rw" --bs=1M --size="$bytes" --ioengine=psync \
    --invalidate=1 "${extra[@]}" --output-format=json --output="$work/out.json"
  read -r ios1 sec1 < <("disk_${rw}s" "$stat_file")
  fio_mibs "$work/out.json" "$rw"
  echo "$((ios1 - ios0)) $(((sec1 - sec0) / 2048))"
}
engine_requests() {
  "$mount_bin" status "$pool" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["counters"][sys.argv[1] + "s"])' "$rw"
}

: >"$work/samples"
printf '%-5s %-28s %7s %6s %9s %9s %s\n' round options MiB/s /plain "disk I/Os" "disk MiB" \
  "engine ${rw}s"
order=("${!sets[@]}")
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2 == 0)); then mapfile -t seq_order < <(printf '%s\n' "${order[@]}" | tac); else seq_order=("${order[@]}"); fi
  for i in "${seq_order[@]}"; do
    unmount_pool
    if [[ -n $fragment ]]; then
      : >"$work/fragment.out"
      python3 "$(dirname "$0")/fragment_memory.py" "$fragment" >"$work/fragment.out" &
      frag_pid=$!
      until grep -q ready "$work/fragment.out"; do
        kill -0 "$frag_pid" || { echo "loop_remount: fragment_memory.py failed" >&2; exit 1; }
        sleep 0.2
      done
    fi
    mount_pool "${sets[$i]}"
    mount "$vol_loop" "$vol_ext4"
    if [[ -n $frag_pid ]]; then
      dd if="$vol_ext4/file" of=/dev/null bs=1M count=512 status=none
      kill "$frag_pid"
      wait "$frag_pid" || true
      frag_pid=
    fi
    { read -r bw; read -r ios mib; } < <(run_job "$vol_ext4/file")
    ra=$(engine_requests)
    { read -r pbw; read -r pios pmib; } < <(run_job "$plain_ext4/file")
    ratio=$(python3 -c "print(f'{$bw / max($pbw, 1):.2f}')")
    printf '%-5s %-28s %7s %6s %9s %9s %s\n' "$r" "${sets[$i]}" "$bw" "$ratio" "$ios" "$mib" "$ra"
    printf '%-5s %-28s %7s %6s %9s %9s\n' "$r" "(plain file)" "$pbw" "" "$pios" "$pmib"
    echo "$i $bw $ratio $pbw" >>"$work/samples"
  done
done
PYTHONPATH="$(dirname "$0")" python3 -B - "$work/samples" "${sets[@]}" <<'PY'
import statistics
import sys
from fio_report import med_cell, ministat
bw, ratio, plain = {}, {}, []
for line in open(sys.argv[1]):
    i, b, q, p = line.split()
    bw.setdefault(int(i), []).append(float(b))
    ratio.setdefault(int(i), []).append(float(q))
    plain.append(float(p))
print("medians (min-max) over the rounds, MiB/s, and of the ratio to the plain file's read:")
for i in sorted(bw):
    print(f"  {sys.argv[2 + i]:<28} {med_cell(bw[i]):>24}   ratio {statistics.median(ratio[i]):.2f} ({min(ratio[i]):.2f}–{max(ratio[i]):.2f})")
print(f"  {'(plain file)':<28} {med_cell(plain):>24}")
others = [i for i in sorted(bw) if i > 0]
if others:
    print(f"Student's t at 95% against {sys.argv[2]} (ministat's figures):")
for i in others:
    m = ministat(bw[0], bw[i])
    if m is None:
        print(f"  {sys.argv[2 + i]}: n/a (needs 2 rounds)")
        continue
    verdict = "proven" if m["proven"] else "not proven"
    print(f"  {sys.argv[2 + i]}: {m['pct']:+.1f}% +- {m['pct_ci']:.1f}%, {verdict}")
PY
