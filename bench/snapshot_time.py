"""Snapshot creation time vs origin size for thinfs and its peers (part of
fio_compare.py; see docs/benchmarks.md).

Origins of a small and a large size (1 GiB / 4 GiB; --quick 64 / 256 MiB),
every block written with non-zero data and synced before timing:
  thinfs             `thinfs snapshot POOL ORIGIN NAME` on the mounted pool
                     (CLI -> control socket -> daemon, commits); origins
                     written front to back, and thinfs-frag: written in
                     random 64 KiB-block order (fragmented block map);
  thinfs-alt         as thinfs, with the --alt-thinfs binary (CLI and daemon)
                     in a pool of its own: before/after of a change, side by
                     side (only with --alt-thinfs);
  qcow2-internal     `qemu-img snapshot -c` on a fully written 64 KiB-cluster
                     image (bumps every cluster's refcount);
  qcow2-overlay      `qemu-img create -f qcow2 -b ORIGIN -F qcow2`;
  btrfs-reflink      `cp --reflink=always` of a fully written file;
  btrfs-subvol       `btrfs subvolume snapshot` of a subvolume holding it.
Each timed command's wall time (including the process start); the snapshot
is removed (untimed) before the next one, so every repetition starts from
the same state. Methods and sizes interleave repetition by repetition.
--snap-methods picks a subset (default: all; thinfs-alt with --alt-thinfs).
"""

import os
import statistics

from benchlib import MiB, fill, log, make_file, run, size_label, timed
from fio_targets import qcow2_fill

METHODS = ["thinfs", "thinfs-frag", "qcow2-internal", "qcow2-overlay", "btrfs-reflink",
           "btrfs-subvol"]
ALT = "thinfs-alt"
DURABLE = {"thinfs": "yes (commits)", "thinfs-frag": "yes (commits)",
           ALT: "yes (commits)",
           "qcow2-internal": "yes (qemu-img flushes)", "qcow2-overlay": "no (no fsync)",
           "btrfs-reflink": "no (no fsync)", "btrfs-subvol": "yes (commits a transaction)"}


def methods_of(args):
    """The methods to time, in report order: --snap-methods (comma-separated)
    or all, thinfs-alt only with --alt-thinfs."""
    known = METHODS + ([ALT] if args.alt_thinfs else [])
    want = args.snap_methods.split(",") if args.snap_methods else known
    bad = [m for m in want if m not in known]
    if bad:
        raise ValueError(f"unknown snapshot method(s) {', '.join(bad)} (known: "
                         f"{', '.join(known)}; {ALT} needs --alt-thinfs)")
    return [m for m in known if m in want]


def tools_of(methods):
    need = set()
    for m in methods:
        if m.startswith("qcow2"):
            need.update(["qemu-img", "qemu-io"])
        if m.startswith("btrfs"):
            need.update(["mkfs.btrfs", "btrfs", "cp"])
    return need


def measure(stack, sizes, reps):
    """Sets up every origin under stack (torn down with it), times the
    methods, and removes the origins' data right after. Returns
    {method: {size: [ms, ...]}}."""
    a = stack.args
    methods = methods_of(a)
    small, big = sizes
    ops = {}  # (method, size) -> (snap, cleanup)
    # thinfs: one pool for thinfs and thinfs-frag, another for thinfs-alt.
    pools = [(m, b, "seq" if m != "thinfs-frag" else "frag",
              "snap-pool" if m != ALT else "snap-pool-alt")
             for m, b in (("thinfs", a.thinfs), ("thinfs-frag", a.thinfs),
                          (ALT, a.alt_thinfs)) if m in methods]
    for pool_dir in sorted({p[3] for p in pools}):
        binary = a.alt_thinfs if pool_dir.endswith("-alt") else a.thinfs
        stack._start_thinfs(binary, stack.path(pool_dir), stack.path(pool_dir + "-mnt"),
                            2 * (small + big) + 512 * MiB, a.mount_options)
    for method, binary, order, pool_dir in pools:
        pool, mnt = stack.path(pool_dir), stack.path(pool_dir + "-mnt")
        for size in sizes:
            name = f"o-{order}-{size}"
            make_file(os.path.join(mnt, name), size)
            fill(os.path.join(mnt, name), size, order)
            ops[(method, size)] = (
                lambda b=binary, p=pool, name=name: timed([b, "snapshot", p, name, "s-" + name]),
                lambda b=binary, p=pool, name=name: run([b, "delete", p, "s-" + name]))
    # qcow2: one fully written image per size serves both methods.
    for size in sizes if any(m.startswith("qcow2") for m in methods) else []:
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
    btrfs = any(m.startswith("btrfs") for m in methods)
    if btrfs:
        backing, bmnt = stack.path("snap-btrfs.img"), stack.path("snap-btrfs-mnt")
        make_file(backing, int((small + big) * 1.25) + 512 * MiB)
        dev = stack.loop(backing)
        run(["mkfs.btrfs", "-q", "-f", dev])
        stack.mount(dev, bmnt, "btrfs")
    for size in sizes if btrfs else []:
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

    times = {m: {s: [] for s in sizes} for m in methods}
    for rep in range(reps):
        order = sizes if rep % 2 == 0 else sizes[::-1]
        for method in methods:
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
    methods = [m for m in METHODS + [ALT] if m in times]
    for m in methods:
        v1, v4 = times[m][small], times[m][big]
        r = [y / x for x, y in zip(v1, v4) if x]
        cell = lambda v: f"{statistics.median(v):.1f} ({min(v):.1f}–{max(v):.1f})"
        L.append(f"| {m} | {cell(v1)} | {cell(v4)} | {statistics.median(r):.2f} "
                 f"({min(r):.2f}–{max(r):.2f}) | {DURABLE[m]} |")
    L.append("")
    # Issue 5's target 5.
    med = {m: {z: statistics.median(times[m][z]) for z in sizes} for m in methods}
    L.append("| # | goal | value | met? |")
    L.append("|---|---|---:|---|")
    # The verdict is thinfs's (and thinfs-frag's); thinfs-alt is shown for
    # comparison only.
    verdict = "met"
    for m in (x for x in ("thinfs", "thinfs-frag", ALT) if x in methods):
        judged = m != ALT
        note = "" if judged else " (alt binary, not judged)"

        def goal(text, value, ok):
            nonlocal verdict
            if judged and not ok:
                verdict = "not met"
            L.append(f"| 5 | {m}{note}: {text} | {value} | {'met' if ok else '**not met**'} |")
        ratio = med[m][big] / med[m][small]
        goal(f"median {b} / median {s} ≤ 1.2", f"{ratio:.2f}", ratio <= 1.2)
        if "btrfs-subvol" not in methods:
            continue
        for z in sizes:
            r = med[m][z] / med["btrfs-subvol"][z]
            goal(f"no slower than btrfs-subvol ({size_label(z)})", f"{r:.2f}×", r <= 1.0)
    if not any(m in methods for m in ("thinfs", "thinfs-frag")) or "btrfs-subvol" not in methods:
        verdict = "not judged (--snap-methods left out thinfs or btrfs-subvol)"
    L.append("")
    return L, verdict


def complete(times, sizes, reps):
    return [f"{m}/{size_label(z)}" for m in times for z in sizes
            if len(times.get(m, {}).get(z, [])) != reps]
