"""Statistics and the Markdown/PNG report of fio_compare.py."""

import math
import os
import statistics

from benchlib import run

# Two-sided 95% Student's t critical values for 1..30 degrees of freedom.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
       2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]

# The pairs issue 5's targets are about (x, y): the t table compares y to x.
PAIRS = [("fuse-passthrough", "thinfs"), ("qcow2-qsd", "thinfs"),
         ("btrfs-reflink", "thinfs-snap"), ("qcow2-qsd-snap", "thinfs-snap"),
         ("raw-loop-ext4", "thinfs-loop-ext4"), ("thinfs", "thinfs-alt"),
         ("thinfs-snap", "thinfs-alt-snap"),
         ("raw-loop-ext4-alt", "thinfs-loop-ext4-alt"),
         ("raw-loop-ext4", "passthrough-loop-ext4"),
         ("passthrough-loop-ext4", "thinfs-loop-ext4")]

# Issue 5's reference: peers' IOPS ratio to raw "on a machine like ours".
PEER_REFERENCE = {
    "fuse-passthrough": [0.85, 0.91, 0.93, 1.33, 0.61, 0.35],
    "qcow2-qsd": [1.31, 0.15, 0.14, 0.52, 0.07, 0.31],
    "qcow2-qsd-snap": [1.18, 0.18, 0.10, 0.40, 0.07, 0.32],
    "btrfs-reflink": [1.55, 1.64, 0.13, 0.97, 0.17, 0.91],
}
REFERENCE_JOBS = ["seqwrite1M", "seqread1M", "randwrite4k", "randread4k", "randrw4k-4jobs",
                  "randread4k-qd32"]

WRITE_HEAVY = ["randwrite4k", "randrw4k-4jobs"]
# Issue 5's fio targets 1-4: (number, y, x, jobs (None: every job), minimum ratio y/x).
GOALS = [
    (1, "thinfs", "fuse-passthrough", None, 0.9),
    (2, "thinfs", "qcow2-qsd", None, 1.0),
    (2, "thinfs", "qcow2-qsd", WRITE_HEAVY, 2.0),
    (3, "thinfs-snap", "btrfs-reflink", WRITE_HEAVY, 1.0),
    (3, "thinfs-snap", "qcow2-qsd-snap", WRITE_HEAVY, 2.0),
    (4, "thinfs-loop-ext4", "raw-loop-ext4", None, 0.8),
]


def median(v):
    return statistics.median(v) if v else None


def med_cell(v, prec=0):
    if not v:
        return "n/a"
    return f"{statistics.median(v):.{prec}f} ({min(v):.{prec}f}–{max(v):.{prec}f})"


def ratio_cell(a, b):
    """Median (min-max) of per-round ratios a[i]/b[i]."""
    r = [x / y for x, y in zip(a or [], b or []) if y]
    if not r:
        return "n/a"
    return f"{statistics.median(r):.2f} ({min(r):.2f}–{max(r):.2f})"


def ratio_of_medians(a, b):
    if not a or not b or not statistics.median(b):
        return None
    return statistics.median(a) / statistics.median(b)


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


def results_table(results, jobs, targets):
    L = []
    hdr = "| job | unit | " + " | ".join(targets)
    ratio_cols = [t for t in targets if t != "raw" and "raw" in targets]
    hdr += "".join(f" | {t}/raw" for t in ratio_cols) + " |"
    L.append(hdr)
    L.append("|---|---|" + "---:|" * (len(targets) + len(ratio_cols)))
    for job in jobs:
        name, unit = job[0], job[5]
        cells = []
        for t in targets:
            v = results[t][name]
            cells.append("n/a (no O_DIRECT)" if v is None
                         else med_cell(v, 0 if unit == "IOPS" else 1))
        cells += [ratio_cell(results[t][name], results["raw"][name]) for t in ratio_cols]
        L.append(f"| {name} | {unit} | " + " | ".join(cells) + " |")
    return L


def t_table(results, jobs, pairs):
    L = ["| job | x | y | mean x ± sd | mean y ± sd | difference (y − x) | relative | "
         "verdict |", "|---|---|---|---:|---:|---:|---:|---|"]
    for job in jobs:
        for x, y in pairs:
            a, b = results[x][job[0]], results[y][job[0]]
            m = ministat(a, b) if a and b else None
            if m is None:
                why = "n/a (no O_DIRECT)" if a is None or b is None else \
                    "n/a (needs ≥ 2 rounds on both sides)"
                L.append(f"| {job[0]} | {x} | {y} | | | | | {why} |")
                continue
            L.append(f"| {job[0]} | {x} | {y} | {m['mean_x']:.1f} ± {m['sd_x']:.1f} | "
                     f"{m['mean_y']:.1f} ± {m['sd_y']:.1f} | {m['diff']:+.1f} ± "
                     f"{m['ci']:.1f} | {m['pct']:+.1f}% ± {m['pct_ci']:.1f}% | "
                     + ("difference at 95%" if m["proven"]
                        else "no difference proven at 95%") + " |")
    return L


