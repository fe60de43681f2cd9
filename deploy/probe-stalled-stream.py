#!/usr/bin/python3
"""A Batch stream whose client never reads, and another client beside it.

Starts the server (--max_inflight_bytes=256 MiB, plus the other flags
given), opens a Batch stream on a connection of its own, sends two 64 MiB
float32 transposes, half-closes and reads nothing: the reproduction of
issue 15. Meanwhile a second client calls a 64x64x64 GEMM with a 1 s deadline
every 100 ms. Prints, per second, how many of those calls succeeded and the
gpucompute_inflight_bytes gauge, then when the first succeeded and when the
server ended the stalled stream.

  deploy/probe-stalled-stream.py build/cpu/server/gpucompute-server [--seconds=40] \
      [--stalled_stream_timeout=30s ...]

Needs Debian's python3-grpcio and python3-protobuf (/usr/bin/python3).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import grpc  # noqa: E402
from gpucompute.v1 import compute_pb2 as pb  # noqa: E402
from gpucompute.v1 import compute_pb2_grpc as pb_grpc  # noqa: E402

SIDE = 4096  # 4096 x 4096 float32: 64 MiB
OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def metric(port, name, labels=()):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ " and all(l in line for l in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("--seconds", type=float, default=40)
    args, flags = parser.parse_known_args()  # the rest are the server's

    ready = os.path.join(tempfile.mkdtemp(), "ready.json")
    server = subprocess.Popen([args.server, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                               f"--ready_file={ready}", "--max_inflight_bytes=268435456",
                               *flags], stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if os.path.exists(ready):
                break
            time.sleep(0.1)
        ports = json.load(open(ready))
        target = f"127.0.0.1:{ports['grpc_port']}"
        mport = ports["metrics_port"]

        item = pb.BatchRequest(transpose=pb.TransposeRequest(
            input=pb.Tensor(dtype=pb.FLOAT32, shape=[SIDE, SIDE], data=bytes(SIDE * SIDE * 4))))
        items = []
        for i in range(2):
            copy = pb.BatchRequest()
            copy.CopyFrom(item)
            copy.id = f"large-{i}"
            items.append(copy)
        stalled_channel = grpc.insecure_channel(target, options=OPTIONS)
        # The answers are never read (no next() on the call).
        stalled = pb_grpc.ComputeStub(stalled_channel).Batch(iter(items), timeout=600)

        while metric(mport, "gpucompute_requests_total",
                     ['method="Batch/Transpose"', 'code="OK"']) < 2:
            time.sleep(0.01)
        start = time.monotonic()
        print(f"both answers computed; inflight bytes {metric(mport, 'gpucompute_inflight_bytes'):.0f}")

        stub = pb_grpc.ComputeStub(grpc.insecure_channel(target, options=OPTIONS))
        small = pb.Tensor(dtype=pb.FLOAT32, shape=[64, 64], data=bytes(64 * 64 * 4))
        gemm = pb.GemmRequest(a=small, b=small)
        ended_at = None
        first_ok = None
        per_second = {}
        while time.monotonic() - start < args.seconds:
            t = time.monotonic() - start
            try:
                stub.Gemm(gemm, timeout=1)
                ok = True
                first_ok = t if first_ok is None else first_ok
            except grpc.RpcError:
                ok = False
            second = int(t)
            calls, oks, _ = per_second.get(second, (0, 0, 0))
            per_second[second] = (calls + 1, oks + ok, metric(mport, "gpucompute_inflight_bytes"))
            if ended_at is None and metric(mport, "gpucompute_requests_total",
                                           ['method="Batch"', 'code="RESOURCE_EXHAUSTED"']) >= 1:
                ended_at = time.monotonic() - start
            time.sleep(0.1)
        print("second  gemm_ok/calls  inflight_bytes")
        for second, (calls, oks, inflight) in sorted(per_second.items()):
            print(f"{second:6d}  {oks:4d}/{calls:<4d}     {inflight:.0f}")
        total = sum(c for c, _, _ in per_second.values())
        oks = sum(o for _, o, _ in per_second.values())
        print(f"GEMMs OK: {oks} of {total}; first OK at "
              f"{'never' if first_ok is None else f'{first_ok:.2f} s'}; stalled stream ended by the "
              f"server at {'never' if ended_at is None else f'{ended_at:.1f} s'} "
              f"(within {args.seconds:.0f} s)")
        stalled.cancel()
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
