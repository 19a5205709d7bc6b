"""The targets of fio_compare.py: each set up in one temp directory and torn
down (last-first) on any exit. See docs/benchmarks.md for what each one
measures."""

import os
import shutil
import signal
import tempfile
import time

from benchlib import MiB, Daemon, fill, log, make_file, run, supports_direct, umount

# Display order. Every name here can be passed to --targets.
TARGETS = ["raw", "fuse-passthrough", "qcow2-qsd", "qcow2-qsd-snap", "btrfs-reflink",
           "thinfs", "thinfs-snap", "raw-loop-ext4", "thinfs-loop-ext4"]
# Opt-in A/B target (not in the default --targets): a second pool mounted with
# --alt-mount-options and/or the --alt-thinfs binary, interleaved with the
# others, so that a lever is measured against `thinfs` in the same run.
ALT = "thinfs-alt"
# The same as thinfs-snap on that second pool (a COW lever's A/B target).
ALT_SNAP = "thinfs-alt-snap"
# Opt-in A/B of the loop attachment: ext4 on loop devices attached with
# --alt-loop-options, over a plain file and over a volume of the thinfs-alt
# pool (so --alt-thinfs/--alt-mount-options apply to it too).
RAW_LOOP_ALT, THINFS_LOOP_ALT = "raw-loop-ext4-alt", "thinfs-loop-ext4-alt"
# Opt-in A/B of a FUSE server: passthrough_ll again, from the --alt-passthrough
# binary (bench/passthrough_ll_splice.c: splice on), in its own directory.
PT_ALT = "fuse-passthrough-alt"
# Opt-in ceiling of target 4: ext4 on a loop device over a file in a FUSE
# passthrough (the --loop-passthrough binary, bench/passthrough_ll_buffered.c:
# passthrough_ll serving from the host's page cache, as thinfs serves its
# data file), so that thinfs-loop-ext4 is read against what FUSE alone costs
# a loop device.
PT_LOOP = "passthrough-loop-ext4"
OPT_IN = [ALT, ALT_SNAP, RAW_LOOP_ALT, THINFS_LOOP_ALT, PT_ALT, PT_LOOP]
# How raw-loop-ext4 and thinfs-loop-ext4 attach their loop devices
# (--loop-options): with direct I/O, as README recommends over a volume
# (docs/benchmarks.md, "Levers tried" 8). --alt-loop-options '' gives the
# buffered attachment the suite used before, for the -alt targets.
LOOP_OPTIONS = "--direct-io=on"

# Which outside tools each target needs (checked before anything is set up).
TOOLS = {
    "qcow2-qsd": ["qemu-img", "qemu-storage-daemon"],
    "qcow2-qsd-snap": ["qemu-img", "qemu-io", "qemu-storage-daemon"],
    "btrfs-reflink": ["mkfs.btrfs", "cp"],
    "raw-loop-ext4": ["mkfs.ext4"],
    "thinfs-loop-ext4": ["mkfs.ext4"],
    RAW_LOOP_ALT: ["mkfs.ext4"],
    THINFS_LOOP_ALT: ["mkfs.ext4"],
    PT_LOOP: ["mkfs.ext4"],
}


class Target:
    def __init__(self, name, fio_file, flush_files, prewrite=True, reset=None,
                 semantics=""):
        self.name = name
        self.fio_file = fio_file
        # Files whose dirty pages and cache are flushed/dropped between jobs,
        # top of the stack first.
        self.flush_files = flush_files
        # Copy-on-write targets are not pre-written (that would unshare every
        # block): `reset` re-creates their snapshot/copy before every job.
        self.prewrite = prewrite
        self.reset = reset
        self.semantics = semantics
        self.direct_ok = None  # O_DIRECT reads work
        self.direct_write_ok = None  # and writes


