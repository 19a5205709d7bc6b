#!/usr/bin/env python3
"""fio through the whole stack: thinfs against its peers (issue 5's suite).

One command sets up, in a fresh temp directory under --dir (one host file
system for all), every target (bench/fio_targets.py), runs the fio jobs
below interleaved target by target (in the listed order on even rounds,
reversed on odd ones), job by job, round by round, tears
everything down, then times snapshot creation vs origin size
(bench/snapshot_time.py) in a second temp directory, removed right after.

Targets: raw, fuse-passthrough (libfuse's passthrough_ll), qcow2-qsd and
qcow2-qsd-snap (qemu-storage-daemon FUSE export), btrfs-reflink, thinfs,
thinfs-snap, raw-loop-ext4, thinfs-loop-ext4 (loop devices attached with
--loop-options, default --direct-io=on), and the opt-in thinfs-alt,
thinfs-alt-snap (thinfs and thinfs-snap on a second pool with other mount
options or another binary, for a lever's before/after), raw-loop-ext4-alt
and thinfs-loop-ext4-alt (--alt-loop-options), fuse-passthrough-alt, and
passthrough-loop-ext4 (ext4 on a loop device over a file in a FUSE
passthrough, --loop-passthrough: what FUSE alone costs a loop device,
target 4's ceiling). The -alt targets live on a second pool, whose layout
differs: its loop device's seqread1M can differ by 30% with the same
options (bench/loop_remount.sh compares options on one pool).
Non-COW targets are written once before round 1 (untimed), so their jobs
overwrite; COW targets (-snap, -reflink) get a new snapshot/copy of a fully
written origin before every job, so their writes copy on write.
Jobs (fio, JSON output; metric in brackets):
  seqwrite1M       1 MiB sequential write of SIZE, end_fsync=1   [MiB/s]
  seqread1M        1 MiB sequential read of SIZE                 [MiB/s]
  randwrite4k      4 KiB random write, 1 job, psync, QD1         [IOPS]
  randread4k       4 KiB random read, 1 job, psync, QD1          [IOPS]
  randrw4k-4jobs   4 KiB random 50/50 read/write, 4 jobs, psync  [IOPS, r+w]
  randread4k-qd32  4 KiB random read, libaio, iodepth 32, direct=1 (n/a
                   where O_DIRECT is refused)                    [IOPS]
Opt-in jobs (only when named in --jobs):
  randwrite4k-4jobs-direct  4 KiB random write, 4 jobs, psync, direct=1 [IOPS]
  randrw4k-4jobs-direct     as randrw4k-4jobs with direct=1       [IOPS, r+w]
  randwrite4k-fsync         as randwrite4k, fsync after every write [IOPS]
  randwrite4k-fdatasync     as randwrite4k, fdatasync after every write [IOPS]
Between jobs (untimed) every file of the target's stack is fsynced and, with
--cache cold (default), evicted from the page cache. Reports medians with
min-max, ratios to raw, Student's t at 95% (as ministat) for the pairs of
issue 5's targets and --compare pairs, a PNG chart (gnuplot), and whether
issue 5's targets 1-5 are met in this run. --quick: 1 round, 32 MiB files,
0.5 s jobs, 32/128 MiB snapshot origins; exits non-zero unless every table is
complete (it never judges a timing).

Needs root, /dev/fuse, loop devices, fio, mkfs.ext4, mkfs.btrfs, qemu-img,
qemu-io, qemu-storage-daemon, gnuplot, the thinfs and passthrough_ll
binaries. Exits 77 (skip) when they are missing, unless CI is set in the
environment (then 1: nothing is skipped silently in CI). Cleans up mounts,
loop devices and daemons on any exit (exception, SIGINT, SIGTERM, SIGHUP).
"""

import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

import fio_report  # noqa: E402
import snapshot_time  # noqa: E402
from benchlib import MiB, loadavg, log, parse_size, run, size_label  # noqa: E402
from fio_targets import (ALT, ALT_SNAP, LOOP_OPTIONS, OPT_IN, PT_ALT, PT_LOOP,  # noqa: E402
                         RAW_LOOP_ALT, TARGETS, THINFS_LOOP_ALT, TOOLS, Stack)  # noqa: E402

