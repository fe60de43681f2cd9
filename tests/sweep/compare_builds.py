#!/usr/bin/env python3
"""Sets two builds' attention sweeps side by side: a change against its base,
timed on the same GPU in the same command, each against the vendor times of
the change's merged rows.

    compare_builds.py NEW_MERGED.json BASE.json [--out COMPARED.json]
                      [--moved 0.03] [--names new,base]

NEW_MERGED.json is gc_sweep_attention's output for the change after
attention_vendor.py added the vendor's times; BASE.json is the base build's
gc_sweep_attention output on the same cases (same flags, --random seed
included). Rows are matched by class, shape and dtype. Each row of the
change gains base_s, base_variant and base_ratio = vendor_s / base_s; the
header gains base_command and base_date (--out writes it). Prints, by class
and over all rows both builds timed with a vendor time: rows, the geometric
mean of the ratio to the vendor, its minimum, the rows at or past 1.0x and
below 0.85x, for the change and for the base; the geometric mean of the
change's time over the base's; then every row whose time moved by more than
--moved (a share) either way. Rows that failed (ok false, ours_s <= 0) in
either build are counted apart and left out of the figures.

deploy/gpu/sweep-attention.sh runs it when BASE_BIN names the base build's
gc_sweep_attention.
"""
import argparse
import json
import sys

# The vendor script's row checks and mean (it travels beside this one; torch
# is imported only where it times).
from attention_vendor import failed, geomean


def key(row):
    return (row.get("class", ""), str(row.get("shape", "")), row.get("dtype", ""))


def good(row):
    return row is not None and not failed(row)


def merge(new, base):
    """Adds the base build's time to every row of `new` that `base` timed; returns the
    pairs (new row, base row) that both builds timed well, and the count that failed."""
    by_key = {key(r): r for r in base.get("rows", [])}
    pairs, failed = [], 0
    for row in new.get("rows", []):
        other = by_key.get(key(row))
        if other is None:
            continue
        if not (good(row) and good(other)):
            failed += 1
            continue
        row["base_s"] = other["ours_s"]
        row["base_variant"] = other.get("variant", "")
        if row.get("vendor_s"):
            row["base_ratio"] = row["vendor_s"] / other["ours_s"]
        pairs.append((row, other))
    new["base_command"] = base.get("command", "")
    new["base_date"] = base.get("date", "")
    return pairs, failed


def summary(pairs):
    """Per class and over all: (n, [gm, min, >=1, <0.85] for new and base, time gm)."""
    groups = {}
    for row, other in pairs:
        if not row.get("vendor_s"):
            continue
        groups.setdefault(row.get("class", ""), []).append((row, other))
    out = []
    everything = []
    for name in sorted(groups) + ["(all)"]:
        rows = everything if name == "(all)" else groups[name]
        if name != "(all)":
            everything.extend(rows)
        if not rows:
            continue
        figures = []
        for pick in (lambda r, o: r["ours_s"], lambda r, o: o["ours_s"]):
            ratios = [r["vendor_s"] / pick(r, o) for r, o in rows]
            figures.append((geomean(ratios), min(ratios), sum(x >= 1.0 for x in ratios),
                            sum(x < 0.85 for x in ratios)))
        time = geomean([r["ours_s"] / o["ours_s"] for r, o in rows])
        out.append((name, len(rows), figures[0], figures[1], time))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", help="the change's rows, merged with the vendor's times")
    ap.add_argument("base", help="the base build's rows on the same cases")
    ap.add_argument("--out", help="writes the change's rows with the base's times here")
    ap.add_argument("--moved", type=float, default=0.03,
                    help="lists rows whose time moved by more than this share")
    ap.add_argument("--names", default="new,base", help="the two builds' names in the table")
    args = ap.parse_args(argv)
    with open(args.new) as f:
        new = json.load(f)
    with open(args.base) as f:
        base = json.load(f)
    names = args.names.split(",")
    if len(names) != 2:
        ap.error("--names takes two names")
    pairs, failed = merge(new, base)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(new, f, indent=1)
    print("%d rows timed by both builds, %d failed in one of them" % (len(pairs), failed))
    a, b = names
    print("%-12s %5s  %-29s  %-29s  %s" % ("class", "rows", "x vendor, " + a + ": gm min >=1 <.85",
                                          "x vendor, " + b + ": gm min >=1 <.85",
                                          "time " + a + "/" + b))
    for name, n, fa, fb, time in summary(pairs):
        print("%-12s %5d  %6.3f %6.3f %5d %4d     %6.3f %6.3f %5d %4d     %.4f" %
              ((name, n) + fa + fb + (time,)))
    moved = [(r["ours_s"] / o["ours_s"], r) for r, o in pairs
             if abs(r["ours_s"] / o["ours_s"] - 1) > args.moved]
    print("rows whose time moved by more than %.1f%% (us %s / %s, x vendor):" %
          (100 * args.moved, a, b))
    for share, r in sorted(moved, key=lambda m: m[0]):
        vendor = ("x%.3f / x%.3f" % (r["vendor_s"] / r["ours_s"], r["base_ratio"])
                  if r.get("vendor_s") else "no vendor time")
        print("  %-12s %-44s %-5s %9.1f %9.1f  %.3f  %s" %
              (r.get("class", ""), r.get("shape", ""), r.get("dtype", ""), r["ours_s"] * 1e6,
               r["base_s"] * 1e6, share, vendor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
