#!/usr/bin/env python3
"""Writes a thin_dump XML for measuring thinfs dump/restore at scale.

Device 1 maps ORIGIN blocks in runs of 1-8 blocks placed at random in the
data area; device 2 (a snapshot that diverged) shares every other run of
device 1 (same data blocks) and maps its own blocks in their place. Shared
runs get time 0 and the rest time 1, as `thinfs dump` and dm-thin print
them. Deterministic for a given --seed.

  bench/thin_xml_gen.py --blocks 500000 > big.xml
  truncate -s $((64 * 1024 * NR_DATA_BLOCKS)) data   # sparse data area
  thinfs restore pool --from big.xml --data data
"""
import argparse
import random
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=500000,
                    help="blocks device 1 maps (device 2 maps as many)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sectors", type=int, default=128, help="data_block_size in sectors")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    nr_data = 4 * args.blocks + 16  # room for two 8-block slots per run
    # Runs of device 1: (origin, length); data positions: a shuffled set of
    # run slots, so neighbouring origins rarely neighbour in the data area.
    runs = []
    origin = 0
    while origin < args.blocks:
        n = min(rng.randint(1, 8), args.blocks - origin)
        runs.append((origin, n))
        origin += n
    slots = list(range(0, nr_data - 8, 8))
    rng.shuffle(slots)
    d1 = []   # (origin, data, length, time)
    d2 = []
    for i, (o, n) in enumerate(runs):
        shared = i % 2 == 0
        d1.append((o, slots[2 * i], n, 0 if shared else 1))
        d2.append((o, slots[2 * i] if shared else slots[2 * i + 1], n, 0 if shared else 1))
    out = sys.stdout
    out.write('<superblock uuid="" time="1" transaction="1" flags="0" version="2" '
              'data_block_size="%d" nr_data_blocks="%d">\n' % (args.sectors, nr_data))
    for dev_id, maps in ((1, d1), (2, d2)):
        total = sum(m[2] for m in maps)
        out.write('  <device dev_id="%d" mapped_blocks="%d" transaction="0" '
                  'creation_time="0" snap_time="1">\n' % (dev_id, total))
        for o, d, n, t in maps:
            if n == 1:
                out.write('    <single_mapping origin_block="%d" data_block="%d" time="%d"/>\n'
                          % (o, d, t))
            else:
                out.write('    <range_mapping origin_begin="%d" data_begin="%d" length="%d" '
                          'time="%d"/>\n' % (o, d, n, t))
        out.write('  </device>\n')
    out.write('</superblock>\n')


if __name__ == "__main__":
    main()
