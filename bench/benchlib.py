"""Small helpers shared by fio_compare.py and its parts: running commands,
mounts, daemons, sizes."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30


def log(msg):
    print(f"fio_compare: {msg}", file=sys.stderr, flush=True)


def run(cmd, check=True, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({r.returncode}): "
                           f"{r.stderr.strip() or r.stdout.strip()}")
    return r


def timed(cmd):
    """Wall time of `cmd` in milliseconds (it must succeed)."""
    t0 = time.perf_counter()
    run(cmd)
    return (time.perf_counter() - t0) * 1000


def parse_size(s):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("ib")
    if s and s[-1] in units:
        return int(s[:-1]) * units[s[-1]]
    return int(s)


def size_label(n):
    return f"{n // GiB} GiB" if n % GiB == 0 else f"{n // MiB} MiB"


def is_mounted(path):
    path = os.fsencode(os.path.realpath(path))
    with open("/proc/self/mountinfo", "rb") as fh:
        for line in fh:
            # Field 5 is the mount point, its space, tab, newline and
            # backslash written as \ooo octal; the rest are raw bytes.
            mp = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]),
                        line.split()[4])
            if mp == path:
                return True
    return False


def umount(mnt):
    if not is_mounted(mnt):
        return
    if run(["umount", mnt], check=False).returncode != 0:
        time.sleep(0.5)
        run(["umount", "-l", mnt])


def make_file(path, size):
    with open(path, "wb") as fh:
        fh.truncate(size)


class Daemon:
    """A FUSE server started in the foreground by us: waits for its mount,
    and on stop unmounts, waits for the process, SIGTERM/SIGKILL as the
    last resort. Only ever signals its own PID."""

    def __init__(self, name, cmd, mountpoint, log_path):
        self.name, self.mountpoint = name, mountpoint
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not is_mounted(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(log_path) as fh:
                    raise RuntimeError(f"{name} did not mount {mountpoint}: "
                                       f"{fh.read().strip()[-500:]}")
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None and is_mounted(self.mountpoint):
            # qemu-storage-daemon unmounts its export itself on SIGTERM;
            # passthrough_ll exits when its mount goes away.
            if self.name.startswith("qemu"):
                self.proc.send_signal(signal.SIGTERM)
            else:
                run(["umount", self.mountpoint], check=False)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{self.name} (pid {self.proc.pid}) still running: SIGKILL")
            self.proc.kill()
            self.proc.wait()
        if is_mounted(self.mountpoint):
            run(["umount", "-l", self.mountpoint], check=False)
        self.log.close()


def supports_direct(path, write=False):
    """True if `path` opens with O_DIRECT and serves an aligned 4 KiB read
    (with write: and takes the same bytes back at the same place, as
    libfuse's passthrough_ll does not: it writes the request's unaligned
    buffer to its O_DIRECT file and gets EINVAL)."""
    try:
        fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT)
    except OSError:
        return False
    try:
        import mmap
        buf = mmap.mmap(-1, 4096)
        os.preadv(fd, [buf], 0)
        if write:
            os.pwritev(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def fill(path, size, order="seq"):
    """Writes every byte of `path` (created if missing) with fio's non-zero
    random buffers and fsyncs: a fully mapped origin. order "frag" writes
    64 KiB blocks in random order (each exactly once: fio's random map)."""
    rw, bs = ("write", "1M") if order == "seq" else ("randwrite", "64k")
    run(["fio", "--name=fill", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
         f"--size={size}", "--end_fsync=1", "--ioengine=psync", "--randrepeat=0",
         "--output-format=json", "--output=/dev/null"])


def loadavg():
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "n/a"
