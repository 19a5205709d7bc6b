#!/usr/bin/env python3
"""thinfs diff / send --from / receive and list, timed through the CLI.

Part 1, replication: for each CHANGED percentage (default 1 and 50), a
fresh pool (64 KiB blocks) with a 4 GiB device `vol`, MAPPED% (default 25)
of it written, snapshot s1, CHANGED% of its blocks rewritten at random,
snapshot s2 (bench/pool_builder, through the engine). Then ROUNDS times
(default 3): `thinfs diff POOL s1 s2`, `thinfs send POOL s2 --from s1 | wc
-c` (the stream is counted, not stored), and once `thinfs send POOL s2
--from s1 -o FILE` + `thinfs receive DEST s2 -i FILE` onto a pool holding
the received s1 (whose full send/receive is timed once too). Reports the
median and min-max of each, and stream bytes vs changed data bytes.

Part 2, list: for each N of --snapshots (default 2000), a pool (4 KiB
blocks) with an origin of 1024 written blocks and N snapshots, one origin
block rewritten after each; `thinfs list POOL` timed ROUNDS times with
--thinfs and, if given and N <= --baseline-max, with --baseline (an older
build, for before/after; its list is quadratic in N), outputs compared.

Everything lives in a temp dir under --dir and is removed at the end.

  bench/replication_bench.py --thinfs build-rel/thinfs \\
      --builder build-rel/bench/pool_builder [--baseline OLD/thinfs] \\
      [--dir /var/tmp] [--rounds 3] [--changed 1 50] [--snapshots 100 250 2000]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

GIB = 1 << 30


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def timed(cmd, shell=False):
    t = time.monotonic()
    out = subprocess.run(cmd, check=True, shell=shell, stdout=subprocess.PIPE).stdout
    return time.monotonic() - t, out


def fmt(samples):
    med = statistics.median(samples)
    return f"{med:.3f} s ({min(samples):.3f}-{max(samples):.3f})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--thinfs", required=True)
    ap.add_argument("--builder", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--changed", type=int, nargs="+", default=[1, 50])
    ap.add_argument("--mapped", type=int, default=25)
    ap.add_argument("--size", type=int, default=4 * GIB)
    ap.add_argument("--snapshots", type=int, nargs="+", default=[2000])
    ap.add_argument("--baseline-max", type=int, default=250,
                    help="run the baseline only up to this many snapshots (it is quadratic)")
    ap.add_argument("--skip-replication", action="store_true")
    ap.add_argument("--skip-list", action="store_true")
    a = ap.parse_args()
    t = a.thinfs
    work = tempfile.mkdtemp(prefix="thinfs-repl-", dir=a.dir)
    try:
        if not a.skip_replication:
            print(f"| changed | changed data | diff | send --from (to a pipe) | stream bytes "
                  f"| stream / changed | receive (incremental) | full send + receive of s1 |")
            print("|---|---|---|---|---|---|---|---|")
            for pct in a.changed:
                pool = os.path.join(work, f"p{pct}")
                dest = os.path.join(work, f"d{pct}")
                pool_size = a.size * (a.mapped + pct + 5) // 100
                run([t, "format", pool, "--size", str(pool_size)], stdout=subprocess.DEVNULL)
                run([t, "format", dest, "--size", str(pool_size)], stdout=subprocess.DEVNULL)
                changed = int(run([a.builder, "changed", pool, str(a.size), str(a.mapped),
                                   str(pct), "1"], stdout=subprocess.PIPE).stdout)
                changed_bytes = changed * 65536
                diffs, sends, size = [], [], 0
                for _ in range(a.rounds):
                    d, _ = timed([t, "diff", pool, "s1", "s2"])
                    diffs.append(d)
                    s, out = timed(f"{t} send {pool} s2 --from s1 | wc -c", shell=True)
                    sends.append(s)
                    size = int(out)
                full = os.path.join(work, "full.stream")
                incr = os.path.join(work, "incr.stream")
                f0 = time.monotonic()
                run([t, "send", pool, "s1", "-o", full])
                run([t, "receive", dest, "s1", "-i", full])
                full_time = time.monotonic() - f0
                os.unlink(full)
                run([t, "send", pool, "s2", "--from", "s1", "-o", incr])
                r, _ = timed([t, "receive", dest, "s2", "-i", incr])
                os.unlink(incr)
                print(f"| {pct}% | {changed_bytes / GIB:.3f} GiB | {fmt(diffs)} | {fmt(sends)} "
                      f"| {size} | {size / changed_bytes:.4f} | {r:.3f} s | {full_time:.3f} s |",
                      flush=True)
                shutil.rmtree(pool)
                shutil.rmtree(dest)
        if not a.skip_list:
            print("\n| snapshots | build | thinfs list, median (min-max) | same output as baseline |")
            print("|---|---|---|---|")
            for n in a.snapshots:
                pool = os.path.join(work, f"snaps{n}")
                run([t, "format", pool, "--size", "64M", "--block-size", "4K"],
                    stdout=subprocess.DEVNULL)
                run([a.builder, "snapshots", pool, str(n)])
                outputs = {}
                for label, binary in (("this build", t), ("baseline", a.baseline)):
                    if not binary or (label == "baseline" and n > a.baseline_max):
                        continue
                    samples = []
                    for _ in range(a.rounds):
                        s, outputs[label] = timed([binary, "list", pool])
                        samples.append(s)
                    same = ""
                    if label == "baseline":
                        same = str(outputs["baseline"] == outputs["this build"])
                    print(f"| {n} | {label} | {fmt(samples)} | {same} |", flush=True)
                shutil.rmtree(pool)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