JOBS = [
    # name, rw, bs, numjobs, extra fio args, metric
    ("seqwrite1M", "write", "1M", 1, ["--end_fsync=1"], "MiB/s"),
    ("seqread1M", "read", "1M", 1, [], "MiB/s"),
    ("randwrite4k", "randwrite", "4k", 1, [], "IOPS"),
    ("randread4k", "randread", "4k", 1, [], "IOPS"),
    ("randrw4k-4jobs", "randrw", "4k", 4, ["--rwmixread=50"], "IOPS"),
    ("randread4k-qd32", "randread", "4k", 1,
     ["--ioengine=libaio", "--iodepth=32", "--direct=1"], "IOPS"),
]

# Not run unless named in --jobs: issue 5's job set is fixed, these measure a
# lever (docs/benchmarks.md lever 14: direct writes from several threads to
# one file, as qemu cache=none with aio=threads issues them).
OPT_IN_JOBS = [
    ("randwrite4k-4jobs-direct", "randwrite", "4k", 4, ["--direct=1"], "IOPS"),
    ("randrw4k-4jobs-direct", "randrw", "4k", 4, ["--rwmixread=50", "--direct=1"], "IOPS"),
    # A database's commit pattern: every write made durable before the next
    # (lever 26 and what the passthrough's fsync costs against thinfs's).
    ("randwrite4k-fsync", "randwrite", "4k", 1, ["--fsync=1"], "IOPS"),
    ("randwrite4k-fdatasync", "randwrite", "4k", 1, ["--fdatasync=1"], "IOPS"),
]


def settle(target, drop):
    """fsyncs every file of the target's stack and, if `drop`, evicts it
    from the page cache (dd iflag=nocache count=0 does the same)."""
    for f in target.flush_files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            if drop:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def fio(args, target, job, size, runtime, out_json):
    name, rw, bs, numjobs, extra, _ = job
    cmd = ["fio", f"--name={name}", f"--filename={target.fio_file}", f"--rw={rw}",
           f"--bs={bs}", f"--size={size}", f"--numjobs={numjobs}", "--group_reporting",
           "--ioengine=psync", "--output-format=json", f"--output={out_json}",
           f"--invalidate={1 if args.cache == 'cold' else 0}", "--randrepeat=0"]
    if rw.startswith("rand"):
        cmd += [f"--runtime={round(runtime * 1000)}ms", "--time_based"]
    cmd += extra
    run(cmd)
    with open(out_json) as fh:
        text = fh.read()
    # fio may print notes before the JSON object.
    j = json.loads(text[text.index("{"):])["jobs"][0]
    sides = [j[s] for s in (["read", "write"] if rw == "randrw"
                            else ["write"] if "write" in rw else ["read"])]
    return {"MiB/s": sum(s["bw_bytes"] for s in sides) / MiB,
            "IOPS": sum(s["iops"] for s in sides)}


CPU_LATENCY = "/dev/cpu_dma_latency"
NO_CPU_LATENCY_LIMIT = 2_000_000_000  # PM_QOS_CPU_LATENCY_DEFAULT_VALUE


def cpu_latency_limit():
    """The machine's CPU wake-up latency limit in µs (PM QoS: the lowest
    any process holds through /dev/cpu_dma_latency), or None."""
    try:
        with open(CPU_LATENCY, "rb") as fh:
            return struct.unpack("i", fh.read(4))[0]
    except (OSError, struct.error):
        return None


def cpu_latency_label(limit, by_suite):
    """How the report's first line gives the limit the run started with."""
    if limit in (None, NO_CPU_LATENCY_LIMIT):
        return "none"
    return f"{limit} µs" + (", held by the suite for every target" if by_suite else "")


def wait_cpu_latency(baseline):
    """Waits up to 2 s for the limit to be back at `baseline`, its value
    when the run started: a thinfs mounted with -o cpu_latency=USEC holds
    it until 50-100 ms after its last request, and it must not run into
    the next target's job. Returns the limit the job starts with."""
    deadline = time.monotonic() + 2
    v = cpu_latency_limit()
    while v != baseline and time.monotonic() < deadline:
        time.sleep(0.01)
        v = cpu_latency_limit()
    return v


