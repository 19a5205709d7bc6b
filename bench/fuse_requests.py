#!/usr/bin/env python3
"""What a FUSE daemon is asked, from an strace of it: request kinds, READ and
WRITE sizes, and how many other requests were being served when each one
arrived (between the read(2) of /dev/fuse that returned it and the writev(2)
of its reply on the same thread).

    strace -f -tt -s 80 -e trace=read,writev,pread64,pwrite64 -p DAEMON -o trace.txt
    python3 bench/fuse_requests.py trace.txt

Used for docs/benchmarks.md, "Levers tried" 8 (loop devices over volumes).
Assumes libfuse's 1 MiB + 4 KiB read buffer (the read(2) size it looks for)
and x86-64's little-endian FUSE headers."""

import collections
import re
import struct
import sys

OPCODES = {1: "LOOKUP", 3: "GETATTR", 14: "OPEN", 15: "READ", 16: "WRITE", 18: "RELEASE",
           20: "FSYNC", 22: "GETXATTR", 25: "FLUSH"}
LINE = re.compile(r"^(\d+) (\d+):(\d+):([\d.]+) (.*)$")
# read(FD, "...", 1052672) = N, whole or resumed.
READ = re.compile(r'(?:read\(\d+, |<\.\.\. read resumed>)"(.*?)"(?:\.\.\.)?, 1052672\) = (\d+)')


def unescape(s):
    return s.encode("latin1").decode("unicode_escape").encode("latin1")


def main(path):
    ops, sizes, in_flight = collections.Counter(), collections.Counter(), collections.Counter()
    serving = set()  # threads between a request and its reply
    with open(path, encoding="latin1") as fh:
        for line in fh:
            m = LINE.match(line)
            if not m:
                continue
            tid, rest = m.group(1), m.group(5)
            r = READ.search(rest)
            if r:
                body = unescape(r.group(1))
                if len(body) < 8:
                    continue
                length, opcode = struct.unpack("<II", body[:8])
                name = OPCODES.get(opcode, str(opcode))
                ops[name] += 1
                if opcode == 15 and len(body) >= 60:  # fuse_read_in after the 40-byte header
                    sizes[("READ", struct.unpack("<QQI", body[40:60])[2])] += 1
                elif opcode == 16:  # 40-byte header + 40-byte fuse_write_in, then data
                    sizes[("WRITE", length - 80)] += 1
                in_flight[len(serving)] += 1
                serving.add(tid)
            elif rest.startswith("writev(") and tid in serving:
                serving.discard(tid)
    print("requests:", ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    print("sizes:", ", ".join(f"{k} {s} B: {v}" for (k, s), v in sizes.most_common(10)))
    print("others in flight when a request arrived:",
          ", ".join(f"{k}: {v}" for k, v in sorted(in_flight.items())))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