def qcow2_fill(image, size):
    """Writes every cluster of a qcow2 image with a non-zero pattern."""
    chunk = 256 * MiB
    cmds = []
    for off in range(0, size, chunk):
        cmds += ["-c", f"write -P 0x5a {off} {min(chunk, size - off)}"]
    run(["qemu-io", "-f", "qcow2"] + cmds + [image])


class Stack:
    """Everything set up, torn down in reverse order on any exit."""

    def __init__(self, args):
        self.args = args
        self.work = tempfile.mkdtemp(prefix="thinfs_fio_", dir=args.dir)
        self.undo = []  # (description, callable), run last-first
        self.targets = {}
        self.daemon_pid = None

    def teardown(self):
        # A second Ctrl-C must not interrupt the cleanup.
        sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        saved = [signal.signal(s, signal.SIG_IGN) for s in sigs]
        try:
            while self.undo:
                what, fn = self.undo.pop()
                try:
                    fn()
                except Exception as e:  # keep tearing down the rest
                    log(f"cleanup: {what}: {e}")
            shutil.rmtree(self.work, ignore_errors=True)
        finally:
            for s, h in zip(sigs, saved):
                signal.signal(s, h)

    def path(self, *parts):
        return os.path.join(self.work, *parts)

    def loop(self, backing, options=""):
        dev = run(["losetup", "--find", "--show"] + options.split() + [backing]).stdout.strip()
        self.undo.append((f"losetup -d {dev}", lambda: run(["losetup", "-d", dev])))
        return dev

    def mount(self, dev, mnt, fstype):
        os.makedirs(mnt)
        run(["mount", "-t", fstype, dev, mnt])
        self.undo.append((f"umount {mnt}", lambda: umount(mnt)))

    def _mount_ext4_on_loop(self, backing, mnt, options):
        dev = self.loop(backing, options)
        run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
             dev])
        self.mount(dev, mnt, "ext4")
        return dev

    def daemon(self, name, cmd, mountpoint):
        d = Daemon(name, cmd, mountpoint, self.path(f"{name}.log"))
        self.undo.append((f"stop {name}", d.stop))
        return d

    def setup(self):
        a = self.args
        size, loop_size = a.size, a.size + 256 * MiB
        want = set(a.targets)
        if "raw" in want:
            f = self.path("raw.img")
            make_file(f, size)
            self.targets["raw"] = Target("raw", f, [f], semantics="overwrites")
        if "fuse-passthrough" in want:
            self._setup_passthrough("fuse-passthrough", a.passthrough, "pt", size)
        if PT_ALT in want:
            self._setup_passthrough(PT_ALT, a.alt_passthrough, "pt-alt", size)
        if PT_LOOP in want:
            self._setup_passthrough_loop(a.loop_passthrough, loop_size)
        if "qcow2-qsd" in want:
            self._setup_qsd(size)
        if "qcow2-qsd-snap" in want:
            self._setup_qsd_snap(size)
        if "btrfs-reflink" in want:
            self._setup_btrfs(size)
        if want & {"thinfs", "thinfs-snap", "thinfs-loop-ext4"}:
            self._setup_thinfs(size, loop_size, want)
        if want & {ALT, ALT_SNAP, THINFS_LOOP_ALT}:
            self._setup_alt(size, loop_size, want)
        for name, options in (("raw-loop-ext4", a.loop_options),
                              (RAW_LOOP_ALT, a.alt_loop_options)):
            if name in want:
                backing = self.path(f"{name}.img")
                make_file(backing, loop_size)
                self._ext4_on_loop_target(name, backing, [backing], options)
        for t in self.targets.values():
            if t.reset:
                t.reset()
            t.direct_ok = supports_direct(t.fio_file)
            t.direct_write_ok = supports_direct(t.fio_file, write=True)

    def _setup_passthrough(self, name, binary, stem, size):
        src, mnt = self.path(f"{stem}-src"), self.path(f"{stem}-mnt")
        os.makedirs(src)
        os.makedirs(mnt)
        make_file(os.path.join(src, "fio.dat"), size)
        # libfuse's defaults: multithreaded, cache=auto (timeout 1 s, page
        # cache on, no keep_cache), no writeback cache, no clone_fd.
        self.daemon(name, [binary, "-f", "-o", f"source={src}", mnt], mnt)
        f = os.path.join(mnt, "fio.dat")
        self.targets[name] = Target(name, f, [f, os.path.join(src, "fio.dat")],
                                    semantics="overwrites")

    def _setup_passthrough_loop(self, binary, loop_size):
        src, mnt = self.path("pt-loop-src"), self.path("pt-loop-mnt")
        os.makedirs(src)
        os.makedirs(mnt)
        make_file(os.path.join(src, "loopvol"), loop_size)
        self.daemon(PT_LOOP, [binary, "-f", "-o", f"source={src}", mnt], mnt)
        backing = os.path.join(mnt, "loopvol")
        self._ext4_on_loop_target(PT_LOOP, backing, [backing, os.path.join(src, "loopvol")],
                                  self.args.loop_options)

    def _qsd(self, name, image, export):
        make_file(export, 0)
        return self.daemon(name, [
            "qemu-storage-daemon",
            "--blockdev", f"driver=file,node-name=file0,filename={image}",
            "--blockdev", "driver=qcow2,node-name=disk0,file=file0",
            "--export", f"type=fuse,id=exp0,node-name=disk0,mountpoint={export},"
                        "writable=on"], export)

    def _setup_qsd(self, size):
        image, export = self.path("qsd.qcow2"), self.path("qsd-export")
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=64k", image,
             str(size)])
        self._qsd("qemu-qsd", image, export)
        self.targets["qcow2-qsd"] = Target("qcow2-qsd", export, [export, image],
                                           semantics="fresh image, pre-written: overwrites "
                                                     "of allocated clusters")

    def _setup_qsd_snap(self, size):
        base, overlay = self.path("qsd-base.qcow2"), self.path("qsd-overlay.qcow2")
        export = self.path("qsd-snap-export")
        run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=64k", base,
             str(size)])
        qcow2_fill(base, size)
        state = {"daemon": None}

        def reset():
            if state["daemon"]:
                state["daemon"].stop()
                self.undo.remove(state["undo"])
            if os.path.exists(overlay):
                os.unlink(overlay)
            run(["qemu-img", "create", "-q", "-f", "qcow2", "-o", "cluster_size=64k",
                 "-b", base, "-F", "qcow2", overlay, str(size)])
            state["daemon"] = self._qsd("qemu-qsd-snap", overlay, export)
            state["undo"] = self.undo[-1]

        self.targets["qcow2-qsd-snap"] = Target(
            "qcow2-qsd-snap", export, [export, overlay, base], prewrite=False, reset=reset,
            semantics="new overlay over a fully written base before every job: COW")

    def _setup_btrfs(self, size):
        backing, mnt = self.path("btrfs.img"), self.path("btrfs-mnt")
        # btrfs frees an unlinked copy's extents only at its next commit:
        # room for two copies beside the origin, and a sync after unlink.
        make_file(backing, 4 * size + 1024 * MiB)
        dev = self.loop(backing)
        run(["mkfs.btrfs", "-q", "-f", dev])
        self.mount(dev, mnt, "btrfs")
        origin, f = os.path.join(mnt, "origin.dat"), os.path.join(mnt, "fio.dat")
        fill(origin, size)

        def reset():
            if os.path.exists(f):
                os.unlink(f)
                run(["sync", "-f", mnt])
            run(["cp", "--reflink=always", origin, f])

        self.targets["btrfs-reflink"] = Target(
            "btrfs-reflink", f, [f, origin, backing], prewrite=False, reset=reset,
            semantics="new reflink copy of a fully written file before every job: COW")

    def _start_thinfs(self, binary, pool, mnt, pool_size, options):
        run([binary, "format", pool, "--size", str(pool_size),
             "--block-size", self.args.block_size])
        os.makedirs(mnt)
        cmd = [binary, "mount", pool, mnt]
        if options:
            cmd += ["-o", options]
        run(cmd)
        with open(os.path.join(pool, "lock")) as fh:
            pid = int(fh.read().strip() or 0) or None
        self.undo.append(("thinfs umount",
                          lambda: self._stop_thinfs(binary, pool, mnt, pid)))
        return pid

    def _setup_thinfs(self, size, loop_size, want):
        a = self.args
        pool, mnt = self.path("pool"), self.path("mnt")
        # Sparse: the 8 × size of headroom costs nothing, and lets the
        # background GC lag behind the snapshots thinfs-snap deletes.
        self.daemon_pid = self._start_thinfs(a.thinfs, pool, mnt,
                                             11 * size + loop_size + 512 * MiB,
                                             a.mount_options)
        data = os.path.join(pool, "data")
        if "thinfs" in want:
            f = os.path.join(mnt, "vol")
            make_file(f, size)
            self.targets["thinfs"] = Target("thinfs", f, [f, data],
                                            semantics="fresh volume, pre-written: "
                                                      "overwrites of provisioned blocks")
        if "thinfs-snap" in want:
            self._setup_snap("thinfs-snap", a.thinfs, pool, mnt, size)
        if "thinfs-loop-ext4" in want:
            backing = os.path.join(mnt, "loopvol")
            make_file(backing, loop_size)
            self._ext4_on_loop_target("thinfs-loop-ext4", backing, [backing, data],
                                      a.loop_options)

    def _setup_snap(self, name, binary, pool, mnt, size):
        origin, f = os.path.join(mnt, "origin"), os.path.join(mnt, "snap")
        make_file(origin, size)
        fill(origin, size)

        def reset():
            if os.path.exists(f):
                run([binary, "delete", pool, "snap"])
            run([binary, "snapshot", pool, "origin", "snap"])

        self.targets[name] = Target(
            name, f, [f, os.path.join(pool, "data")], prewrite=False, reset=reset,
            semantics="new snapshot of a fully written volume before every job: COW")

    def _ext4_on_loop_target(self, name, backing, below, options):
        """ext4 on a loop device (losetup `options`) over `backing`, fio on a
        file inside; `below`: the files under the loop device, top first."""
        m = self.path(f"{name}-mnt")
        self._mount_ext4_on_loop(backing, m, options)
        f = os.path.join(m, "fio.dat")
        make_file(f, self.args.size)
        self.targets[name] = Target(name, f, [f] + below, semantics="overwrites")

    def _setup_alt(self, size, loop_size, want):
        a = self.args
        binary = a.alt_thinfs or a.thinfs
        pool, mnt = self.path("pool-alt"), self.path("mnt-alt")
        data = os.path.join(pool, "data")
        # Sparse: room for a snapshot's copies as in _setup_thinfs.
        self._start_thinfs(binary, pool, mnt, 11 * size + loop_size + 512 * MiB,
                           a.alt_mount_options)
        if ALT in want:
            f = os.path.join(mnt, "vol")
            make_file(f, size)
            self.targets[ALT] = Target(ALT, f, [f, data], semantics="as thinfs")
        if ALT_SNAP in want:
            self._setup_snap(ALT_SNAP, binary, pool, mnt, size)
        if THINFS_LOOP_ALT in want:
            backing = os.path.join(mnt, "loopvol")
            make_file(backing, loop_size)
            self._ext4_on_loop_target(THINFS_LOOP_ALT, backing, [backing, data],
                                      a.alt_loop_options)

    def _stop_thinfs(self, binary, pool, mnt, pid):
        r = run([binary, "umount", mnt], check=False)
        if r.returncode != 0:
            run(["umount", "-l", mnt], check=False)
        if pid:
            for _ in range(300):  # the final commit may take a moment
                if not os.path.exists(f"/proc/{pid}"):
                    return
                time.sleep(0.1)
            log(f"daemon {pid} still running after unmount: SIGTERM")
            os.kill(pid, signal.SIGTERM)
