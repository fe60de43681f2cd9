#!/usr/bin/env python3
"""One launch each of our attention (the default version, or those named) and
of PyTorch SDPA's cuDNN and FlashAttention-2 backends on the same inputs,
inside a profiler range, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --set full -o REPORT \\
        python3 attention_profile.py --lib libgc_kernels_capi.so \\
        --case B128,H32,S128,D64 --case B8,H32/8,Sq1,Skv32768,D128,causal

Everything is warmed up first; only the launches between cudaProfilerStart
and cudaProfilerStop are profiled, so the report holds one row per version
and case (plus the vendor's helper kernels, if any). Without ncu it prints
each launch's median device time (CUDA events, 10 runs of 10 launches), so the same command
also says what the profiled kernels cost. deploy/gpu/profile-attention.sh
runs it under ncu from the bundle and prints the summary.
"""
import argparse
import os
import sys

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_sdpa import Ours, sdpa_call, time_ms  # noqa: E402


def parse_case(text):
    """B128,H32,S128,D64[,causal] or B8,H32/8,Sq1,Skv4096,D128[,causal][,f16]."""
    c = dict(b=1, hq=1, hkv=None, sq=None, skv=None, d=128, causal=False, dtype=torch.bfloat16)
    for part in text.split(","):
        if part == "causal":
            c["causal"] = True
        elif part in ("f16", "fp16"):
            c["dtype"] = torch.float16
        elif part == "bf16":
            c["dtype"] = torch.bfloat16
        elif part.startswith("Skv"):
            c["skv"] = int(part[3:])
        elif part.startswith("Sq"):
            c["sq"] = int(part[2:])
        elif part.startswith("S"):
            c["sq"] = c["skv"] = int(part[1:])
        elif part.startswith("H"):
            hq, _, hkv = part[1:].partition("/")
            c["hq"] = int(hq)
            c["hkv"] = int(hkv) if hkv else None
        elif part.startswith("B"):
            c["b"] = int(part[1:])
        elif part.startswith("D"):
            c["d"] = int(part[1:])
        else:
            raise SystemExit(f"bad case part {part!r} in {text!r}")
    if c["sq"] is None or c["skv"] is None:
        raise SystemExit(f"case {text!r} needs S or Sq and Skv")
    if c["hkv"] is None:
        c["hkv"] = c["hq"]
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="path to libgc_kernels_capi.so")
    ap.add_argument("--case", action="append", required=True, help="see the module doc")
    ap.add_argument("--variant", action="append", default=None,
                    help="our versions to launch ('' = the default; repeatable)")
    ap.add_argument("--no-vendor", action="store_true", help="leave out cuDNN and FA2")
    args = ap.parse_args()
    ours = Ours(args.lib)
    variants = args.variant if args.variant else [""]
    torch.manual_seed(0)
    calls = []  # (label, callable)
    keep = []
    for text in args.case:
        c = parse_case(text)
        q = torch.rand(c["b"], c["hq"], c["sq"], c["d"], device="cuda", dtype=c["dtype"]) * 2 - 1
        k = torch.rand(c["b"], c["hkv"], c["skv"], c["d"], device="cuda", dtype=c["dtype"]) * 2 - 1
        v = torch.rand(c["b"], c["hkv"], c["skv"], c["d"], device="cuda", dtype=c["dtype"]) * 2 - 1
        o = torch.empty_like(q)
        keep.append((q, k, v, o))
        for variant in variants:
            call, reason = ours.make_call(q, k, v, o, None, c["causal"], variant)
            if call is None:
                print(f"{text} ours {variant or 'default'}: not run ({reason})")
                continue
            calls.append((f"{text} ours {variant or 'default'}", call))
        if args.no_vendor or (c["sq"] != c["skv"] and c["causal"]):
            continue  # the vendor's bottom-right mask: see tests/sweep/attention_vendor.py
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("fa2", SDPBackend.FLASH_ATTENTION)):
            call, _, note = sdpa_call(backend, q, k, v, c["causal"])
            if call is None:
                print(f"{text} {name}: not run ({note})")
                continue
            calls.append((f"{text} {name}", call))
    for label, call in calls:
        print(f"{label:48s} {time_ms(call, 10, 10) * 1e3:9.1f} us", flush=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, call in calls:
        torch.cuda.nvtx.range_push(label)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
