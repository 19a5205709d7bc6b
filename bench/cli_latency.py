#!/usr/bin/env python3
"""How long the CLI's commands take on a pool that no daemon serves, for one
or more thinfs binaries side by side (docs/benchmarks.md, lever 59).

Each binary formats a pool of its own under --dir and creates a device
`base` on it. Then, round by round and binary by binary (interleaved, so
machine drift hits all alike), each command runs once: `status`, `list`,
`snapshot base sR` and `delete sR`. Every command is a fresh process that
opens the pool's files and metadata store itself, as a script's loop of
snapshots on an unmounted pool does. Measured per command: the wall time
around the process, and the CPU it used (user + system, from the kernel's
accounting of waited-for children).

Usage (from the repository root):
  bench/cli_latency.py --rounds 15 --dir /var/tmp/clib before:/path/old/thinfs after:build/thinfs
Prints a Markdown table (median, min–max, in ms) and, for every binary
after the first, the difference to the first as ministat computes it.
"""

import argparse
import os
import resource
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import run  # noqa: E402
from fio_report import ministat  # noqa: E402

COMMANDS = ["status", "list", "snapshot", "delete"]


def timed_with_cpu(cmd):
    """Runs cmd (it must succeed); returns (wall ms, CPU ms of the child).
    benchlib.timed, plus the child's user and system time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run(cmd)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
    return wall, cpu


def cell(v):
    return f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dir", required=True, help="scratch directory (created; removed after)")
    ap.add_argument("binaries", nargs="+", metavar="LABEL:PATH")
    a = ap.parse_args()

    bins = []
    for spec in a.binaries:
        label, _, path = spec.partition(":")
        if not path:
            ap.error(f"{spec}: expected LABEL:PATH")
        bins.append((label, os.path.abspath(path)))
    os.makedirs(a.dir, exist_ok=False)
    try:
        for label, path in bins:
            pool = os.path.join(a.dir, label)
            run([path, "format", pool, "--size", "4G"])
            run([path, "create", pool, "base", "--size", "1G"])
        res = {(label, c, k): [] for label, _ in bins for c in COMMANDS for k in ("wall", "cpu")}
        for r in range(a.rounds):
            for label, path in bins:
                pool = os.path.join(a.dir, label)
                args = {"status": [pool], "list": [pool], "snapshot": [pool, "base", f"s{r}"],
                        "delete": [pool, f"s{r}"]}
                for c in COMMANDS:
                    wall, cpu = timed_with_cpu([path, c] + args[c])
                    res[(label, c, "wall")].append(wall)
                    res[(label, c, "cpu")].append(cpu)
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)

    print(f"{a.rounds} rounds; ms, median (min–max)\n")
    print("| command | " + " | ".join(f"{label} wall | {label} CPU" for label, _ in bins) + " |")
    print("|---|" + "---|---|" * len(bins))
    for c in COMMANDS:
        row = [f"{cell(res[(label, c, 'wall')])} | {cell(res[(label, c, 'cpu')])}" for label, _ in bins]
        print(f"| {c} | " + " | ".join(row) + " |")
    base = bins[0][0]
    for label, _ in bins[1:]:
        print(f"\n{label} against {base} (Student's t, 95%):\n")
        print("| command | wall | CPU |")
        print("|---|---|---|")
        for c in COMMANDS:
            cells = []
            for k in ("wall", "cpu"):
                m = ministat(res[(base, c, k)], res[(label, c, k)])
                proven = ", proven" if m["proven"] else ", not proven"
                cells.append(f"{m['pct']:+.1f}% ± {m['pct_ci']:.1f}%{proven}")
            print(f"| {c} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