def prewrite(target, size):
    run(["fio", "--name=prewrite", f"--filename={target.fio_file}", "--rw=write",
         "--bs=1M", f"--size={size}", "--end_fsync=1", "--output-format=json",
         "--output=/dev/null"])


def machine():
    def out(cmd):
        try:
            return run(cmd, check=False).stdout.strip()
        except OSError:
            return "n/a"
    cpu = "n/a"
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "loadavg": loadavg(), "nproc": out(["nproc"]), "cpu": cpu,
            "kernel": platform.release(), "free_h": out(["free", "-h"]),
            "uring": read_uring_knob() or "absent",
            "cpu_latency": cpu_latency_limit(),
            "fio": out(["fio", "--version"]),
            "qemu": out(["qemu-storage-daemon", "--version"]).split("\n")[0],
            "btrfs": out(["btrfs", "--version"])}


def expected_minutes(args, n_targets, jobs):
    """A rough estimate from runs on the 2-CPU development VM: ~200 MiB/s
    for sequential jobs; per job ~1 s to start fio and reset, plus the
    write-back of what it dirtied (~SIZE at ~400 MiB/s)."""
    seq = sum(1 for j in jobs if not j[1].startswith("rand"))
    per_job = (1 + args.size / (400 * MiB)
               + (seq * args.size / (200 * MiB) + (len(jobs) - seq) * args.runtime) / len(jobs))
    fio_s = args.rounds * n_targets * len(jobs) * per_job + n_targets * args.size / (200 * MiB)
    snap_s = 0
    if not args.no_snapshots:
        snap_s = 4 * sum(args.snap_sizes) / (250 * MiB) + 6 * 2 * args.snap_reps * 0.2 + 10
    return (fio_s + snap_s) / 60