# The goals' thinfs targets and libfuse's passthrough in the same place:
# the same ratio with the passthrough as y tells a cost every FUSE server
# pays on this machine from one of thinfs's own. For thinfs-snap it is
# only a reference: the passthrough overwrites in place, it copies nothing.
PASSTHROUGH_IN_PLACE_OF = {
    "thinfs": "fuse-passthrough",
    "thinfs-snap": "fuse-passthrough",
    "thinfs-loop-ext4": "passthrough-loop-ext4",
}


def goals_table(results, jobs):
    """Issue 5's targets 1-4 from this run's medians: one row per goal and
    job, with the same ratio for libfuse's passthrough in thinfs's place
    where the run measured it, then one verdict per goal. Returns (lines,
    {goal: verdict})."""
    names = [j[0] for j in jobs]
    L = ["| # | goal | job | ratio of medians | met? | the same ratio, libfuse's passthrough "
         "in thinfs's place |", "|---|---|---|---:|---|---:|"]
    verdict = {}
    for num, y, x, gjobs, minimum in GOALS:
        if y not in results or x not in results:
            verdict.setdefault(num, "not measured")
            continue
        desc = f"{y} ≥ {minimum:g}× {x}" + (" (every job)" if gjobs is None else "")
        stand_in = PASSTHROUGH_IN_PLACE_OF.get(y)
        for job in (gjobs or names):
            if job not in names:
                continue
            pt = None
            if stand_in in results and stand_in != x:
                pt = ratio_of_medians(results[stand_in][job], results[x][job])
            pt_cell = f"{pt:.2f}" if pt is not None else "—"
            r = ratio_of_medians(results[y][job], results[x][job])
            if r is None:
                L.append(f"| {num} | {desc} | {job} | n/a | n/a | {pt_cell} |")
                continue
            ok = r >= minimum
            L.append(f"| {num} | {desc} | {job} | {r:.2f} | {'met' if ok else '**not met**'} "
                     f"| {pt_cell} |")
            if not ok:
                verdict[num] = "not met"
            else:
                verdict.setdefault(num, "met")
    return L, verdict


def reference_table(results, jobs):
    names = [j[0] for j in jobs]
    peers = [p for p in PEER_REFERENCE if p in results]
    if "raw" not in results or not peers:
        return []
    L = ["| job | " + " | ".join(f"{p}: here / issue" for p in peers) + " |",
         "|---|" + "---:|" * len(peers)]
    for i, job in enumerate(REFERENCE_JOBS):
        if job not in names:
            continue
        cells = []
        for p in peers:
            r = ratio_of_medians(results[p][job], results["raw"][job])
            cells.append(f"{r:.2f} / {PEER_REFERENCE[p][i]:.2f}" if r is not None
                         else f"n/a / {PEER_REFERENCE[p][i]:.2f}")
        L.append(f"| {job} | " + " | ".join(cells) + " |")
    return L


def chart(results, jobs, targets, png):
    """A gnuplot bar chart of each target's ratio of medians to raw, per job
    (log scale, line at 1). Writes PNG plus its .dat and .gp next to it."""
    others = [t for t in targets if t != "raw"]
    base = os.path.splitext(png)[0]
    dat, gp = base + ".dat", base + ".gp"
    with open(dat, "w") as fh:
        fh.write("job " + " ".join(others) + "\n")
        for job in jobs:
            row = [job[0]]
            for t in others:
                r = ratio_of_medians(results[t][job[0]], results["raw"][job[0]])
                row.append(f"{r:.4f}" if r else "NaN")
            fh.write(" ".join(row) + "\n")
    cols = " , ".join(f"'{dat}' using {i + 2}:xtic(1) title columnhead"
                      for i in range(len(others)))
    with open(gp, "w") as fh:
        fh.write(f"""set terminal pngcairo size 1400,640 font ',10'
set output '{png}'
set title 'fio through the whole stack: ratio of medians to raw (higher is better; log scale)'
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set boxwidth 0.9
set logscale y
set yrange [0.01:10]
set grid ytics
set key outside right top vertical
set ylabel 'ratio to raw'
set arrow from graph 0, first 1 to graph 1, first 1 nohead lw 2 dt 2
set datafile missing 'NaN'
plot {cols}
""")
    run(["gnuplot", gp])
    return png
