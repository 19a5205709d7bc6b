#!/usr/bin/env bash
# 4 KiB random reads through FUSE of a volume whose block map is larger
# than the metadata store's block cache, on two copies of one pool that
# differ only in how their map's compacted table files (the bottom level,
# where a long-lived pool's map lies) are compressed: the store's choice
# (LZ4) and ZSTD, the choice before lever 63 (docs/benchmarks.md).
#
#   bench/map_compression_read.sh [--rounds N] [--blocks N] [--runtime S]
#                                 [--dir DIR] [--alt PROBE_ARGS] BINARY [OPTIONS]
#
# Writes bench/thin_xml_gen.py --blocks N (default 4000000: two devices of
# N mapped 64 KiB blocks, half of device 2's shared with device 1) and
# restores it with BINARY into a pool over a sparse data file (no data
# written: the reads read holes, so what they cost is FUSE and the block
# map). Copies the pool, then compacts each copy's metadata offline with
# BINARY's build of bench/map_filter_probe --compact-store: the first with
# the store's own bottom-level compression, the second with ZSTD (or with
# the --compact-store options in PROBE_ARGS instead, e.g. "--block-size
# 4096"); the rounds call it "other". Mounts
# both with BINARY (-o OPTIONS; "-" for none) and runs, for N rounds
# (default 6), alternating which goes first, fio --rw=randread --bs=4k
# --ioengine=psync over the whole of device 1's file for S seconds
# (default 10). Prints each round's IOPS, then each copy's median
# (min-max) and Student's t of the first against the other (95%, as
# ministat computes it). Unmounts and removes DIR (default
# /var/tmp/map_compression_read) on any exit. Needs root (FUSE) and fio
# (exit 77 without them; 1 under CI).
set -euo pipefail
# shellcheck source=bench/benchlib.sh
source "$(dirname "$0")/benchlib.sh"
rounds=6 blocks=4000000 runtime=10 dir=/var/tmp/map_compression_read alt=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --blocks) blocks=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --alt) alt=$2; shift 2 ;;
    -h | --help) header_usage 27; exit 0 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  header_usage 27
  exit 2
fi
require_root_and_fio map_compression_read
bin=$(realpath "$1")
opts=${2:--}
[[ $opts == - ]] && opts=
probe=$(dirname "$bin")/bench/map_filter_probe
[[ -x $probe ]] || { echo "map_compression_read: no $probe (build target map_filter_probe)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
make_work_dir map_compression_read "$dir"
cleanup() {
  for m in "$dir"/m_*; do
    if mountpoint -q "$m" 2>/dev/null; then "$bin" umount "$m" >/dev/null 2>&1 || true; fi
  done
  rm -rf "$dir"
}
trap cleanup EXIT

nr_data=$((4 * blocks + 16))
python3 "$here/thin_xml_gen.py" --blocks "$blocks" >"$dir/pool.xml"
truncate -s $((64 * 1024 * nr_data)) "$dir/data_store"
"$bin" restore "$dir/pool_store" --from "$dir/pool.xml" --data "$dir/data_store" >/dev/null
rm "$dir/pool.xml"
cp -a "$dir/pool_store" "$dir/pool_other"
rm "$dir/pool_other/data"
truncate -s $((64 * 1024 * nr_data)) "$dir/pool_other/data"
"$probe" --compact-store "$dir/pool_store/meta"
if [[ -n $alt ]]; then
  # shellcheck disable=SC2086 # PROBE_ARGS are words
  "$probe" --compact-store "$dir/pool_other/meta" $alt
else
  "$probe" --compact-store "$dir/pool_other/meta" --bottom ZSTD
fi

names=(other store)
for n in "${names[@]}"; do
  mkdir "$dir/m_$n"
  "$bin" mount "$dir/pool_$n" "$dir/m_$n" ${opts:+-o "$opts"}
done
file=$(ls "$dir/m_store" | head -n 1)
echo "round copy IOPS"
results=$dir/results
: >"$results"
for ((r = 1; r <= rounds; r++)); do
  order=("${names[@]}")
  ((r % 2 == 0)) && order=(store other)
  for n in "${order[@]}"; do
    iops=$(fio --name=r --filename="$dir/m_$n/$file" --rw=randread --bs=4k --ioengine=psync \
      --time_based --runtime="$runtime" --norandommap --randrepeat=0 --output-format=json |
      python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
    echo "$r $n $iops" | tee -a "$results"
  done
done
python3 - "$results" "$here" "$alt" <<'EOF'
import sys
sys.path.insert(0, sys.argv[2])
sys.dont_write_bytecode = True
from fio_report import med_cell, ministat
samples = {}
for line in open(sys.argv[1]):
    _, name, iops = line.split()
    samples.setdefault(name, []).append(float(iops))
for name, v in samples.items():
    print(f"{name}: median {med_cell(v)} IOPS, {len(v)} rounds")
m = ministat(samples["other"], samples["store"])
verdict = "proven" if m["proven"] else "no difference proven"
other = sys.argv[3] or "ZSTD"
print(f"the store's against {other}: {m['pct']:+.1f}% ± {m['pct_ci']:.1f}%, {verdict}")
EOF
