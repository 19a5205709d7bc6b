#!/usr/bin/env python3
"""Cross-checks fio_report.ministat() against the real `ministat` binary
(Debian package ministat) on fixed samples: the difference of the means,
its 95% confidence half-width, the relative figures, the pooled standard
deviation and the verdict must agree to the digits ministat prints. Exits
0 on agreement, 1 on a mismatch (or if ministat is missing while CI is
set), 77 if ministat is missing otherwise."""

import sys

sys.dont_write_bytecode = True

import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from fio_report import ministat  # noqa: E402

# (x, y): a proven difference, an unproven one, unequal sizes, large values.
CASES = [
    ([502.2, 459.2, 556.5], [289.5, 226.4, 333.2]),
    ([13435, 11693, 15374], [12670, 15036, 13778]),
    ([1.0, 2.0, 3.0, 4.0, 5.0], [2.5, 3.5, 4.5]),
    ([148161, 74999, 199274, 160000], [6937, 2856, 12926, 9000]),
]


def real_ministat(x, y):
    with tempfile.TemporaryDirectory() as d:
        files = []
        for name, v in (("x", x), ("y", y)):
            path = os.path.join(d, name)
            with open(path, "w") as fh:
                fh.write("\n".join(repr(e) for e in v) + "\n")
            files.append(path)
        out = subprocess.run(["ministat", "-c", "95", "-A"] + files, check=True,
                             stdout=subprocess.PIPE, text=True).stdout
    if "No difference proven" in out:
        return {"proven": False}
    m = re.search(r"Difference at 95\.0% confidence\s+(\S+) \+/- (\S+)\s+"
                  r"(\S+)% \+/- (\S+)%\s+\(Student's t, pooled s = (\S+)\)", out)
    if not m:
        raise RuntimeError("cannot parse ministat's output:\n" + out)
    diff, ci, pct, pct_ci, s = (float(g) for g in m.groups())
    return {"proven": True, "diff": diff, "ci": ci, "pct": pct, "pct_ci": pct_ci,
            "pooled_s": s}


def close(a, b):
    # ministat prints 6 significant digits (%g).
    return abs(a - b) <= 1e-5 * max(abs(a), abs(b), 1e-9) + 1e-9


def main():
    if shutil.which("ministat") is None:
        print("ministat_check: ministat missing (scripts/deps.sh)", file=sys.stderr)
        return 1 if os.environ.get("CI") else 77
    failures = 0
    for x, y in CASES:
        want, got = real_ministat(x, y), ministat(x, y)
        bad = [k for k in want if k != "proven" and not close(want[k], got[k])]
        if want["proven"] != got["proven"] or bad:
            failures += 1
            print(f"MISMATCH x={x} y={y}: ministat {want}, ours {got}", file=sys.stderr)
        else:
            print(f"ok x={x} y={y}: proven={want['proven']}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