def report(args, cmdline, results, fs_type, mach, jobs, targets, stack_targets, snap):
    L = ["## fio through the whole stack: thinfs vs its peers\n",
         f"```\n{cmdline}\n```\n",
         f"- date: {mach['date']}; kernel {mach['kernel']} (FUSE over io_uring knob "
         f"`enable_uring`: {mach['uring']}; CPU latency limit "
         f"{cpu_latency_label(mach['cpu_latency'], args.cpu_latency is not None)}); "
         f"{mach['nproc']} CPUs "
         f"({mach['cpu']}); {mach['fio']}; {mach['qemu']}; {mach['btrfs']}; files on "
         f"{fs_type} (`{args.dir}`).",
         f"- load average (1/5/15 min) at start {mach['loadavg_start']}, at end "
         f"{mach['loadavg']}: the machine is shared with other engineers' compiles, "
         "so every figure carries their noise (a FUSE request needs two extra "
         "wake-ups, which wait for a CPU when others keep both busy).",
         "- `free -h`:\n\n```\n" + mach["free_h"] + "\n```\n",
         f"- {args.rounds} round(s), targets interleaved job by job (listed order on even "
         "rounds, reversed on odd ones); size "
         f"{size_label(args.size)}; random jobs {args.runtime:g} s time-based; cache "
         f"{args.cache}; thinfs block size {args.block_size}, mount options "
         f"`{args.mount_options or '(defaults)'}`"
         + (f"; {ALT}: mount options `{args.alt_mount_options or '(defaults)'}`, binary "
            f"`{args.alt_thinfs or args.thinfs}`" if ALT in targets or ALT_SNAP in targets else "")
         + (f"; loop devices: `losetup {args.loop_options or '(buffered)'}`"
            if {"raw-loop-ext4", "thinfs-loop-ext4", PT_LOOP} & set(targets) else "")
         + (f"; -alt loop devices: `losetup {args.alt_loop_options or '(buffered)'}`"
            if {RAW_LOOP_ALT, THINFS_LOOP_ALT} & set(targets) else "")
         + (f"; {PT_ALT}: `{args.alt_passthrough}`" if PT_ALT in targets else "")
         + (f"; {PT_LOOP}: `{args.loop_passthrough}`" if PT_LOOP in targets else "")
         + f"; wall time of the fio part {mach['fio_minutes']:.1f} min. Cells: median "
         "(min–max) of the rounds; ratios: median (min–max) of the per-round ratios.",
         "- What the write jobs measure per target: "
         + "; ".join(f"{t}: {stack_targets[t].semantics}" for t in targets) + ".\n"]
    L += fio_report.results_table(results, jobs, targets)
    L.append("")
    if args.chart_png:
        L.append(f"![ratio to raw per job and target]({os.path.basename(args.chart_png)})\n")
    L.append("### Issue 5's targets 1–4 in this run (ratios of medians)\n")
    goal_lines, verdict = fio_report.goals_table(results, jobs)
    L += goal_lines
    L.append("")
    L.append("Per goal: " + ", ".join(f"{k}: {v}" for k, v in sorted(verdict.items()))
             + ".\n")
    ref = fio_report.reference_table(results, jobs)
    if ref:
        L.append("### Peers' ratio to raw: this run vs the issue's reference\n")
        L += ref
        L.append("")
    # dict.fromkeys: a --compare pair the report already makes is listed once.
    pairs = list(dict.fromkeys((x, y) for x, y in fio_report.PAIRS + args.compare
                               if x in targets and y in targets))
    if pairs:
        L.append("### Student's t at 95% confidence, as `ministat` computes it\n")
        L.append("x = first, y = second; difference of the means with the pooled "
                 "standard deviation.\n")
        L += fio_report.t_table(results, jobs, pairs)
        L.append("")
    if snap is not None:
        times, sizes, reps = snap
        L.append("### Snapshot creation time vs origin size\n")
        if snapshot_time.ALT in times:
            L.append(f"thinfs: `{args.thinfs}`; {snapshot_time.ALT}: `{args.alt_thinfs}` "
                     "(CLI and daemon).\n")
        snap_lines, snap_verdict = snapshot_time.report(times, sizes, reps)
        L += snap_lines
        verdict[5] = snap_verdict
    return "\n".join(L) + "\n", verdict


