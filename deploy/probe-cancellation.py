#!/usr/bin/python3
"""Work whose caller has gone, and SIGTERM with work in flight.

Starts the server (--cpu_devices=1 --shutdown_timeout=1s, plus the flags
given) and, on the default (OpenBLAS) GEMM variant:

1. sends four GEMMs of --side^3 float32 and cancels them once all four
   compute; then waits until the server has no request in flight and prints
   how many kernels it recorded, and how much CPU time it spent, after the
   cancellation.
2. sends four GEMMs of --big_side^3 float32, SIGTERMs the server once all
   four compute and prints how long it took to exit.

  deploy/probe-cancellation.py build/cpu/server/gpucompute-server [--side=4096] \
      [--big_side=4096]

Needs Debian's python3-grpcio and python3-protobuf (/usr/bin/python3).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import grpc  # noqa: E402
from gpucompute.v1 import compute_pb2 as pb  # noqa: E402
from gpucompute.v1 import compute_pb2_grpc as pb_grpc  # noqa: E402

OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in "{ ":
            total += float(line.rsplit(" ", 1)[1])
    return total


def gemm(side):
    rng = np.random.default_rng()
    request = pb.GemmRequest()
    for tensor in (request.a, request.b):
        tensor.dtype = pb.FLOAT32
        tensor.shape.extend([side, side])
        tensor.data = rng.random((side, side), dtype=np.float32).tobytes()
    return request


def start(server, flags):
    ready = os.path.join(tempfile.mkdtemp(), "ready.json")
    process = subprocess.Popen([server, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                f"--ready_file={ready}", "--cpu_devices=1",
                                "--shutdown_timeout=1s", *flags], stderr=subprocess.DEVNULL)
    for _ in range(300):
        if os.path.exists(ready):
            break
        time.sleep(0.1)
    with open(ready) as f:
        ports = json.load(f)
    return process, ports["grpc_port"], ports["metrics_port"]


def wait_for(done, seconds):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if done():
            return True
        time.sleep(0.005)
    return done()


def abandoned(args, flags):
    process, port, metrics = start(args.server, flags)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        stub = pb_grpc.ComputeStub(channel)
        request = gemm(args.side)
        calls = [stub.Gemm.future(request, timeout=120) for _ in range(4)]
        computing = wait_for(lambda: metric(metrics, "gpucompute_device_inflight_shards") >= 4, 60)
        for call in calls:
            call.cancel()
        left = time.monotonic()
        kernels = metric(metrics, "gpucompute_kernel_duration_seconds_count")
        cpu = metric(metrics, "process_cpu_seconds_total")
        wait_for(lambda: metric(metrics, "gpucompute_inflight_requests") == 0, 120)
        idle = time.monotonic() - left
        kernels_after = metric(metrics, "gpucompute_kernel_duration_seconds_count") - kernels
        cpu_after = metric(metrics, "process_cpu_seconds_total") - cpu
        print(f"cancelled: 4 GEMMs {args.side}^3 computing: {computing}, all four cancelled; "
              f"after that {kernels_after:.0f} kernels recorded, {cpu_after:.2f} s of server CPU, "
              f"no request in flight after {idle:.3f} s")
    finally:
        process.kill()
        process.wait()


def shutdown(args, flags):
    process, port, metrics = start(args.server, flags)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS)
        stub = pb_grpc.ComputeStub(channel)
        request = gemm(args.big_side)
        codes = []

        def call():
            try:
                stub.Gemm(request, timeout=120)
                codes.append("OK")
            except grpc.RpcError as e:
                codes.append(e.code().name)

        callers = [threading.Thread(target=call) for _ in range(4)]
        for t in callers:
            t.start()
        computing = wait_for(lambda: metric(metrics, "gpucompute_device_inflight_shards") >= 4, 60)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
        took = time.monotonic() - signalled
        for t in callers:
            t.join()
        print(f"shutdown: 4 GEMMs {args.big_side}^3 computing: {computing}; exit {code} "
              f"{took:.3f} s after SIGTERM (--shutdown_timeout=1s); calls: "
              f"{', '.join(sorted(codes))}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("--side", type=int, default=4096)
    parser.add_argument("--big_side", type=int, default=4096)
    args, flags = parser.parse_known_args()  # the rest are the server's
    abandoned(args, flags)
    shutdown(args, flags)


if __name__ == "__main__":
    main()
