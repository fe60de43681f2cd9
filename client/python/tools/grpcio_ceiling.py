"""What grpcio itself allows on a host, beside what this client gets: the bounds that the
client's throughput and small-call figures (RESULTS.md) are read against.

    PYTHONPATH=client/python python3 client/python/tools/grpcio_ceiling.py \
        --server=127.0.0.1:50051 [--mib=1024] [--procs=1,4,8,12] [--chunks=1,4,16]

- small: p50 of a 64^3 fp32 GEMM sent as ready bytes through a bare grpcio channel (no
  options, no metadata), against Client.gemm on the same arrays.
- upload / download: P processes at once, each one stream of its part of a 1 GiB tensor in
  chunks of C MiB. Upload messages are built before the clock starts (grpcio's own copy of
  each message is all that is timed beside the wire); download messages are counted and
  dropped. Total bytes over the time from the first stream's start to the last one's end,
  median of 3.
- client: the same transfers through Client(transfer_processes=P) (P = 1: threads).

Transfers stay resident on the server only while measured; every handle is freed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any, List, Tuple

import numpy as np

_UPLOAD = "/gpucompute.v1.Compute/Upload"
_DOWNLOAD = "/gpucompute.v1.Compute/Download"
_GEMM = "/gpucompute.v1.Compute/Gemm"
_OPTIONS = [("grpc.max_send_message_length", 1 << 30),
            ("grpc.max_receive_message_length", 1 << 30)]


def _upload_part(server: str, header: bytes, part: Tuple[int, int], chunk: int,
                 barrier: Any, out: Any) -> None:
    import grpc

    from gpucompute import _transfer

    data = memoryview(np.zeros(part[1], np.uint8))  # offsets are the tensor's
    messages = list(_transfer.upload_messages(header, data, part, chunk))
    channel = grpc.insecure_channel(server, options=_OPTIONS)
    call = channel.stream_unary(_UPLOAD)
    barrier.wait()
    began = time.monotonic()
    call(iter(messages), timeout=120)
    out.put((began, time.monotonic()))
    channel.close()


def _download_part(server: str, handle: str, part: Tuple[int, int], chunk: int,
                   barrier: Any, out: Any) -> None:
    import grpc

    from gpucompute import _transfer

    channel = grpc.insecure_channel(server, options=_OPTIONS)
    call = channel.unary_stream(_DOWNLOAD)
    request = _transfer.download_request(handle, part[0], part[1] - part[0], chunk)
    for _ in call(request, timeout=120):  # once untimed: the connection is up after
        pass
    barrier.wait()
    began = time.monotonic()
    for _ in call(request, timeout=120):
        pass
    out.put((began, time.monotonic()))
    channel.close()


def bare_transfer(kind: str, server: str, client: Any, x: np.ndarray, procs: int,
                  chunk: int, repeats: int = 3) -> float:
    """GB/s of `procs` bare grpcio processes moving x's bytes (kind 'upload' or 'download')."""
    from gpucompute import _transfer
    from gpucompute._channel import split_transfer
    from gpucompute._tensors import operand

    context = mp.get_context("spawn")  # no grpcio state crosses a fork
    parts = split_transfer(x.nbytes, procs, 0)
    handle = client.upload(x).handle if kind == "download" else ""
    rates: List[float] = []
    try:
        for _ in range(repeats):
            barrier, out = context.Barrier(len(parts)), context.Queue()
            if kind == "upload":
                headers = _transfer.upload_headers(operand(x, "x"), parts, None)
                jobs = [(_upload_part, (server, headers[i], parts[i], chunk, barrier, out))
                        for i in range(len(parts))]
            else:
                jobs = [(_download_part, (server, handle, parts[i], chunk, barrier, out))
                        for i in range(len(parts))]
            processes = [context.Process(target=f, args=a) for f, a in jobs]
            for p in processes:
                p.start()
            spans = [out.get(timeout=300) for _ in processes]
            for p in processes:
                p.join()
            rates.append(x.nbytes / (max(s[1] for s in spans) - min(s[0] for s in spans)) / 1e9)
            if kind == "upload":
                for t in client.list_tensors().tensors:
                    client.free(t.handle)
    finally:
        if handle:
            client.free(handle)
    return statistics.median(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--small", type=int, default=2000, help="timed 64^3 GEMMs")
    p.add_argument("--procs", default="1,4,8,12")
    p.add_argument("--chunks", default="1,4,16", help="chunk sizes, MiB")
    p.add_argument("--only", default="small,bare,client")
    args = p.parse_args()

    import grpc

    import gpucompute
    from gpucompute import ops
    from gpucompute._host_memory import keep_freed_host_memory
    from gpucompute.bench import _p50

    keep_freed_host_memory()
    only = args.only.split(",")
    procs = [int(v) for v in args.procs.split(",")]
    chunks = [int(v) for v in args.chunks.split(",")]
    client = gpucompute.Client(args.server, bfloat16="bits", transfer_processes=0)
    if "small" in only:
        a = np.random.default_rng(0).uniform(-1, 1, (64, 64)).astype(np.float32)
        request = ops.gemm(a, a).encode().join()
        channel = grpc.insecure_channel(args.server)
        bare = channel.unary_unary(_GEMM)
        for _ in range(2):
            t_bare = _p50(lambda: bare(request, timeout=60), args.small, 50)
            t_client = _p50(lambda: client.gemm(a, a), args.small, 50)
            print(f"small: 64^3 fp32 GEMM p50, bare grpcio {t_bare * 1e3:.4f} ms, "
                  f"Client.gemm {t_client * 1e3:.4f} ms", flush=True)
        channel.close()
    x = np.random.default_rng(1).integers(0, 2**16, (args.mib << 20) // 2, dtype=np.uint16)
    if "bare" in only:
        for kind in ("upload", "download"):
            for n in procs:
                for c in chunks:
                    rate = bare_transfer(kind, args.server, client, x, n, c << 20)
                    print(f"bare grpcio {kind:8} {n:2} processes, {c:2} MiB chunks: "
                          f"{rate:.3f} GB/s", flush=True)
    if "client" in only:
        for n in procs:
            for c in chunks:
                with gpucompute.Client(args.server, bfloat16="bits", streams=n, chunk_bytes=c << 20,
                                       transfer_processes=n if n > 1 else 0) as t:
                    up = _p50(lambda: t.free(t.upload(x)), 5, 1)
                    h = t.upload(x)
                    down = _p50(lambda: t.download(h), 5, 1)
                    t.free(h)
                print(f"client   {n:2} {'processes' if n > 1 else 'thread   '}, {c:2} MiB chunks: "
                      f"upload {x.nbytes / up / 1e9:.3f}, download {x.nbytes / down / 1e9:.3f} GB/s",
                      flush=True)
    client.close()


if __name__ == "__main__":
    main()
