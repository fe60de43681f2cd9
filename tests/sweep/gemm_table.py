#!/usr/bin/env python3
"""The GEMM sweep's results (gc_sweep_gemm's JSON) as a markdown table and a
summary by class.

  gemm_table.py sweep-gemm.json [--md sweep-gemm.md]

x vendor = the vendor's time / ours (> 1: we are faster). "default" is what
the server's default path ran; "own" the fastest of our own kernels forced
by name (the vendor fallbacks "cublaslt" and "cublas" left out); "lt" and
"cublas" the fallbacks forced.
"""
import argparse
import json
import math
import sys


# The vendor fallbacks (kernels/include/gpucompute/kernels/gemm.h).
VENDOR = ("cublaslt", "cublas")


def geo(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--md")
    args = ap.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    rows = data["rows"]
    for r in rows:
        own = {k: v for k, v in r["forced"].items() if k not in VENDOR and v > 0}
        r["own_best"] = min(own, key=own.get) if own else ""
        r["own_s"] = own[r["own_best"]] if own else -1
        r["lt_s"] = r["forced"].get("cublaslt", -1)
        r["blas_s"] = r["forced"].get("cublas", -1)
        v = r["vendor_s"]
        r["x_def"] = v / r["ours_s"] if v > 0 and r["ours_s"] > 0 else 0
        r["x_own"] = v / r["own_s"] if v > 0 and r["own_s"] > 0 else 0
        r["x_lt"] = v / r["lt_s"] if v > 0 and r["lt_s"] > 0 else 0
        r["x_blas"] = v / r["blas_s"] if v > 0 and r["blas_s"] > 0 else 0
        r["tflops"] = r["flops"] / r["ours_s"] / 1e12 if r["ours_s"] > 0 else 0

    classes = {}
    for r in rows:
        if r["x_def"] > 0:
            classes.setdefault(r["class"], []).append(r)
            classes.setdefault("(all)", []).append(r)

    def summary_line(name, rs):
        d = [r["x_def"] for r in rs]
        o = [r["x_own"] for r in rs if r["x_own"] > 0]
        return (name, len(rs), geo(d), min(d), sum(x >= 0.95 for x in d), geo(o),
                sum(x >= 0.9 for x in o), len(o), sum(x >= 1.0 for x in o))

    lines = [summary_line(k, v) for k, v in sorted(classes.items())]
    out = []
    out.append("| class | cases | default: geomean x vendor | min | >= 0.95 | own kernels only: geomean | >= 0.9 | >= 1.0 |")
    out.append("|---|---|---|---|---|---|---|---|")
    for (name, n, g, mn, good, go, og, no, o1) in lines:
        out.append(f"| {name} | {n} | {g:.3f} | {mn:.3f} | {good}/{n} | {go:.3f} | {og}/{no} | {o1}/{no} |")
    table = "\n".join(out)

    detail = ["| class | shape | dtype | default ran | ours us | TFLOP/s | vendor us | x vendor | best own | x own | x cublaslt forced | x cublas forced | ok |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        detail.append(
            f"| {r['class']} | {r['shape']} | {r['dtype']}->{r['out']} | {r['variant']} | "
            f"{r['ours_s'] * 1e6:.1f} | {r['tflops']:.1f} | {r['vendor_s'] * 1e6:.1f} | "
            f"{r['x_def']:.3f} | {r['own_best']} | {r['x_own']:.3f} | {r['x_lt']:.3f} | "
            f"{r['x_blas']:.3f} | "
            f"{'ok' if r['ok'] else 'WRONG'} |")

    wrong = sum(not r["ok"] for r in rows)
    print(f"gpu: {data['gpu']}; date {data['date']}; {len(rows)} cases; {wrong} wrong")
    print(table)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"# GEMM sweep: {data['gpu']}, {data['date']}\n\n")
            f.write(f"Command: `{data['command']}`\n\n")
            f.write(table + "\n\n" + "\n".join(detail) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
