#!/usr/bin/env python3
# Times copy_file_range onto an empty file of a thinfs mount: one call for the
# whole source (the O(1) clone path) vs PIECES calls (the per-piece path).
# usage: clone_pieces.py MNT SRC_NAME PIECES REPS (bench/mapped_count.sh runs it)
import os, sys, time, statistics
mnt, src, pieces, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
size = os.path.getsize(os.path.join(mnt, src))
times = []
for r in range(reps):
    dst = os.path.join(mnt, "dst%d" % r)
    with open(dst, "wb") as f:
        f.truncate(size)
    s = os.open(os.path.join(mnt, src), os.O_RDONLY)
    d = os.open(dst, os.O_WRONLY)
    piece = size // pieces
    t0 = time.perf_counter()
    off = 0
    while off < size:
        n = os.copy_file_range(s, d, min(piece, size - off), off, off)
        if n <= 0:
            raise SystemExit("short copy at %d" % off)
        off += n
    t1 = time.perf_counter()
    os.close(s); os.close(d)
    st = os.stat(dst)
    blocks = st.st_blocks
    os.unlink(dst)
    times.append((t1 - t0) * 1000)
print("pieces=%d reps=%d median=%.2f ms min=%.2f max=%.2f st_blocks(last)=%d" %
      (pieces, reps, statistics.median(times), min(times), max(times), blocks))
