#!/usr/bin/env python3
"""Where the time of `thinfs snapshot` on a mounted pool goes (docs/benchmarks.md,
lever 7): each step the CLI takes, done from here and timed alone, next to the
whole command, for one or more thinfs binaries side by side.

Steps (in the CLI's order): process start (`thinfs --version`, next to
/bin/true), the control-socket round trip that asks the daemon for the
mountpoint, open + fsync + close of the origin through the mount, the
snapshot request (the daemon's commit), and the whole `thinfs snapshot`.
Every snapshot is deleted (untimed) before the next; setups interleave
repetition by repetition.

Usage (root; each pool mounted by its own binary, ORIGIN written):
  bench/snapshot_breakdown.py --reps 31 --origin o1 \\
      before:/path/old/thinfs:/var/tmp/p1:/var/tmp/m1 after:build-rel/thinfs:/var/tmp/p2:/var/tmp/m2
Prints a Markdown table: median (min–max) in ms.
"""

import argparse
import os
import socket
import statistics
import struct
import subprocess
import time

STEPS = ["exec /bin/true", "exec thinfs --version", "control round trip (mountpoint)",
         "open+fsync+close origin (FUSE)", "snapshot request (daemon: commit)",
         "whole `thinfs snapshot`"]


def call(pool, command, **args):
    """One control-socket request (core/admin.h's framing); asserts success."""
    body = f"thinfs-admin=1\ncommand={command}\n" + "".join(f"{k}={v}\n" for k, v in args.items())
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.path.join(pool, "control.sock"))
        s.sendall(struct.pack("<I", len(body)) + body.encode())
        n = struct.unpack("<I", s.recv(4, socket.MSG_WAITALL))[0]
        reply = s.recv(n, socket.MSG_WAITALL)
    if b"\nexit=0\n" not in reply:
        raise RuntimeError(f"{command}: {reply!r}")


def ms(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=31)
    p.add_argument("--origin", required=True, help="device to snapshot (in every pool)")
    p.add_argument("setups", nargs="+", metavar="LABEL:BINARY:POOL:MOUNTPOINT")
    a = p.parse_args()
    setups = [s.split(":") for s in a.setups]
    if any(len(s) != 4 for s in setups):
        p.error("each setup is LABEL:BINARY:POOL:MOUNTPOINT")
    run = lambda cmd: subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True)
    res = {(label, step): [] for label, *_ in setups for step in STEPS}
    for _ in range(a.reps):
        for label, binary, pool, mnt in setups:
            steps = [lambda: run(["/bin/true"]),
                     lambda: run([binary, "--version"]),
                     lambda: call(pool, "mountpoint", json="0"),
                     lambda: fsync_file(os.path.join(mnt, a.origin)),
                     lambda: call(pool, "snapshot", source=a.origin, name="breakdown", json="0"),
                     lambda: run([binary, "snapshot", pool, a.origin, "breakdown"])]
            for step, fn in zip(STEPS, steps):
                res[(label, step)].append(ms(fn))
                if "snapshot" in step:
                    call(pool, "delete", name="breakdown", json="0")
    print("| step | " + " | ".join(label for label, *_ in setups) + " |")
    print("|---|" + "---:|" * len(setups))
    for step in STEPS:
        cells = [res[(label, step)] for label, *_ in setups]
        print(f"| {step} | " + " | ".join(
            f"{statistics.median(v):.2f} ({min(v):.2f}–{max(v):.2f})" for v in cells) + " |")
    with open("/proc/loadavg") as fh:
        print(f"\nload average at the end: {' '.join(fh.read().split()[:3])}")


if __name__ == "__main__":
    main()
