#!/usr/bin/env python3
"""Attention forward: our versions against PyTorch SDPA, same inputs, same run.

Loads libgc_kernels_capi.so (the kernels library's C entry points) with ctypes
and times, on identical bf16 tensors, each of our versions and
torch.nn.functional.scaled_dot_product_attention with the FLASH_ATTENTION
(FlashAttention-2) and CUDNN_ATTENTION backends. Prints TFLOP/s
(4 * B * Hq * Sq * Skv * D, halved when causal) and the ratios to both
backends, checks our outputs against the FlashAttention-2 output, and writes a
JSON file.

    python3 attention_sdpa.py --lib path/to/libgc_kernels_capi.so --json out.json [--quick]
"""
import argparse
import ctypes
import datetime
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class GcAttentionArgs(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("seq_q", ctypes.c_int64),
        ("seq_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("causal", ctypes.c_int32),
        ("scale", ctypes.c_float),
    ]


DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class Ours:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.gc_attention_variants.restype = ctypes.c_size_t
        self.lib.gc_attention_variants.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.lib.gc_attention_can_implement.restype = ctypes.c_int
        self.lib.gc_attention_can_implement.argtypes = [
            ctypes.POINTER(GcAttentionArgs), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        self.lib.gc_attention_workspace_bytes.restype = ctypes.c_size_t
        self.lib.gc_attention_workspace_bytes.argtypes = [
            ctypes.POINTER(GcAttentionArgs), ctypes.c_char_p]
        self.lib.gc_attention_launch.restype = ctypes.c_int
        self.lib.gc_attention_launch.argtypes = [
            ctypes.POINTER(GcAttentionArgs), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.gc_error_string.restype = ctypes.c_char_p
        self.lib.gc_error_string.argtypes = [ctypes.c_int]

    def variants(self):
        buf = ctypes.create_string_buffer(1024)
        self.lib.gc_attention_variants(buf, len(buf))
        return buf.value.decode().split(",")

    def make_call(self, q, k, v, o, lse, causal, variant):
        """Returns (callable, None) or (None, reason)."""
        a = GcAttentionArgs(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                            lse.data_ptr() if lse is not None else None,
                            q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2],
                            q.shape[3], DTYPE_CODE[q.dtype], int(causal), 0.0)
        name = variant.encode()
        reason = ctypes.create_string_buffer(512)
        if not self.lib.gc_attention_can_implement(ctypes.byref(a), name, reason, len(reason)):
            return None, reason.value.decode()
        ws_bytes = self.lib.gc_attention_workspace_bytes(ctypes.byref(a), name)
        ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=q.device)
        ws_ptr = ws.data_ptr()
        lib = self.lib

        def call():
            stream = torch.cuda.current_stream().cuda_stream
            err = lib.gc_attention_launch(ctypes.byref(a), name, ws_ptr, stream)
            if err != 0:
                raise RuntimeError(lib.gc_error_string(err).decode())

        call.keep = (a, ws)  # keep the arguments and the workspace alive
        return call, None


def time_ms(fn, iters, reps, warmup=3):
    """Median over `reps` of the mean time of `iters` back-to-back launches."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        res.append(start.elapsed_time(end) / iters)
    return statistics.median(res)


def configs():
    out = []
    for d in (64, 128):
        for s in (1024, 4096, 16384):
            for causal in (False, True):
                out.append(dict(b=32768 // s, hq=2048 // d, hkv=2048 // d, sq=s, skv=s, d=d,
                                causal=causal))
    out.append(dict(b=8, hq=32, hkv=8, sq=4096, skv=4096, d=128, causal=False))
    out.append(dict(b=8, hq=32, hkv=8, sq=4096, skv=4096, d=128, causal=True))
    out.append(dict(b=8, hq=32, hkv=8, sq=1, skv=32768, d=128, causal=False))
    out.append(dict(b=8, hq=32, hkv=8, sq=16, skv=32768, d=128, causal=False))
    return out


def case_name(c):
    h = f"H{c['hq']}" + (f"x{c['hkv']}" if c["hkv"] != c["hq"] else "")
    return (f"B{c['b']}_{h}_Sq{c['sq']}_Skv{c['skv']}_D{c['d']}"
            + ("_causal" if c["causal"] else ""))


def sdpa_call(backend, q, k, v, causal):
    gqa = q.shape[1] != k.shape[1]

    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    try:
        out = call()
        torch.cuda.synchronize()
        return call, out, ""
    except Exception as e:  # backend refuses this shape: try with K/V expanded
        if not gqa:
            return None, None, str(e).splitlines()[0][:120]
    rep = q.shape[1] // k.shape[1]
    ke = k.repeat_interleave(rep, dim=1)
    ve = v.repeat_interleave(rep, dim=1)

    def call_expanded():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)

    try:
        out = call_expanded()
        torch.cuda.synchronize()
        call_expanded.keep = (ke, ve)
        return call_expanded, out, "kv expanded to Hq heads"
    except Exception as e:
        return None, None, str(e).splitlines()[0][:120]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--filter", default="")
    args = ap.parse_args()
    ours = Ours(args.lib)
    variants = [v for v in ours.variants() if v != "reference"]
    iters, reps = (5, 3) if args.quick else (20, 7)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    rows = []
    print(f"GPU: {props.name}  torch {torch.__version__}")
    print(f"{'case':38s} {'impl':14s} {'ms':>9s} {'TFLOP/s':>8s} {'xFA2':>6s} {'xcuDNN':>6s}  note")
    for c in configs():
        name = case_name(c)
        if args.filter and args.filter not in name:
            continue
        torch.manual_seed(len(rows) + 1)
        q = torch.randn(c["b"], c["hq"], c["sq"], c["d"], device=dev, dtype=torch.bfloat16)
        k = torch.randn(c["b"], c["hkv"], c["skv"], c["d"], device=dev, dtype=torch.bfloat16)
        v = torch.randn(c["b"], c["hkv"], c["skv"], c["d"], device=dev, dtype=torch.bfloat16)
        # torch's is_causal is aligned top-left; ours bottom-right. They agree
        # when sq == skv, the only causal configurations here.
        assert not c["causal"] or c["sq"] == c["skv"]
        flops = 4.0 * c["b"] * c["hq"] * c["sq"] * c["skv"] * c["d"] * (0.5 if c["causal"] else 1.0)
        vendor_ms = {}
        ref_out = None
        for label, backend in (("sdpa_fa2", SDPBackend.FLASH_ATTENTION),
                               ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
            fn, out, note = sdpa_call(backend, q, k, v, c["causal"])
            if fn is None:
                print(f"{name:38s} {label:14s} {'-':>9s} refused: {note}")
                rows.append(dict(case=name, impl=label, ms=None, note=note))
                continue
            if ref_out is None:
                ref_out = out
            ms = time_ms(fn, iters, reps)
            vendor_ms[label] = ms
            err = (out.float() - ref_out.float()).abs().max().item()
            tf = flops / ms / 1e9
            print(f"{name:38s} {label:14s} {ms:9.4f} {tf:8.1f} {'':>6s} {'':>6s}  {note} maxerr {err:.3g}")
            rows.append(dict(case=name, impl=label, ms=ms, tflops=tf, max_abs_err=err, note=note))
        for variant in variants + [""]:
            o = torch.empty_like(q)
            lse = torch.empty(c["b"], c["hq"], c["sq"], device=dev, dtype=torch.float32)
            fn, why = ours.make_call(q, k, v, o, lse, c["causal"], variant)
            label = variant or "default"
            if fn is None:
                print(f"{name:38s} {label:14s} {'-':>9s} refused: {why}")
                continue
            fn()
            torch.cuda.synchronize()
            err = (o.float() - ref_out.float()).abs().max().item() if ref_out is not None else float("nan")
            ms = time_ms(fn, iters, reps)
            tf = flops / ms / 1e9
            r_fa2 = vendor_ms["sdpa_fa2"] / ms if "sdpa_fa2" in vendor_ms else None
            r_cudnn = vendor_ms["sdpa_cudnn"] / ms if "sdpa_cudnn" in vendor_ms else None
            ok = err < 0.05 if not math.isnan(err) else None
            fmt = lambda r: f"{r:6.3f}" if r is not None else f"{'-':>6s}"
            print(f"{name:38s} {label:14s} {ms:9.4f} {tf:8.1f} {fmt(r_fa2)} {fmt(r_cudnn)}  "
                  f"maxerr {err:.3g}{'' if ok in (True, None) else ' WRONG'}")
            rows.append(dict(case=name, impl=label, ms=ms, tflops=tf, ratio_fa2=r_fa2,
                             ratio_cudnn=r_cudnn, max_abs_err=err, correct=ok))
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=props.name, torch=torch.__version__,
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           command=" ".join(sys.argv), rows=rows), f, indent=1)
    # Summary: the default version against both backends, per configuration.
    print("\nsummary (default version): case  TFLOP/s  xFA2  xcuDNN")
    for r in rows:
        if r["impl"] == "default":
            print(f"  {r['case']:38s} {r['tflops']:7.1f} "
                  f"{r['ratio_fa2'] if r['ratio_fa2'] is not None else float('nan'):6.3f} "
                  f"{r['ratio_cudnn'] if r['ratio_cudnn'] is not None else float('nan'):6.3f}")


if __name__ == "__main__":
    main()