def prerequisites(args):
    missing = []
    if os.geteuid() != 0:
        missing.append("root (mount, losetup)")
    for dev in ("/dev/fuse", "/dev/loop-control"):
        if not os.path.exists(dev):
            missing.append(dev)
    tools = {"fio", "losetup", "fusermount3", "gnuplot"}
    for t in args.targets:
        tools.update(TOOLS.get(t, []))
    if not args.no_snapshots:
        tools.update(snapshot_time.tools_of(snapshot_time.methods_of(args)))
    missing += sorted(t for t in tools if shutil.which(t) is None)
    binaries = [args.thinfs]
    if args.alt_thinfs:
        binaries.append(args.alt_thinfs)
    if "fuse-passthrough" in args.targets:
        binaries.append(args.passthrough)
    if PT_ALT in args.targets:
        binaries.append(args.alt_passthrough)
    if PT_LOOP in args.targets:
        binaries.append(args.loop_passthrough)
    for b in binaries:
        if not (os.path.isfile(b) and os.access(b, os.X_OK)):
            missing.append(f"binary {b}")
    return missing


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    build = next((os.path.join(root, d) for d in ("build-rel", "build")
                  if os.path.exists(os.path.join(root, d, "thinfs"))),
                 os.path.join(root, "build"))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--thinfs", default=os.path.join(build, "thinfs"),
                   help="thinfs binary (Release build)")
    p.add_argument("--passthrough", default=os.path.join(build, "bench", "passthrough_ll"),
                   help="libfuse's passthrough_ll (built by bench/CMakeLists.txt)")
    p.add_argument("--alt-passthrough",
                   default=os.path.join(build, "bench", "passthrough_ll_splice"),
                   help=f"FUSE server of the opt-in {PT_ALT} target (default: passthrough_ll "
                        "with splice on, built by bench/CMakeLists.txt)")
    p.add_argument("--loop-passthrough",
                   default=os.path.join(build, "bench", "passthrough_ll_buffered"),
                   help=f"FUSE server of the opt-in {PT_LOOP} target (default: passthrough_ll "
                        "without O_DIRECT on the host file, built by bench/CMakeLists.txt)")
    p.add_argument("--dir", default="/var/tmp", help="where the temp directories go")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    p.add_argument("--size", default=None, help="file/volume size (default 1G; quick 32M)")
    p.add_argument("--runtime", type=float, default=None,
                   help="seconds per random job (default 6; quick 0.5)")
    p.add_argument("--cache", choices=["cold", "warm"], default="cold",
                   help="cold: fsync + drop every layer's cache between jobs, fio "
                        "invalidate=1; warm: fsync only, invalidate=0")
    p.add_argument("--targets", default=",".join(TARGETS),
                   help=f"comma-separated, of: {', '.join(TARGETS + OPT_IN)}")
    p.add_argument("--jobs", default=",".join(j[0] for j in JOBS),
                   help="comma-separated, of: " + ", ".join(j[0] for j in JOBS + OPT_IN_JOBS)
                   + " (default: all but " + ", ".join(j[0] for j in OPT_IN_JOBS) + ")")
    p.add_argument("--compare", action="append", default=[], metavar="A,B",
                   help="also print Student's t of B vs A (repeatable)")
    p.add_argument("--block-size", default="64K")
    p.add_argument("--mount-options", default="", help="thinfs mount -o OPTIONS")
    p.add_argument("--alt-mount-options", default="",
                   help=f"-o OPTIONS for the {ALT} and {ALT_SNAP} targets (add them to --targets)")
    p.add_argument("--alt-thinfs", default=None,
                   help=f"thinfs binary for the {ALT} target (default: --thinfs) and, when "
                        f"given, the {ALT} snapshot method")
    p.add_argument("--loop-options", default=LOOP_OPTIONS,
                   help="losetup options of raw-loop-ext4 and thinfs-loop-ext4 "
                        f"(default '{LOOP_OPTIONS}')")
    p.add_argument("--alt-loop-options", default="",
                   help="losetup options of the opt-in raw-loop-ext4-alt and "
                        "thinfs-loop-ext4-alt (the latter over a volume of the "
                        f"{ALT} pool; default '': buffered)")
    p.add_argument("--snap-sizes", default=None,
                   help="snapshot origins SMALL,LARGE (default 1G,4G; quick 32M,128M)")
    p.add_argument("--snap-reps", type=int, default=None,
                   help="snapshot repetitions (default 21; quick 3)")
    p.add_argument("--snap-methods", default=None,
                   help="comma-separated snapshot methods to time (default all: "
                        f"{', '.join(snapshot_time.METHODS)}; {snapshot_time.ALT} "
                        "with --alt-thinfs)")
    p.add_argument("--no-snapshots", action="store_true", help="skip the snapshot timing")
    p.add_argument("--no-fio", action="store_true", help="only the snapshot timing")
    p.add_argument("--markdown", help="write the Markdown report here (the chart goes "
                                      "next to it as NAME.png)")
    p.add_argument("--json", help="write every sample here")
    p.add_argument("--fuse-io-uring", choices=["keep", "on", "off"], default="keep",
                   help="set the kernel's FUSE-over-io_uring knob "
                        "(/sys/module/fuse/parameters/enable_uring) for the run and put it "
                        "back after; thinfs uses the rings when it is on (its mount option "
                        "io_uring=auto), libfuse 3.14's passthrough and qemu 7.2 never do "
                        "(default keep; the report records its value)")
    p.add_argument("--cpu-latency", type=int, default=None, metavar="USEC",
                   help="hold the machine's CPU wake-up latency limit at USEC µs "
                        f"({CPU_LATENCY}, PM QoS) for the whole run, every target alike; 0 "
                        "makes idle CPUs poll instead of halting. What thinfs's mount option "
                        "cpu_latency=USEC does for its own requests only (default: not held)")
    p.add_argument("--quick", action="store_true",
                   help="1 round, 32 MiB, 0.5 s jobs, 32/128 MiB snapshot origins, 3 "
                        "snapshot repetitions; check that every table is complete")
    args = p.parse_args()
    cmdline = shlex.join([os.path.relpath(sys.argv[0]) if not sys.argv[0].startswith("/")
                          else sys.argv[0]] + sys.argv[1:])
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.size = parse_size(args.size or ("32M" if args.quick else "1G"))
    args.runtime = args.runtime or (0.5 if args.quick else 6)
    args.snap_sizes = [parse_size(s) for s in
                       (args.snap_sizes or ("32M,128M" if args.quick else "1G,4G")).split(",")]
    args.snap_reps = args.snap_reps or (3 if args.quick else 21)
    args.targets = [t for t in args.targets.split(",") if t] if not args.no_fio else []
    bad = [t for t in args.targets if t not in TARGETS + OPT_IN]
    try:
        args.compare = [tuple(c.split(",")) for c in args.compare]
    except ValueError:
        p.error("--compare A,B")
    bad += [t for c in args.compare for t in c if len(c) != 2 or t not in TARGETS + OPT_IN]
    wanted = args.jobs.split(",")
    jobs = [j for j in JOBS + OPT_IN_JOBS if j[0] in wanted]
    bad += [j for j in wanted if j not in [k[0] for k in JOBS + OPT_IN_JOBS]]
    if (bad or not jobs or (not args.targets and not args.no_fio) or args.rounds < 1
            or len(args.snap_sizes) != 2 or args.snap_reps < 1
            or (args.no_fio and args.no_snapshots)):
        p.error(f"bad --targets/--compare/--jobs/--rounds/--snap-* {bad} "
                f"(targets: {', '.join(TARGETS + OPT_IN)})")
    if args.targets and "raw" not in args.targets:
        p.error("--targets must include raw (every ratio is to raw)")
    try:
        snapshot_time.methods_of(args)
    except ValueError as e:
        p.error(f"--snap-methods: {e}")
    args.thinfs = os.path.abspath(args.thinfs)
    if args.alt_thinfs:
        args.alt_thinfs = os.path.abspath(args.alt_thinfs)
    args.passthrough = os.path.abspath(args.passthrough)
    args.alt_passthrough = os.path.abspath(args.alt_passthrough)
    args.chart_png = (os.path.splitext(args.markdown)[0] + ".png"
                      if args.markdown and args.targets else None)

    missing = prerequisites(args)
    if missing:
        log("missing: " + ", ".join(missing) + " (Debian packages: scripts/deps.sh)")
        return 1 if os.environ.get("CI") else 77

    # Any way out (exception, SIGTERM, SIGINT, SIGHUP) goes through teardown.
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    log(f"expected duration: about {expected_minutes(args, len(args.targets), jobs):.0f} min "
        f"({len(args.targets)} targets x {len(jobs)} jobs x {args.rounds} round(s), "
        f"{args.runtime:g} s random jobs, {size_label(args.size)} files"
        + ("" if args.no_snapshots else
           f"; snapshot timing on {size_label(args.snap_sizes[0])}/"
           f"{size_label(args.snap_sizes[1])} origins") + ")")
    latency_fd = None
    if args.cpu_latency is not None:
        # Held until this process exits: closing the file drops the limit.
        latency_fd = os.open(CPU_LATENCY, os.O_WRONLY | os.O_CLOEXEC)
        os.write(latency_fd, struct.pack("i", args.cpu_latency))
        log(f"holding the CPU latency limit at {args.cpu_latency} µs for the run")
    knob_before = read_uring_knob()
    if args.fuse_io_uring != "keep":
        if knob_before is None:
            sys.exit("fio_compare: --fuse-io-uring: this kernel has no " + URING_KNOB)
        set_uring_knob("Y" if args.fuse_io_uring == "on" else "N")
    try:
        return main_with_knob(args, cmdline, jobs)
    finally:
        if args.fuse_io_uring != "keep":
            set_uring_knob(knob_before)
        if latency_fd is not None:
            os.close(latency_fd)


