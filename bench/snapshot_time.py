"""Snapshot creation time vs origin size for thinfs and its peers (part of
fio_compare.py; see docs/benchmarks.md).

Origins of a small and a large size (1 GiB / 4 GiB; --quick 64 / 256 MiB),
every block written with non-zero data and synced before timing:
  thinfs             `thinfs snapshot POOL ORIGIN NAME` on the mounted pool
                     (CLI -> control socket -> daemon, commits); origins
                     written front to back, and thinfs-frag: written in
                     random 64 KiB-block order (fragmented block map);
  qcow2-internal     `qemu-img snapshot -c` on a fully written 64 KiB-cluster
                     image (bumps every cluster's refcount);
  qcow2-overlay      `qemu-img create -f qcow2 -b ORIGIN -F qcow2`;
  btrfs-reflink      `cp --reflink=always` of a fully written file;
  btrfs-subvol       `btrfs subvolume snapshot` of a subvolume holding it.
Each timed command's wall time (including the process start); the snapshot
is removed (untimed) before the next one, so every repetition starts from
the same state. Methods and sizes interleave repetition by repetition.
"""

import os
import statistics

from benchlib import MiB, fill, log, make_file, run, size_label, timed
from fio_targets import qcow2_fill

METHODS = ["thinfs", "thinfs-frag", "qcow2-internal", "qcow2-overlay", "btrfs-reflink",
           "btrfs-subvol"]
DURABLE = {"thinfs": "yes (commits)", "thinfs-frag": "yes (commits)",
           "qcow2-internal": "yes (qemu-img flushes)", "qcow2-overlay": "no (no fsync)",
           "btrfs-reflink": "no (no fsync)", "btrfs-subvol": "yes (commits a transaction)"}


def measure(stack, sizes, reps):
    """Sets up every origin under stack (torn down with it), times the
    methods, and removes the origins' data right after. Returns
    {method: {size: [ms, ...]}}."""
    a = stack.args
    small, big = sizes
    ops = {}  # (method, size) -> (snap, cleanup)
    # thinfs: one pool, four origins.
    pool, mnt = stack.path("snap-pool"), stack.path("snap-mnt")
    stack._start_thinfs(a.thinfs, pool, mnt, 2 * (small + big) + 512 * MiB, a.mount_options)
    for order, method in (("seq", "thinfs"), ("frag", "thinfs-frag")):
        for size in sizes:
            name = f"o-{order}-{size}"
            make_file(os.path.join(mnt, name), size)
            fill(os.path.join(mnt, name), size, order)
            ops[(method, size)] = (
                lambda name=name: timed([a.thinfs, "snapshot", pool, name, "s-" + name]),
                lambda name=name: run([a.thinfs, "delete", pool, "s-" + name]))
    # qcow2: one fully written image per size serves both methods.
    for size in sizes:
        img, ov = stack.path(f"snap-{size}.qcow2"), stack.path(f"snap-{size}-ov.qcow2")
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=64k", img,
             str(size)])
        qcow2_fill(img, size)
        ops[("qcow2-internal", size)] = (
            lambda img=img: timed(["qemu-img", "snapshot", "-c", "s", img]),
            lambda img=img: run(["qemu-img", "snapshot", "-d", "s", img]))
        ops[("qcow2-overlay", size)] = (
            lambda img=img, ov=ov: timed(["qemu-img", "create", "-q", "-f", "qcow2", "-b", img,
                                          "-F", "qcow2", ov]),
            lambda ov=ov: os.unlink(ov))
    # btrfs: one file system, a subvolume per size holding a written file.
    backing, bmnt = stack.path("snap-btrfs.img"), stack.path("snap-btrfs-mnt")
    make_file(backing, int((small + big) * 1.25) + 512 * MiB)
    dev = stack.loop(backing)
    run(["mkfs.btrfs", "-q", "-f", dev])
    stack.mount(dev, bmnt, "btrfs")
    for size in sizes:
        sub = os.path.join(bmnt, f"sub-{size}")
        run(["btrfs", "-q", "subvolume", "create", sub])
        origin, copy = os.path.join(sub, "origin"), os.path.join(sub, "copy")
        fill(origin, size)
        ops[("btrfs-reflink", size)] = (
            lambda origin=origin, copy=copy: timed(["cp", "--reflink=always", origin, copy]),
            lambda copy=copy: os.unlink(copy))
        snap = os.path.join(bmnt, f"snap-{size}")
        ops[("btrfs-subvol", size)] = (
            lambda sub=sub, snap=snap: timed(["btrfs", "-q", "subvolume", "snapshot", sub,
                                              snap]),
            lambda snap=snap: run(["btrfs", "-q", "subvolume", "delete", snap]))
    run(["sync"])

    times = {m: {s: [] for s in sizes} for m in METHODS}
    for rep in range(reps):
        order = sizes if rep % 2 == 0 else sizes[::-1]
        for method in METHODS:
            for size in order:
                snap, cleanup = ops[(method, size)]
                ms = snap()
                cleanup()
                times[method][size].append(ms)
        log(f"snapshot timing: repetition {rep + 1}/{reps} done")
    return times


def report(times, sizes, reps):
    small, big = sizes
    s, b = size_label(small), size_label(big)
    L = [f"Wall time of one snapshot command (ms), median (min–max) of {reps} repetitions; "
         f"ratio {b}/{s}: median (min–max) of the per-repetition ratios.\n",
         f"| method | {s} (ms) | {b} (ms) | ratio {b}/{s} | durable when it returns |",
         "|---|---:|---:|---:|---|"]
    for m in METHODS:
        v1, v4 = times[m][small], times[m][big]
        r = [y / x for x, y in zip(v1, v4) if x]
        cell = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"
        L.append(f"| {m} | {cell(v1)} | {cell(v4)} | {statistics.median(r):.2f} "
                 f"({min(r):.2f}–{max(r):.2f}) | {DURABLE[m]} |")
    L.append("")
    # Issue 5's target 5.
    med = {m: {z: statistics.median(times[m][z]) for z in sizes} for m in METHODS}
    L.append("| # | goal | value | met? |")
    L.append("|---|---|---:|---|")
    verdict = "met"
    for m in ("thinfs", "thinfs-frag"):
        ratio = med[m][big] / med[m][small]
        ok = ratio <= 1.2
        verdict = verdict if ok else "not met"
        L.append(f"| 5 | {m}: median {b} / median {s} ≤ 1.2 | {ratio:.2f} | "
                 f"{'met' if ok else '**not met**'} |")
        for z in sizes:
            r = med[m][z] / med["btrfs-subvol"][z]
            ok = r <= 1.0
            verdict = verdict if ok else "not met"
            L.append(f"| 5 | {m} no slower than btrfs-subvol ({size_label(z)}) | "
                     f"{r:.2f}× | {'met' if ok else '**not met**'} |")
    L.append("")
    return L, verdict


def complete(times, sizes, reps):
    return [f"{m}/{size_label(z)}" for m in METHODS for z in sizes
            if len(times.get(m, {}).get(z, [])) != reps]
