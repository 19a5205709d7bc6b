#!/usr/bin/env python3
"""Holds GIB GiB of memory with every other 4 KiB page given back.

    bench/fragment_memory.py GIB

Touches GIB GiB of anonymous memory, then frees every other page
(madvise MADV_DONTNEED), prints "ready" and sleeps until killed. The
kernel's allocator hands out the smallest free blocks first, so the
pages a process faults in meanwhile are scattered, as on a machine that
has run for a while, not the long runs that a machine whose caches were
just dropped gives. bench/loop_remount.sh --fragment mounts the pool
under it (docs/benchmarks.md, lever 50).
"""
import ctypes
import mmap
import sys
import time

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    size = int(float(sys.argv[1]) * (1 << 30)) // (2 * PAGE) * (2 * PAGE)
    mem = mmap.mmap(-1, size)
    for off in range(0, size, PAGE):
        mem[off] = 1
    base = ctypes.addressof((ctypes.c_char * size).from_buffer(mem))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for off in range(0, size, 2 * PAGE):
        if libc.madvise(base + off, PAGE, MADV_DONTNEED) != 0:
            sys.exit(f"fragment_memory: madvise: errno {ctypes.get_errno()}")
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
