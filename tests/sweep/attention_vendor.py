#!/usr/bin/env python3
"""Adds PyTorch's attention times (cuDNN and FlashAttention-2) to a
gc_sweep_attention results file and summarises it against the targets.

    attention_vendor.py SWEEP.json [--out MERGED.json] [--md TABLE.md]
                        [--reps N] [--filter SUBSTR] [--cooldown_ms N]

For every row of the sweep, makes fresh q [B,Hq,Sq,D] and k, v [B,Hkv,Skv,D]
of the row's dtype and times torch.nn.functional.scaled_dot_product_attention
with one backend enabled at a time (SDPBackend.CUDNN_ATTENTION, then
SDPBackend.FLASH_ATTENTION), under torch.inference_mode(), with CUDA events
and the GPU kept busy by a sleep kernel queued first, so that only the
kernels' device time counts (PyTorch's host overhead is not charged to it).
The median of --reps runs is kept (3 runs when one takes over 20 ms).
--cooldown_ms lets the GPU idle that long before each backend's timing, as
gc_sweep_attention's flag of the same name does before each of ours.

The vendor runs the same problem as ours: default scale 1/sqrt(D),
enable_gqa=True when Hq != Hkv, and our causal mask, aligned to the bottom
right (query i sees key j iff j <= i + Skv - Sq):
  Sq == Skv  is_causal=True;
  Sq == 1    no mask (the one query sees every key);
  Sq <  Skv  FA2: attn_mask=causal_lower_right(Sq, Skv), which PyTorch runs as
             the flash kernel's own bottom-right causal mask; cuDNN: the same
             mask built once as an additive tensor (what causal_lower_right
             would build on every call once flash is disabled); the note says
             so;
  Sq >  Skv  not timed (the leading queries see no key at all), noted.
A backend that refuses a shape gets a null time and the reason in
"vendor_note"; the run goes on. PyTorch's call returns no log-sum-exp, so
rows with "lse" ask more of us than of the vendor.

Each row gains cudnn_s, fa2_s, vendor_s (the faster), vendor ("cudnn", "fa2"
or ""), vendor_note, ratio = vendor_s / ours_s (> 1: we are faster),
own_best_s (the fastest of our versions forced by name), own_best (its name)
and own_ratio = vendor_s / own_best_s, and where NVML answers cudnn_sm_mhz and
fa2_sm_mhz (the SM clock after each timing, beside the sweep's own sm_mhz and
clock_events); the header gains torch, cudnn,
vendor_date and vendor_reps. Rows whose ours_s <= 0 or ok is false count as
failures and stay out of the ratios.

Prints the 15 worst rows, a summary by class and the headline figures against
the targets (ratio >= 1.0 in 90% of cases, geomean >= 1.05, min >= 0.85, and
ours_s(D=96) / ours_s(D=128) <= 1.2 for rows that differ only in head_dim).
--filter times and reports only the rows whose "class shape dtype" contains
SUBSTR; --out keeps every row. Without torch (or without a GPU) it only
summarises the rows as they are, using any vendor times already in them.
"""
import argparse
import datetime
import json
import math
import statistics
import sys
import time
import warnings

SLOW_S = 20e-3  # a run longer than this is timed 3 times only
LARGE_BYTES = 8 << 30  # cached memory above this is returned between rows
TARGET_SHARE, TARGET_GEOMEAN, TARGET_MIN, TARGET_D96 = 0.90, 1.05, 0.85, 1.2
PAIR_FIELDS = ("batch", "heads_q", "heads_kv", "seq_q", "seq_kv", "causal", "lse", "dtype")


def device_time(torch, fn, reps):
    """Median device seconds of fn(). The first call (plans, lazy loading) is a
    warm-up; if the next one takes over SLOW_S, 3 runs in all, else 2 more
    warm-ups and `reps` runs."""
    def once():
        torch.cuda._sleep(1_000_000)
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e-3

    fn()
    torch.cuda.synchronize()
    first = once()
    if first > SLOW_S:
        return statistics.median([first, once(), once()])
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    return statistics.median([once() for _ in range(reps)])