URING_KNOB = "/sys/module/fuse/parameters/enable_uring"


def read_uring_knob():
    try:
        with open(URING_KNOB) as fh:
            return fh.read().strip()
    except OSError:
        return None


def set_uring_knob(value):
    with open(URING_KNOB, "w") as fh:
        fh.write(value + "\n")


def main_with_knob(args, cmdline, jobs):
    mach_start = machine()
    fs_type = run(["stat", "-f", "-c", "%T", args.dir], check=False).stdout.strip()
    targets, results, stack_targets = [], {}, {}
    t0 = time.monotonic()
    if args.targets:
        stack = Stack(args)
        try:
            log(f"setting up in {stack.work}")
            stack.setup()
            targets = [t for t in TARGETS + OPT_IN if t in stack.targets]
            stack_targets = stack.targets
            for t in targets:
                if stack.targets[t].prewrite:
                    prewrite(stack.targets[t], args.size)
                settle(stack.targets[t], args.cache == "cold")
            results = {t: {j[0]: [] for j in jobs} for t in targets}
            out_json = os.path.join(stack.work, "fio.json")
            for r in range(args.rounds):
                # The listed order on even rounds, reversed on odd ones,
                # so that no target always runs right after another
                # (docs/benchmarks.md, "Order of targets": in a fixed
                # order the second of two like targets read slower).
                order = targets if r % 2 == 0 else targets[::-1]
                for job in jobs:
                    for t in order:
                        target = stack.targets[t]
                        writes = job[1] not in ("read", "randread")
                        if "--direct=1" in job[4] and not (
                                target.direct_write_ok if writes else target.direct_ok):
                            results[t][job[0]] = None
                            continue
                        if target.reset:
                            target.reset()
                        settle(target, args.cache == "cold")
                        limit = wait_cpu_latency(mach_start["cpu_latency"])
                        if limit != mach_start["cpu_latency"]:
                            log(f"warning: {t} {job[0]} starts with the CPU latency limit "
                                f"at {limit} µs, {mach_start['cpu_latency']} at the start")
                        v = fio(args, target, job, args.size, args.runtime, out_json)
                        results[t][job[0]].append(v[job[5]])
                        log(f"round {r + 1}/{args.rounds} {job[0]:<15} {t:<17} "
                            f"{v[job[5]]:10.1f} {job[5]}")
                        settle(target, args.cache == "cold")
        finally:
            stack.teardown()
    fio_minutes = (time.monotonic() - t0) / 60
    snap = None
    if not args.no_snapshots:
        snap_stack = Stack(args)
        try:
            log(f"snapshot timing in {snap_stack.work}")
            times = snapshot_time.measure(snap_stack, args.snap_sizes, args.snap_reps)
            snap = (times, args.snap_sizes, args.snap_reps)
        finally:
            snap_stack.teardown()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)

    mach = machine()
    mach["loadavg_start"] = mach_start["loadavg"]
    mach["fio_minutes"] = fio_minutes
    if args.chart_png:
        fio_report.chart(results, jobs, targets, args.chart_png)
    md, verdict = report(args, cmdline, results, fs_type, mach, jobs, targets,
                         stack_targets, snap)
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(md)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": cmdline, "machine": mach, "rounds": args.rounds,
                       "size": args.size, "runtime": args.runtime, "cache": args.cache,
                       "mount_options": args.mount_options,
                       "units": {j[0]: j[5] for j in jobs}, "results": results,
                       "goals": verdict,
                       "snapshots": None if snap is None else
                       {m: {str(z): v for z, v in d.items()} for m, d in snap[0].items()}},
                      fh, indent=1)
    incomplete = [f"{t}/{j[0]}" for t in targets for j in jobs
                  if results[t][j[0]] is not None and len(results[t][j[0]]) != args.rounds]
    incomplete += [t for t in args.targets if t not in targets]
    if snap is not None:
        incomplete += snapshot_time.complete(*snap)
    if args.chart_png and not (os.path.isfile(args.chart_png)
                               and os.path.getsize(args.chart_png) > 0):
        incomplete.append(f"chart {args.chart_png}")
    if incomplete:
        log("incomplete: " + ", ".join(incomplete))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
