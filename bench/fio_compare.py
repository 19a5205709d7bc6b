#!/usr/bin/env python3
"""fio through the whole stack: thinfs vs the same file without FUSE.

Sets up, in a fresh temp directory under --dir (one file system for all):
  raw               a SIZE file on the host file system;
  thinfs            a SIZE volume in a freshly formatted and mounted pool
                    (the Release build's `thinfs format` + `thinfs mount`);
  raw-loop-ext4     ext4 on a loop device over a plain file, fio on a file
                    inside;
  thinfs-loop-ext4  ext4 on a loop device over a thinfs volume, fio on a
                    file inside.
Every fio file is written once before round 1 (untimed), so every round does
the same work. Jobs (fio, JSON output):
  seqwrite   1 MiB sequential write of SIZE, end_fsync=1
  seqread    1 MiB sequential read of SIZE
  randread   4 KiB random read, 1 job, psync
  randwrite  4 KiB random write, 1 job, psync
  randread4j / randwrite4j  the same with 4 jobs
  randread-qd32  4 KiB random read, libaio, iodepth 32, direct=1 (n/a where
             O_DIRECT is refused)
Rounds interleave the targets job by job (A B C D A B C D ...). Between jobs
(untimed) every file of the target's stack is fsynced and, with --cache cold
(the default), dropped from the page cache (fio file, loop backing file,
pool/data), so a job never pays for another's write-back nor reads another's
cache. Reports medians with min-max, ratios to raw (and thinfs-loop-ext4 to
raw-loop-ext4), and a Student's t comparison at 95% in the manner of
ministat. --quick: 1 round, small files, 1 s jobs; exits non-zero unless the
table is complete (it never judges a timing).

Needs root (mount, losetup), /dev/fuse, fio, losetup, mkfs.ext4. Exits 77
(skip) when they are missing, unless CI is set in the environment (then 1).
Cleans up mounts, loop devices and the daemon on any exit.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20

JOBS = [
    # name, rw, bs, numjobs, extra fio args, metric
    ("seqwrite", "write", "1M", 1, ["--end_fsync=1"], "MiB/s"),
    ("seqread", "read", "1M", 1, [], "MiB/s"),
    ("randread", "randread", "4k", 1, [], "IOPS"),
    ("randwrite", "randwrite", "4k", 1, [], "IOPS"),
    ("randread4j", "randread", "4k", 4, [], "IOPS"),
    ("randwrite4j", "randwrite", "4k", 4, [], "IOPS"),
    ("randread-qd32", "randread", "4k", 1,
     ["--ioengine=libaio", "--iodepth=32", "--direct=1"], "IOPS"),
]
TARGETS = ["raw", "thinfs", "raw-loop-ext4", "thinfs-loop-ext4"]
# Opt-in A/B target (not in the default --targets): a second pool mounted with
# --alt-mount-options and/or the --alt-thinfs binary, interleaved with the
# others, so that a lever is measured against `thinfs` in the same run.
ALT = "thinfs-alt"
# Two-sided 95% Student's t critical values for 1..30 degrees of freedom.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
       2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def log(msg):
    print(f"fio_compare: {msg}", file=sys.stderr, flush=True)


def run(cmd, check=True, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({r.returncode}): "
                           f"{r.stderr.strip() or r.stdout.strip()}")
    return r


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("ib")
    if s and s[-1] in units:
        return int(s[:-1]) * units[s[-1]]
    return int(s)


class Target:
    def __init__(self, name, fio_file, flush_files):
        self.name = name
        self.fio_file = fio_file
        # Files whose dirty pages and cache are flushed/dropped between jobs,
        # top of the stack first.
        self.flush_files = flush_files
        self.direct_ok = None


class Stack:
    """Everything set up, torn down in reverse order on any exit."""

    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(prefix="thinfs_fio_", dir=args.dir)
        self.undo = []  # (description, callable), run last-first
        self.targets = {}
        self.daemon_pid = None

    def teardown(self):
        while self.undo:
            what, fn = self.undo.pop()
            try:
                fn()
            except Exception as e:  # keep tearing down the rest
                log(f"cleanup: {what}: {e}")
        shutil.rmtree(self.work, ignore_errors=True)

    def _mount_ext4_on_loop(self, backing, mnt):
        dev = run(["losetup", "--find", "--show", backing]).stdout.strip()
        self.undo.append((f"losetup -d {dev}", lambda: run(["losetup", "-d", dev])))
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
             dev])
        os.makedirs(mnt)
        run(["mount", "-t", "ext4", dev, mnt])
        self.undo.append((f"umount {mnt}", lambda: umount(mnt)))
        return dev

    def setup(self):
        a = self.args
        size, loop_size = a.size, a.size + 256 * MiB
        w = self.work
        want = set(a.targets)
        if "raw" in want:
            f = os.path.join(w, "raw.img")
            with open(f, "wb") as fh:
                fh.truncate(size)
            self.targets["raw"] = Target("raw", f, [f])
        if want & {"thinfs", "thinfs-loop-ext4"}:
            pool, mnt = os.path.join(w, "pool"), os.path.join(w, "mnt")
            pool_size = size + loop_size + 512 * MiB
            run([a.thinfs, "format", pool, "--size", str(pool_size),
                 "--block-size", a.block_size])
            os.makedirs(mnt)
            cmd = [a.thinfs, "mount", pool, mnt]
            if a.mount_options:
                cmd += ["-o", a.mount_options]
            run(cmd)
            # Default arguments bind this pool: `pool`/`mnt` are reused below.
            self.undo.append(("thinfs umount",
                              lambda pool=pool, mnt=mnt: self._stop_thinfs(pool, mnt)))
            with open(os.path.join(pool, "lock")) as fh:
                self.daemon_pid = int(fh.read().strip() or 0) or None
            data = os.path.join(pool, "data")
            if "thinfs" in want:
                f = os.path.join(mnt, "vol")
                with open(f, "wb") as fh:
                    fh.truncate(size)
                self.targets["thinfs"] = Target("thinfs", f, [f, data])
            if "thinfs-loop-ext4" in want:
                backing = os.path.join(mnt, "loopvol")
                with open(backing, "wb") as fh:
                    fh.truncate(loop_size)
                m = os.path.join(w, "thinfs-loop-mnt")
                self._mount_ext4_on_loop(backing, m)
                f = os.path.join(m, "fio.dat")
                with open(f, "wb") as fh:
                    fh.truncate(size)
                self.targets["thinfs-loop-ext4"] = Target(
                    "thinfs-loop-ext4", f, [f, backing, data])
        if ALT in want:
            pool, mnt = os.path.join(w, "pool-alt"), os.path.join(w, "mnt-alt")
            binary = a.alt_thinfs or a.thinfs
            run([binary, "format", pool, "--size", str(size + 512 * MiB),
                 "--block-size", a.block_size])
            os.makedirs(mnt)
            cmd = [binary, "mount", pool, mnt]
            if a.alt_mount_options:
                cmd += ["-o", a.alt_mount_options]
            run(cmd)
            with open(os.path.join(pool, "lock")) as fh:
                alt_pid = int(fh.read().strip() or 0) or None
            self.undo.append(("thinfs-alt umount",
                              lambda pool=pool, mnt=mnt, binary=binary, alt_pid=alt_pid:
                              self._stop_thinfs(pool, mnt, binary, alt_pid)))
            f = os.path.join(mnt, "vol")
            with open(f, "wb") as fh:
                fh.truncate(size)
            self.targets[ALT] = Target(ALT, f, [f, os.path.join(pool, "data")])
        if "raw-loop-ext4" in want:
            backing = os.path.join(w, "raw-loop.img")
            with open(backing, "wb") as fh:
                fh.truncate(loop_size)
            m = os.path.join(w, "raw-loop-mnt")
            self._mount_ext4_on_loop(backing, m)
            f = os.path.join(m, "fio.dat")
            with open(f, "wb") as fh:
                fh.truncate(size)
            self.targets["raw-loop-ext4"] = Target("raw-loop-ext4", f, [f, backing])
        for t in self.targets.values():
            t.direct_ok = supports_direct(t.fio_file)

    def _stop_thinfs(self, pool, mnt, binary=None, pid=None):
        r = run([binary or self.args.thinfs, "umount", mnt], check=False)
        if r.returncode != 0:
            run(["umount", "-l", mnt], check=False)
        pid = pid or self.daemon_pid
        if pid:
            for _ in range(300):  # the final commit may take a moment
                if not os.path.exists(f"/proc/{pid}"):
                    return
                time.sleep(0.1)
            log(f"daemon {pid} still running after unmount: SIGTERM")
            os.kill(pid, signal.SIGTERM)


def umount(mnt):
    if run(["umount", mnt], check=False).returncode != 0:
        time.sleep(0.5)
        run(["umount", "-l", mnt])


def supports_direct(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        import mmap
        buf = mmap.mmap(-1, 4096)
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


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
        cmd += [f"--runtime={runtime}", "--time_based"]
    cmd += extra
    run(cmd)
    with open(out_json) as fh:
        text = fh.read()
    # fio may print notes before the JSON object.
    data = json.loads(text[text.index("{"):])
    j = data["jobs"][0]
    side = j["write"] if "write" in rw else j["read"]
    return {"MiB/s": side["bw_bytes"] / MiB, "IOPS": side["iops"]}


def prewrite(target, size):
    cmd = ["fio", "--name=prewrite", f"--filename={target.fio_file}", "--rw=write",
           "--bs=1M", f"--size={size}", "--end_fsync=1", "--output-format=json",
           "--output=/dev/null"]
    run(cmd)


# ---- statistics --------------------------------------------------------------

def med_cell(v, prec=0):
    if not v:
        return "n/a"
    return f"{statistics.median(v):.{prec}f} ({min(v):.{prec}f}–{max(v):.{prec}f})"


def ratio_cell(a, b):
    """Median (min-max) of per-round ratios a[i]/b[i]."""
    r = [x / y for x, y in zip(a, b) if y]
    if not r:
        return "n/a"
    return f"{statistics.median(r):.2f} ({min(r):.2f}–{max(r):.2f})"


def ministat(x, y):
    """y vs x as ministat prints it: difference of means at 95% with the
    pooled standard deviation, or no difference proven."""
    nx, ny = len(x), len(y)
    if nx < 2 or ny < 2:
        return None
    mx, my = statistics.mean(x), statistics.mean(y)
    vx, vy = statistics.variance(x), statistics.variance(y)
    df = nx + ny - 2
    t = T95[df - 1] if df <= len(T95) else 1.960
    s = math.sqrt(((nx - 1) * vx + (ny - 1) * vy) / df)
    e = t * s * math.sqrt(1 / nx + 1 / ny)
    d = my - mx
    return {"mean_x": mx, "sd_x": math.sqrt(vx), "mean_y": my, "sd_y": math.sqrt(vy),
            "diff": d, "ci": e, "pct": 100 * d / mx if mx else float("nan"),
            "pct_ci": 100 * e / mx if mx else float("nan"), "pooled_s": s,
            "proven": abs(d) > e}


# ---- report --------------------------------------------------------------------

def machine():
    def out(cmd):
        try:
            return run(cmd, check=False).stdout.strip()
        except OSError:
            return "n/a"
    cpu = "n/a"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        with open("/proc/loadavg") as fh:
            load = " ".join(fh.read().split()[:3])
    except OSError:
        load = "n/a"
    return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "loadavg": load,
            "nproc": out(["nproc"]), "cpu": cpu, "kernel": platform.release(),
            "free_h": out(["free", "-h"]), "fio": out(["fio", "--version"])}


def report(args, cmdline, results, fs_type, mach, jobs, targets):
    L = []
    L.append("## fio through the whole stack\n")
    L.append(f"```\n{cmdline}\n```\n")
    L.append(f"- date: {mach['date']}; kernel {mach['kernel']}; {mach['nproc']} CPUs "
             f"({mach['cpu']}); {mach['fio']}; files on {fs_type} "
             f"(`{args.dir}`); load average at start {mach['loadavg_start']}, at end "
             f"{mach['loadavg']} (the machine is shared: a FUSE request needs two extra "
             "wake-ups, which wait for a CPU when others keep both busy).")
    L.append("- `free -h`:\n\n```\n" + mach["free_h"] + "\n```\n")
    L.append(f"- {args.rounds} round(s), targets interleaved job by job; size "
             f"{args.size // MiB} MiB; random jobs {args.runtime} s time-based; "
             f"cache {args.cache}; thinfs block size {args.block_size}, mount options "
             f"`{args.mount_options or '(defaults)'}`"
             + (f"; {ALT}: mount options `{args.alt_mount_options or '(defaults)'}`, binary "
                f"`{args.alt_thinfs or args.thinfs}`" if ALT in targets else "")
             + ". Cells: median (min–max) of the "
             "rounds; ratios: median (min–max) of the per-round ratios.\n")
    hdr = "| job | unit | " + " | ".join(targets)
    ratio_cols = [t for t in targets if t != "raw" and "raw" in targets]
    hdr += "".join(f" | {t}/raw" for t in ratio_cols)
    loop_pair = "raw-loop-ext4" in targets and "thinfs-loop-ext4" in targets
    if loop_pair:
        hdr += " | thinfs-loop/raw-loop"
    alt_pair = "thinfs" in targets and ALT in targets
    if alt_pair:
        hdr += " | thinfs-alt/thinfs"
    hdr += " |"
    L.append(hdr)
    L.append("|" + "---|" * (hdr.count("|") - 1))
    for job in jobs:
        name, unit = job[0], job[5]
        row = f"| {name} | {unit} | "
        cells = []
        for t in targets:
            v = results[t][name]
            if v is None:
                cells.append("n/a (no O_DIRECT)")
            else:
                cells.append(med_cell(v, 0 if unit == "IOPS" else 1))
        row += " | ".join(cells)
        for t in ratio_cols:
            a, b = results[t][name], results["raw"][name]
            row += " | " + (ratio_cell(a, b) if a and b else "n/a")
        if loop_pair:
            a, b = results["thinfs-loop-ext4"][name], results["raw-loop-ext4"][name]
            row += " | " + (ratio_cell(a, b) if a and b else "n/a")
        if alt_pair:
            a, b = results[ALT][name], results["thinfs"][name]
            row += " | " + (ratio_cell(a, b) if a and b else "n/a")
        L.append(row + " |")
    L.append("")
    pairs = [(x, y) for x, y in (("raw", "thinfs"), ("raw-loop-ext4", "thinfs-loop-ext4"),
                                 ("thinfs", ALT))
             if x in targets and y in targets]
    if pairs:
        L.append("Student's t at 95% confidence, as `ministat` computes it (x = first, "
                 "y = second; difference of the means with the pooled standard deviation):\n")
        L.append("| job | x | y | mean x ± sd | mean y ± sd | difference (y − x) | "
                 "relative | verdict |")
        L.append("|---|---|---|---:|---:|---:|---:|---|")
        for job in jobs:
            for x, y in pairs:
                a, b = results[x][job[0]], results[y][job[0]]
                m = ministat(a, b) if a and b else None
                if m is None:
                    L.append(f"| {job[0]} | {x} | {y} | | | | | n/a (needs ≥ 2 rounds "
                             "on both sides) |")
                    continue
                L.append(f"| {job[0]} | {x} | {y} | {m['mean_x']:.1f} ± {m['sd_x']:.1f} | "
                         f"{m['mean_y']:.1f} ± {m['sd_y']:.1f} | {m['diff']:+.1f} ± "
                         f"{m['ci']:.1f} | {m['pct']:+.1f}% ± {m['pct_ci']:.1f}% | "
                         + ("difference at 95%" if m["proven"]
                            else "no difference proven at 95%") + " |")
        L.append("")
    return "\n".join(L) + "\n"


def prerequisites(args):
    missing = []
    if os.geteuid() != 0:
        missing.append("root (mount, losetup)")
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    for tool in ("fio", "losetup", "mkfs.ext4", "fusermount3"):
        if shutil.which(tool) is None:
            missing.append(tool)
    if not os.path.exists("/dev/loop-control"):
        missing.append("/dev/loop-control")
    if not (os.path.isfile(args.thinfs) and os.access(args.thinfs, os.X_OK)):
        missing.append(f"thinfs binary {args.thinfs}")
    return missing


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    default_bin = next((p for p in (os.path.join(root, "build-rel", "thinfs"),
                                    os.path.join(root, "build", "thinfs"))
                        if os.path.exists(p)), os.path.join(root, "build", "thinfs"))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--thinfs", default=default_bin, help="thinfs binary (Release build)")
    p.add_argument("--dir", default="/var/tmp", help="where the temp directory goes")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 1)")
    p.add_argument("--size", default=None, help="file/volume size (default 1G; quick 64M)")
    p.add_argument("--runtime", type=int, default=None,
                   help="seconds per random job (default 10; quick 1)")
    p.add_argument("--cache", choices=["cold", "warm"], default="cold",
                   help="cold: fsync + drop every layer's cache between jobs, fio "
                        "invalidate=1; warm: fsync only, invalidate=0")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--jobs", default=",".join(j[0] for j in JOBS))
    p.add_argument("--block-size", default="64K")
    p.add_argument("--mount-options", default="", help="thinfs mount -o OPTIONS")
    p.add_argument("--alt-mount-options", default="",
                   help=f"-o OPTIONS for the {ALT} target (add it to --targets)")
    p.add_argument("--alt-thinfs", default=None,
                   help=f"thinfs binary for the {ALT} target (default: --thinfs)")
    p.add_argument("--markdown", help="write the Markdown report here")
    p.add_argument("--json", help="write every sample here")
    p.add_argument("--quick", action="store_true",
                   help="1 round, 64 MiB, 1 s jobs; check the table is complete")
    args = p.parse_args()
    cmdline = shlex.join([os.path.relpath(sys.argv[0]) if not sys.argv[0].startswith("/")
                          else sys.argv[0]] + sys.argv[1:])
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.size = parse_size(args.size or ("64M" if args.quick else "1G"))
    args.runtime = args.runtime or (1 if args.quick else 10)
    args.targets = [t for t in args.targets.split(",") if t]
    bad = [t for t in args.targets if t not in TARGETS + [ALT]]
    jobs = [j for j in JOBS if j[0] in args.jobs.split(",")]
    if bad or not jobs or not args.targets or args.rounds < 1:
        p.error(f"bad --targets/--jobs/--rounds (targets: {', '.join(TARGETS + [ALT])})")
    args.thinfs = os.path.abspath(args.thinfs)

    missing = prerequisites(args)
    if missing:
        log("missing: " + ", ".join(missing))
        return 1 if os.environ.get("CI") else 77

    # Any way out (exception, SIGTERM, SIGINT, SIGHUP) goes through teardown.
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    load_start = machine()["loadavg"]
    stack = Stack(args)
    try:
        log(f"setting up in {stack.work}")
        stack.setup()
        fs_type = run(["stat", "-f", "-c", "%T", args.dir], check=False).stdout.strip()
        targets = [t for t in TARGETS + [ALT] if t in stack.targets]
        for t in targets:
            prewrite(stack.targets[t], args.size)
            settle(stack.targets[t], args.cache == "cold")
        results = {t: {j[0]: [] for j in jobs} for t in targets}
        out_json = os.path.join(stack.work, "fio.json")
        for r in range(args.rounds):
            for job in jobs:
                for t in targets:
                    target = stack.targets[t]
                    if "--direct=1" in job[4] and not target.direct_ok:
                        results[t][job[0]] = None
                        continue
                    settle(target, args.cache == "cold")
                    v = fio(args, target, job, args.size, args.runtime, out_json)
                    results[t][job[0]].append(v[job[5]])
                    log(f"round {r + 1}/{args.rounds} {job[0]:<14} {t:<17} "
                        f"{v[job[5]]:10.1f} {job[5]}")
                    settle(target, args.cache == "cold")
        mach = machine()
        mach["loadavg_start"] = load_start
        md = report(args, cmdline, results, fs_type, mach, jobs, targets)
        print(md)
        if args.markdown:
            with open(args.markdown, "w") as fh:
                fh.write(md)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"command": cmdline, "machine": mach, "rounds": args.rounds,
                           "size": args.size, "runtime": args.runtime, "cache": args.cache,
                           "mount_options": args.mount_options,
                           "units": {j[0]: j[5] for j in jobs}, "results": results},
                          fh, indent=1)
        incomplete = [f"{t}/{j[0]}" for t in targets for j in jobs
                      if results[t][j[0]] is not None
                      and len(results[t][j[0]]) != args.rounds]
        incomplete += [t for t in TARGETS + [ALT] if t in args.targets and t not in targets]
        if incomplete:
            log("incomplete table: " + ", ".join(incomplete))
            return 3
        return 0
    finally:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        stack.teardown()


if __name__ == "__main__":
    sys.exit(main())