class GpuClock:
    """The SM clock of CUDA device 0 through NVML (libnvidia-ml.so.1, by
    ctypes), read after each timing as the C++ sweep does (gpu_clocks.h):
    a row slowed by a GPU that ran slower shows it. sm_mhz() is None without
    NVML."""

    def __init__(self, torch):
        import ctypes
        self._lib = self._device = None
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            props = torch.cuda.get_device_properties(0)
            device = ctypes.c_void_p()
            if hasattr(props, "pci_bus_id"):
                bus = "%x:%x:%x.0" % (getattr(props, "pci_domain_id", 0), props.pci_bus_id,
                                      props.pci_device_id)
                found = lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(device))
            else:  # an older torch: NVML's first GPU, device 0 on a host of one
                found = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(device))
            if found != 0:
                return
            self._lib, self._device, self._ctypes = lib, device, ctypes
        except (OSError, AttributeError):
            pass

    def sm_mhz(self):
        if self._lib is None:
            return None
        value = self._ctypes.c_uint()
        if self._lib.nvmlDeviceGetClockInfo(self._device, 1, self._ctypes.byref(value)) != 0:
            return None  # 1: NVML_CLOCK_SM
        return value.value


def short_reason(caught, err):
    """The reasons PyTorch gave (its warnings) for refusing, else the error."""
    reasons = []
    for w in caught:
        text = str(w.message).split(" (Triggered internally")[0].strip()
        if not text or text.endswith("not used because:") or "runtime disabled" in text:
            continue
        if text not in reasons:
            reasons.append(text)
    if not reasons:
        lines = str(err).strip().splitlines()
        reasons = [f"{type(err).__name__}: {lines[0] if lines else ''}"]
    text = "; ".join(reasons)
    return text if len(text) <= 160 else text[:157] + "..."


def time_backend(torch, sdpa_kernel, backend, fn, reps, cooldown_ms=0):
    """(seconds, "") or (None, reason) for fn() with only `backend` enabled."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                if cooldown_ms > 0:
                    torch.cuda.synchronize()
                    time.sleep(cooldown_ms * 1e-3)
                return device_time(torch, fn, reps), ""
        except Exception as err:  # a refused shape, out of memory, ...
            reason = short_reason(caught, err)
    try:
        torch.cuda.synchronize()
    except Exception:
        pass
    torch.cuda.empty_cache()
    return None, reason


def row_text(row):
    return f"{row.get('class', '')} {row.get('shape', '')} {row.get('dtype', '')}"


def time_row(torch, row, reps, clock=None, cooldown_ms=0):
    """Sets the row's cudnn_s, fa2_s and vendor_note, and with `clock` (a
    GpuClock) cudnn_sm_mhz and fa2_sm_mhz, the SM clock after each timing."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    row["cudnn_s"], row["fa2_s"] = None, None
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}
    if row["dtype"] not in dtypes:
        row["vendor_note"] = f"dtype {row['dtype']} not timed"
        return
    b, hq, hkv = row["batch"], row["heads_q"], row["heads_kv"]
    sq, skv, d = row["seq_q"], row["seq_kv"], row["head_dim"]
    causal = bool(row["causal"])
    if causal and sq > skv:
        row["vendor_note"] = "causal with seq_q > seq_kv: no vendor equivalent"
        return
    dt = dtypes[row["dtype"]]
    notes = []
    extra = {"enable_gqa": True} if hq != hkv else {}
    try:
        q = torch.randn((b, hq, sq, d), device="cuda", dtype=dt)
        k = torch.randn((b, hkv, skv, d), device="cuda", dtype=dt)
        v = torch.randn((b, hkv, skv, d), device="cuda", dtype=dt)
        if not causal or sq == 1:
            fa2_args = cudnn_args = dict(extra)
        elif sq == skv:
            fa2_args = cudnn_args = dict(extra, is_causal=True)
        else:
            fa2_args = dict(extra, attn_mask=causal_lower_right(sq, skv))
            visible = torch.ones((sq, skv), device="cuda", dtype=torch.bool).tril(skv - sq)
            bias = torch.zeros((1, 1, sq, skv), device="cuda", dtype=dt)
            bias.masked_fill_(~visible, float("-inf"))
            cudnn_args = dict(extra, attn_mask=bias)
            del visible, bias
            notes.append("cudnn: explicit mask")
    except Exception as err:  # out of memory
        row["vendor_note"] = f"inputs not made: {type(err).__name__}"
        torch.cuda.empty_cache()
        return
    for key, backend, args in (("cudnn_s", SDPBackend.CUDNN_ATTENTION, cudnn_args),
                               ("fa2_s", SDPBackend.FLASH_ATTENTION, fa2_args)):
        fn = lambda: F.scaled_dot_product_attention(q, k, v, **args)
        seconds, reason = time_backend(torch, sdpa_kernel, backend, fn, reps, cooldown_ms)
        row[key] = seconds
        mhz = clock.sm_mhz() if clock is not None else None
        if mhz is not None:
            row[key[:-2] + "_sm_mhz"] = mhz
        if seconds is None:
            notes.append(f"{key[:-2]}: {reason}")
    row["vendor_note"] = " | ".join(notes)


