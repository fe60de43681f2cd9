"""Throughput and small-call latency of the Python client, beside the C++ CLI's on the same
calls:

    python3 -m gpucompute.bench --server=localhost:50051 --cli=build/release/client/gpucompute

Each measurement runs the call --requests times one at a time (after --warmup untimed calls)
and reports the p50 latency; throughput is payload bytes (request plus response tensors, or
the transfer's bytes) over the p50. The CLI runs `gpucompute bench` on the same shapes with
the same counts. Like the CLI, the benchmark keeps freed host memory for reuse
(keep_freed_host_memory; --no-retain to measure without).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Callable, List, Optional, Tuple

import numpy as np

import gpucompute
from gpucompute._host_memory import keep_freed_host_memory


def _p50(fn: Callable[[], object], requests: int, warmup: int,
         after: Optional[Callable[[object], None]] = None) -> float:
    for _ in range(warmup):
        r = fn()
        if after:
            after(r)
    times: List[float] = []
    for _ in range(requests):
        t0 = time.perf_counter()
        r = fn()
        times.append(time.perf_counter() - t0)
        if after:
            after(r)
        del r
    return statistics.median(times)


def _cli_p50(cli: str, server: str, args: List[str], row: str) -> float:
    """p50 seconds of the `row` line of `gpucompute bench ...`."""
    out = subprocess.run([cli, "bench", *args, f"--server={server}"], check=True,
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] == row:
            return float(fields[2]) / 1e3
    raise RuntimeError(f"no {row!r} row in:\n{out}")


def _copies(n: int, repeats: int) -> None:
    """What building a request and reading a response of `n` tensor bytes costs in Python,
    through protobuf's bytes fields and through this client's splicing (no server)."""
    from gpucompute import _wire, ops
    from gpucompute.v1 import compute_pb2 as pb

    x = np.random.default_rng(0).integers(0, 2**16, n // 2, dtype=np.uint16)

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = fn()
            times.append(time.perf_counter() - t0)
            del r
        return min(times)

    def protobuf_request() -> bytes:
        return pb.EchoRequest(input=pb.Tensor(dtype=pb.BFLOAT16, shape=x.shape,
                                              data=x.tobytes())).SerializeToString()

    raw = pb.EchoResponse(output=pb.Tensor(dtype=pb.BFLOAT16, shape=x.shape,
                                           data=x.tobytes())).SerializeToString()

    def protobuf_response() -> np.ndarray:
        return np.frombuffer(pb.EchoResponse.FromString(raw).output.data, np.uint16)

    def spliced_response() -> np.ndarray:
        _, datas = _wire.strip(raw, {1: _wire.TENSOR})
        return np.frombuffer(datas[(1, 3)], np.uint16)

    cases = [
        ("one memcpy (bytes(memoryview(x)))", lambda: bytes(memoryview(x))),
        ("request via protobuf (Tensor(data=x.tobytes()), SerializeToString)", protobuf_request),
        ("request spliced (ops.echo(x).encode().join())", lambda: ops.echo(x).encode().join()),
        ("response via protobuf (FromString, .data, frombuffer)", protobuf_response),
        ("response spliced (_wire.strip, frombuffer)", spliced_response),
    ]
    print(f"copies: {n >> 20} MiB tensor, best of {repeats}")
    for name, fn in cases:
        t = best(fn)
        rate = f"{n / t / 1e9:7.2f} GB/s" if t > 1e-3 else "(no copy)"
        print(f"  {name:<70} {t * 1e3:9.1f} ms  {rate}", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", default="localhost:50051")
    p.add_argument("--cli", default="", help="path of the C++ CLI to compare with")
    p.add_argument("--echo_mib", type=int, default=512)
    p.add_argument("--gemm", type=int, default=8192, help="M = N = K of the large bf16 GEMM")
    p.add_argument("--transfer_mib", type=int, default=1024)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--transfer_processes", type=int, default=None,
                   help="the client's transfer_processes (0: threads; default: the client's "
                        "own default for this machine)")
    p.add_argument("--offload_min_bytes", type=int, default=64 << 20,
                   help="operations whose inline operands reach this many bytes go through "
                        "resident tensors (Python and CLI); 0: always one message")
    p.add_argument("--requests", type=int, default=5, help="timed calls of each large case")
    p.add_argument("--small_requests", type=int, default=2000, help="timed 64^3 GEMMs")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--only", default="echo,gemm,upload,download,small",
                   help="comma-separated cases (also: naive_echo, Echo through the generated "
                        "stub and protobuf's bytes fields; copies, the request and response "
                        "building costs without a server)")
    p.add_argument("--no-retain", action="store_true",
                   help="leave the allocator as it is (no keep_freed_host_memory)")
    args = p.parse_args(argv)
    if not args.no_retain:
        keep_freed_host_memory()
    cases = set(args.only.split(","))
    client = gpucompute.Client(args.server, default_timeout=args.timeout, streams=args.streams,
                               offload_min_bytes=args.offload_min_bytes, bfloat16="bits",
                               transfer_processes=args.transfer_processes)
    rng = np.random.default_rng(0)
    rows: List[Tuple[str, str, float, Optional[float], str]] = []
    cli_flags = [f"--timeout={int(args.timeout)}s", f"--streams={args.streams}",
                 f"--warmup={args.warmup}", f"--offload_min_bytes={args.offload_min_bytes}"]

    def add(name: str, unit: str, py: float, cli: Optional[float], note: str) -> None:
        rows.append((name, unit, py, cli, note))
        c = "" if cli is None else f"  cli {cli:.4g}"
        print(f"{name:<28} python {py:.4g}{c} {unit}", flush=True)

    if "echo" in cases:
        n = args.echo_mib << 20
        x = rng.integers(0, 2**16, n // 2, dtype=np.uint16)  # bfloat16 bits
        t = _p50(lambda: client.echo(x), args.requests, args.warmup)
        cli = None
        if args.cli:
            cli_t = _cli_p50(args.cli, args.server,
                             ["echo", f"--shape={n // 4}", f"--requests={args.requests}",
                              "--concurrency=1", *cli_flags], "echo")
            cli = 2 * n / cli_t / 1e9
        add(f"echo {args.echo_mib} MiB", "GB/s", 2 * n / t / 1e9, cli,
            "request + response bytes / p50")
    if "naive_echo" in cases:
        # What a client written by hand on the generated stub does: protobuf messages with
        # bytes fields (x.tobytes(), response.output.data).
        import grpc

        from gpucompute.v1 import compute_pb2 as pb
        from gpucompute.v1 import compute_pb2_grpc

        n = args.echo_mib << 20
        x = rng.integers(0, 2**16, n // 2, dtype=np.uint16)
        channel = grpc.insecure_channel(args.server, options=[
            ("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)])
        stub = compute_pb2_grpc.ComputeStub(channel)

        def naive() -> np.ndarray:
            r = stub.Echo(pb.EchoRequest(input=pb.Tensor(dtype=pb.BFLOAT16, shape=x.shape,
                                                         data=x.tobytes())),
                          timeout=args.timeout)
            return np.frombuffer(r.output.data, np.uint16)

        t = _p50(naive, args.requests, args.warmup)
        channel.close()
        add(f"echo {args.echo_mib} MiB, hand-written", "GB/s", 2 * n / t / 1e9, None,
            "generated stub, protobuf bytes fields")
    if "gemm" in cases:
        m = args.gemm
        a = gpucompute.float32_to_bfloat16(rng.uniform(-1, 1, (m, m)).astype(np.float32))
        b = gpucompute.float32_to_bfloat16(rng.uniform(-1, 1, (m, m)).astype(np.float32))
        t = _p50(lambda: client.gemm(a, b), args.requests, args.warmup)
        cli = None
        if args.cli:
            cli = _cli_p50(args.cli, args.server,
                           ["gemm", f"--m={m}", f"--n={m}", f"--k={m}", "--dtype=bfloat16",
                            f"--requests={args.requests}", "--concurrency=1",
                            "--echo_baseline=false", *cli_flags], "gemm") * 1e3
        offloaded = 0 < args.offload_min_bytes <= a.nbytes + b.nbytes
        add(f"gemm {m}^3 bf16 p50", "ms", t * 1e3, cli,
            "latency, " + ("offloaded" if offloaded else "one message"))
    if "upload" in cases or "download" in cases:
        n = args.transfer_mib << 20
        x = rng.integers(0, 2**16, n // 2, dtype=np.uint16)
        streams_note = f"{args.streams} streams"
        workers = client._transfer_workers  # as the client resolved transfer_processes
        if workers is not None:
            streams_note = f"{workers.count} processes; the CLI {streams_note}"
        if "upload" in cases:
            t = _p50(lambda: client.upload(x), args.requests, args.warmup,
                     after=lambda h: client.free(h))
            cli = None
            if args.cli:
                cli = n / _cli_p50(args.cli, args.server,
                                   ["upload", f"--bytes={n}", "--dtype=bfloat16",
                                    f"--requests={args.requests}", *cli_flags],
                                   "upload") / 1e9
            add(f"upload {args.transfer_mib} MiB", "GB/s", n / t / 1e9, cli, streams_note)
        if "download" in cases:
            h = client.upload(x)
            t = _p50(lambda: client.download(h), args.requests, args.warmup)
            client.free(h)
            cli = None
            if args.cli:
                cli = n / _cli_p50(args.cli, args.server,
                                   ["download", f"--bytes={n}", "--dtype=bfloat16",
                                    f"--requests={args.requests}", *cli_flags],
                                   "download") / 1e9
            add(f"download {args.transfer_mib} MiB", "GB/s", n / t / 1e9, cli, streams_note)
    if "small" in cases:
        a = rng.uniform(-1, 1, (64, 64)).astype(np.float32)
        t = _p50(lambda: client.gemm(a, a), args.small_requests, 50)
        cli = None
        if args.cli:
            cli = _cli_p50(args.cli, args.server,
                           ["gemm", "--m=64", "--n=64", "--k=64", "--dtype=float32",
                            f"--requests={args.small_requests}", "--concurrency=1",
                            "--echo_baseline=false", "--timeout=60s", "--warmup=50"],
                           "gemm") * 1e3
        add("gemm 64^3 fp32 p50", "ms", t * 1e3, cli, "concurrency 1")

    if "copies" in cases:
        _copies(args.echo_mib << 20, args.requests)

    if not rows:
        return 0
    print()
    print("| case | python | C++ CLI | python / CLI |")
    print("|---|---|---|---|")
    for name, unit, py, cli, note in rows:
        if cli is None:
            ratio = ""
        elif unit == "ms":
            ratio = f"x{cli / py:.2f} speed ({py - cli:+.3f} ms)"
        else:
            ratio = f"x{py / cli:.2f}"
        c = "" if cli is None else f"{cli:.4g} {unit}"
        print(f"| {name} ({note}) | {py:.4g} {unit} | {c} | {ratio} |")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
