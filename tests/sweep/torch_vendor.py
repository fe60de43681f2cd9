#!/usr/bin/env python3
"""Adds PyTorch's times to a gc_sweep_memops results file and summarises it.

    torch_vendor.py SWEEP.json [--out MERGED.json] [--md TABLE.md] [--reps N]

For every reduction and permutation of the sweep, times PyTorch's own kernel
on fresh data of the same shape and dtype (torch.sum / torch.amax over the
same axis; permute(...).contiguous()), with CUDA events and the GPU kept busy
by a sleep kernel queued first, so that only the kernels' device time counts
(PyTorch's host overhead is not charged to it). The vendor of each row is then
the fastest of the libraries timed by the sweep (cuBLAS, CUB, cuBLASLt) and
PyTorch. Prints the summary by operation and class, and writes the merged
JSON and a markdown table. Without torch it only summarises.
"""
import argparse
import json
import math
import re
import statistics
import sys


def torch_time(torch, fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(1_000_000)
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def add_torch(rows, reps):
    try:
        import torch
    except ImportError:
        print("no torch: summarising the libraries' times only", file=sys.stderr)
        return False
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    for row in rows:
        dt = dtypes[row["dtype"]]
        if row["op"] == "reduce":
            m = re.match(r"(sum|max) \[(\d+),(\d+),(\d+)\]", row["shape"])
            op, o, a, i = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
            x = torch.rand((o, a, i), device="cuda", dtype=dt) * 2 - 1
            fn = (lambda: torch.sum(x, dim=1)) if op == "sum" else (lambda: torch.amax(x, dim=1))
        elif row["op"] == "transpose":
            m = re.match(r"\[([\d,]+)\] \(([\d,]+)\)", row["shape"])
            shape = [int(v) for v in m.group(1).split(",")]
            perm = [int(v) for v in m.group(2).split(",")]
            x = torch.rand(shape, device="cuda", dtype=dt)
            fn = lambda: x.permute(*perm).contiguous()
        else:
            continue
        row["torch_s"] = torch_time(torch, fn, reps)
        del x
    return True


def vendor_of(row):
    best, name = None, None
    if row.get("vendor_s", -1) > 0:
        best, name = row["vendor_s"], row["vendor"]
    if row.get("torch_s", -1) > 0 and (best is None or row["torch_s"] < best):
        best, name = row["torch_s"], "torch"
    return best, name


# Variants that are not our kernels (the vendor fallbacks the default may pick).
VENDOR_VARIANTS = {"cublas"}


def own_best(row):
    """Seconds of the fastest of our own kernels on the row (forced variants and
    the default when it is ours), or None."""
    times = [t for name, t in row.get("forced", {}).items() if name not in VENDOR_VARIANTS and t > 0]
    if row["variant"] not in VENDOR_VARIANTS and row["ours_s"] > 0:
        times.append(row["ours_s"])
    return min(times) if times else None


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summarise(data):
    rows = data["rows"]
    lines = []
    groups = {}
    for row in rows:
        v, name = vendor_of(row)
        row["best_vendor"], row["best_vendor_s"] = name, v
        row["x_vendor"] = v / row["ours_s"] if v else None
        own = own_best(row)
        row["own_best_s"] = own
        row["x_vendor_own"] = v / own if (v and own) else None
        row["x_copy"] = row["copy_s"] / row["ours_s"]
        groups.setdefault((row["op"], row["class"]), []).append(row)
    head = ("| op | class | cases | default: geomean x vendor | min | >= 0.95 | geomean x copy "
            "| own kernels only: geomean x vendor | >= 0.9 |")
    lines += [head, "|---|---|---|---|---|---|---|---|---|"]
    total, total_own = [], []
    for (op, cls), rs in sorted(groups.items()):
        xs = [r["x_vendor"] for r in rs if r["x_vendor"]]
        os_ = [r["x_vendor_own"] for r in rs if r["x_vendor_own"]]
        total += xs
        total_own += os_
        cp = geomean([r["x_copy"] for r in rs])
        lines.append(f"| {op} | {cls} | {len(rs)} | {geomean(xs):.3f} | {min(xs) if xs else float('nan'):.3f} "
                     f"| {sum(x >= 0.95 for x in xs)}/{len(xs)} | {cp:.3f} | {geomean(os_):.3f} "
                     f"| {sum(x >= 0.9 for x in os_)}/{len(os_)} |")
    pct = 100.0 * sum(x >= 0.95 for x in total) / max(1, len(total))
    pct_own = 100.0 * sum(x >= 0.9 for x in total_own) / max(1, len(total_own))
    lines.append(f"| all | | {len(rows)} | {geomean(total):.3f} | {min(total) if total else float('nan'):.3f} "
                 f"| {sum(x >= 0.95 for x in total)}/{len(total)} ({pct:.1f}%) | | {geomean(total_own):.3f} "
                 f"| {sum(x >= 0.9 for x in total_own)}/{len(total_own)} ({pct_own:.1f}%) |")
    return lines


def table(rows):
    out = ["| op | class | shape | dtype | variant | ours us | vendor | vendor us | x vendor | x copy | best forced |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    # ours us: the default path's device busy time; best forced: the fastest
    # version when each is forced by name.
    for r in rows:
        forced = r.get("forced", {})
        best = min(forced.items(), key=lambda kv: kv[1]) if forced else ("", 0)
        xv = f"{r['x_vendor']:.3f}" if r["x_vendor"] else "-"
        vs = f"{r['best_vendor_s'] * 1e6:.2f}" if r["best_vendor_s"] else "-"
        out.append(f"| {r['op']} | {r['class']} | {r['shape']} | {r['dtype']} | {r['variant']} | "
                   f"{r['ours_s'] * 1e6:.2f} | {r['best_vendor'] or '-'} | {vs} | {xv} | "
                   f"{r['x_copy']:.3f} | {best[0]} {best[1] * 1e6:.2f} |")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("--out")
    ap.add_argument("--md")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    with open(args.sweep) as f:
        data = json.load(f)
    data["torch"] = add_torch(data["rows"], args.reps)
    summary = summarise(data)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(data, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"GPU: {data['gpu']}; date: {data['date']}; command: `{data['command']}`\n\n")
            f.write("\n".join(summary) + "\n\n" + "\n".join(table(data["rows"])) + "\n")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