def add_vendor(data, rows, reps, cooldown_ms=0):
    """Times the rows with PyTorch; False when torch or a GPU is missing."""
    try:
        import torch
    except ImportError:
        print("no torch: summarising the rows as they are", file=sys.stderr)
        return False
    if not torch.cuda.is_available():
        print("torch has no GPU: summarising the rows as they are", file=sys.stderr)
        return False
    data["torch"] = torch.__version__
    data["cudnn"] = torch.backends.cudnn.version()
    data["vendor_date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    data["vendor_reps"] = reps
    data["vendor_cooldown_ms"] = cooldown_ms
    clock = GpuClock(torch)
    with torch.inference_mode():
        for i, row in enumerate(rows):
            time_row(torch, row, reps, clock, cooldown_ms)  # its tensors are freed on return
            if torch.cuda.memory_reserved() > LARGE_BYTES:
                torch.cuda.empty_cache()
            clocks = [f"{name} {row[key]}" for name, key in (
                ("ours", "sm_mhz"), ("cudnn", "cudnn_sm_mhz"), ("fa2", "fa2_sm_mhz")) if key in row]
            mhz = f" (SM MHz: {', '.join(clocks)})" if clocks else ""
            print(f"[{i + 1}/{len(rows)}] {row_text(row)}: cudnn {us(row['cudnn_s'])} us, "
                  f"fa2 {us(row['fa2_s'])} us {row['vendor_note']}{mhz}", file=sys.stderr)
    return True


def us(seconds):
    return f"{seconds * 1e6:.1f}" if seconds is not None and seconds > 0 else "-"


def ratio_text(x):
    return f"{x:.3f}" if x is not None and not math.isnan(x) else "-"


def failed(row):
    return not (row.get("ours_s", -1) > 0) or row.get("ok", True) is False


def enrich(row):
    """Derives the vendor, the ratios and our best forced version."""
    timed = {name: row.get(f"{name}_s") for name in ("cudnn", "fa2")}
    timed = {name: s for name, s in timed.items() if s is not None and s > 0}
    if timed:
        row["vendor"] = min(timed, key=timed.get)
        row["vendor_s"] = timed[row["vendor"]]
    elif "cudnn_s" in row or "fa2_s" in row:
        row["vendor"], row["vendor_s"] = "", None
    else:
        v = row.get("vendor_s")
        row["vendor_s"] = v if v is not None and v > 0 else None
        row["vendor"] = row.get("vendor") or ""
    row.setdefault("vendor_note", "")
    own = {name: s for name, s in (row.get("forced") or {}).items() if s is not None and s > 0}
    row["own_best"] = min(own, key=own.get) if own else ""
    row["own_best_s"] = own[row["own_best"]] if own else None
    v = row["vendor_s"]
    ok = not failed(row)
    row["ratio"] = v / row["ours_s"] if (v and ok) else None
    row["own_ratio"] = v / row["own_best_s"] if (v and row["own_best_s"] and ok) else None


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def class_stats(rs):
    xs = [r for r in rs if r["ratio"] is not None]
    ratios = [r["ratio"] for r in xs]
    worst = min(xs, key=lambda r: r["ratio"]) if xs else None
    return {
        "rows": len(rs), "cases": len(ratios), "geomean": geomean(ratios),
        "min": worst["ratio"] if worst else None,
        "min_shape": f"{worst.get('shape', '')} {worst['dtype']}" if worst else "",
        "min_case": row_text(worst) if worst else "",
        "ge1": sum(x >= 1.0 for x in ratios), "ge085": sum(x >= 0.85 for x in ratios),
        "own": geomean([r["own_ratio"] for r in rs if r["own_ratio"] is not None]),
    }


def by_class(rows):
    groups = {}
    for r in rows:
        groups.setdefault(r.get("class", ""), []).append(r)
    out = [(cls, class_stats(rs)) for cls, rs in sorted(groups.items())]
    return out + [("(all)", class_stats(rows))]


def d96_pairs(rows):
    """(label, ours 96 s, ours 128 s) for the shapes timed at both head dims
    (the fastest row of each when a shape appears in several classes)."""
    best = {}
    for r in rows:
        if failed(r) or r.get("head_dim") not in (96, 128):
            continue
        key = tuple(r.get(f) for f in PAIR_FIELDS)
        slot = best.setdefault(key, {})
        d = r["head_dim"]
        slot[d] = min(slot.get(d, r["ours_s"]), r["ours_s"])
    pairs = []
    for key, slot in best.items():
        if 96 in slot and 128 in slot:
            b, hq, hkv, sq, skv, causal, lse, dtype = key
            label = (f"B{b} H{hq}/{hkv} S{sq}x{skv}{' causal' if causal else ''}"
                     f"{' lse' if lse else ''} {dtype}")
            pairs.append((label, slot[96], slot[128]))
    return sorted(pairs)


def worst_lines(rows, n=15):
    ranked = sorted((r for r in rows if r["ratio"] is not None), key=lambda r: r["ratio"])[:n]
    if not ranked:
        return ["no row has both our time and a vendor time"]
    cw = max(5, max(len(r.get("class", "")) for r in ranked))
    sw = min(44, max(5, max(len(r.get("shape", "")) for r in ranked)))
    vw = max(7, max(len(r.get("variant", "")) for r in ranked))
    lines = [f"{len(ranked)} worst by vendor/ours:",
             f"  {'class':<{cw}} {'shape':<{sw}} dtype {'variant':<{vw}} {'ours us':>9} "
             f"{'vendor us':>9} vendor {'ratio':>6}  SM MHz ours/vendor"]
    for r in ranked:
        mhz = f"{r['sm_mhz']}/{r.get(r['vendor'] + '_sm_mhz', '-')}" if "sm_mhz" in r else ""
        if r.get("clock_events"):
            mhz += f" ({r['clock_events']})"
        lines.append(f"  {r.get('class', ''):<{cw}} {r.get('shape', '')[:sw]:<{sw}} {r['dtype']:<5} "
                     f"{r.get('variant', ''):<{vw}} {us(r['ours_s']):>9} {us(r['vendor_s']):>9} "
                     f"{r['vendor']:<6} {r['ratio']:>6.3f}  {mhz}".rstrip())
    return lines


def summary_lines(rows):
    stats = by_class(rows)
    cw = max(7, max(len(cls) for cls, _ in stats))
    sw = min(44, max(7, max(len(s["min_shape"]) for _, s in stats)))
    lines = ["", "by class (ratio = vendor / ours, > 1: we are faster; own = vendor / our best forced):",
             f"  {'class':<{cw}} {'cases':>5} {'geomean':>7} {'min':>6} {'(shape)':<{sw}} "
             f"{'>=1.0':>7} {'>=0.85':>7} {'own':>6}"]
    for cls, s in stats:
        lines.append(f"  {cls:<{cw}} {s['cases']:>5} {ratio_text(s['geomean']):>7} "
                     f"{ratio_text(s['min']):>6} {s['min_shape'][:sw]:<{sw}} "
                     f"{s['ge1']:>3}/{s['cases']:<3} {s['ge085']:>3}/{s['cases']:<3} {ratio_text(s['own']):>6}")
    total = stats[-1][1]

    def verdict(good):
        return "met" if good else "MISSED"

    n = total["cases"]
    share = total["ge1"] / n if n else float("nan")
    lines.append("")
    if n:
        lines.append(f"ratio >= 1.0: {total['ge1']}/{n} = {100 * share:.1f}%  "
                     f"(target {100 * TARGET_SHARE:.0f}%: {verdict(share >= TARGET_SHARE)})")
        lines.append(f"geomean:      {total['geomean']:.3f}  "
                     f"(target {TARGET_GEOMEAN}: {verdict(total['geomean'] >= TARGET_GEOMEAN)})")
        lines.append(f"min:          {total['min']:.3f} at {total['min_case']}  "
                     f"(target {TARGET_MIN}: {verdict(total['min'] >= TARGET_MIN)})")
    else:
        lines.append("no case has a ratio: the targets cannot be judged")
    pairs = d96_pairs(rows)
    if pairs:
        worst = max(o96 / o128 for _, o96, o128 in pairs)
        lines.append(f"ours D96/D128: {len(pairs)} pairs, max {worst:.3f}  "
                     f"(target <= {TARGET_D96}: {verdict(worst <= TARGET_D96)})")
        for label, o96, o128 in pairs:
            x = o96 / o128
            lines.append(f"  {label}: {us(o96)} / {us(o128)} us = {x:.3f}"
                         f"{'' if x <= TARGET_D96 else '  over'}")
    else:
        lines.append("ours D96/D128: no pair of rows differing only in head_dim 96 / 128")
    fails = [r for r in rows if failed(r)]
    if fails:
        names = [row_text(r) + ("" if r.get("ours_s", -1) > 0 else " (no time)") for r in fails]
        shown = names[:10] + ([f"... and {len(names) - 10} more"] if len(names) > 10 else [])
        lines.append(f"failures (ours_s <= 0 or not ok, out of the ratios): {len(fails)}: " + "; ".join(shown))
    else:
        lines.append("failures: none")
    return lines


def md_lines(data, rows):
    head = [f"{k}: {data[k]}" for k in ("gpu", "date", "torch", "cudnn", "vendor_date") if k in data]
    out = ["; ".join(head)]
    if "command" in data:
        out.append(f"\ncommand: `{data['command']}`")
    out += ["", "x vendor = the faster of cuDNN and FA2 (PyTorch SDPA) / ours; > 1: we are faster. "
            "best own: the fastest of our versions forced by name.", "",
            "| class | shape | dtype | variant (ours) | ours µs | cuDNN µs | FA2 µs | × vendor "
            "| best own µs | TFLOP/s ours |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ours = us(r["ours_s"]) if not failed(r) else "failed" + (
            f" ({us(r['ours_s'])})" if r.get("ours_s", -1) > 0 else "")
        vendor = {r["vendor"]: r["vendor_s"]} if r["vendor_s"] else {}
        own = f"{us(r['own_best_s'])} ({r['own_best']})" if r["own_best_s"] else "-"
        tf = f"{r['flops'] / r['ours_s'] / 1e12:.1f}" if (not failed(r) and r.get("flops")) else "-"
        out.append(f"| {r.get('class', '')} | {r.get('shape', '')} | {r['dtype']} | {r.get('variant', '')} "
                   f"| {ours} | {us(r.get('cudnn_s', vendor.get('cudnn')))} "
                   f"| {us(r.get('fa2_s', vendor.get('fa2')))} | {ratio_text(r['ratio'])} "
                   f"| {own} | {tf} |")
    out += ["", "| class | cases | geomean × vendor | min | at | ≥ 1.0 | ≥ 0.85 | geomean × own best |",
            "|---|---|---|---|---|---|---|---|"]
    for cls, s in by_class(rows):
        out.append(f"| {cls} | {s['cases']} | {ratio_text(s['geomean'])} | {ratio_text(s['min'])} "
                   f"| {s['min_shape']} | {s['ge1']}/{s['cases']} | {s['ge085']}/{s['cases']} "
                   f"| {ratio_text(s['own'])} |")
    notes = {}
    for r in rows:
        for note in r["vendor_note"].split(" | "):
            if note.strip():
                notes[note.strip()] = notes.get(note.strip(), 0) + 1
    if notes:
        out += ["", "Vendor notes (rows):", ""]
        out += [f"- {note} ({count})" for note, count in sorted(notes.items(), key=lambda kv: -kv[1])]
    out += ["", "```"] + summary_lines(rows)[1:] + ["```"]
    return out


def write_json(path, data):
    """The header indented, the rows one per line."""
    with open(path, "w") as f:
        f.write("{\n")
        for key, value in data.items():
            if key != "rows":
                f.write(f" {json.dumps(key)}: {json.dumps(value)},\n")
        f.write(' "rows": [\n')
        f.write(",\n".join("  " + json.dumps(r) for r in data["rows"]))
        f.write("\n ]\n}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", help="gc_sweep_attention's JSON output")
    ap.add_argument("--out", help="writes the merged JSON here")
    ap.add_argument("--md", help="writes the markdown table here")
    ap.add_argument("--reps", type=int, default=20, help="timed runs per backend and row")
    ap.add_argument("--filter", help="only the rows whose 'class shape dtype' contains this")
    ap.add_argument("--cooldown_ms", type=int, default=0,
                    help="the GPU idles this long before each backend's timing")
    args = ap.parse_args()
    with open(args.sweep) as f:
        data = json.load(f)
    rows = [r for r in data["rows"] if not args.filter or args.filter in row_text(r)]
    add_vendor(data, rows, args.reps, args.cooldown_ms)
    for row in data["rows"]:
        enrich(row)
    if args.out:
        write_json(args.out, data)
    if args.md:
        with open(args.md, "w") as f:
            f.write("\n".join(md_lines(data, rows)) + "\n")
    print("\n".join(worst_lines(rows) + summary_lines(rows)))


if __name__ == "__main__":
    main()
