#!/usr/bin/python3
"""The server's resident memory under the loads of issue 15 (memory bound).

Starts the server with the flags given after the load's name, runs the load
with as many threads as calls at once, samples the server's VmRSS every 20 ms
and prints its baseline, peak (VmHWM) and, after the load, its idle RSS; then
how the calls ended.

  deploy/probe-memory.py SERVER gemm   [--calls=40] [server flags...]
      40 concurrent float32 GEMMs 2048^3 (A and B: 32 MiB of request each)
  deploy/probe-memory.py SERVER echo   [--calls=12] [--mib=200] [--bursts=1] [server flags...]
      concurrent Echos of --mib MiB each, --bursts times
  deploy/probe-memory.py SERVER huge   [--mib=1536] [server flags...]
      one Echo of --mib MiB (over the 1 GiB message limit by default)

With --cli=build/cpu/client/gpucompute the gemm and echo loads are sent by
the C++ CLI (`bench`, --concurrency and --requests of --calls, no warm-up)
instead of Python threads: it sends its calls faster, and declares each
request's size (gpucompute-request-bytes metadata). The Python threads send
raw generated stubs' calls, which declare nothing unless --declare is given.

Needs Debian's python3-grpcio and python3-protobuf (/usr/bin/python3).
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import grpc  # noqa: E402
from gpucompute.v1 import compute_pb2 as pb  # noqa: E402
from gpucompute.v1 import compute_pb2_grpc as pb_grpc  # noqa: E402

MIB = 1 << 20
OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """VmRSS of `pid` every 20 ms; the largest seen."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.stop = pid, 0, False

    def run(self):
        while not self.stop:
            self.peak_kb = max(self.peak_kb, status_kb(self.pid, "VmRSS"))
            time.sleep(0.02)


def mb(kb):
    return f"{kb / 1000:.0f} MB"


def requests_for(args):
    if args.load == "gemm":
        side = 2048
        t = pb.Tensor(dtype=pb.FLOAT32, shape=[side, side], data=bytes(side * side * 4))
        request = pb.GemmRequest(a=t, b=t)
        return [("Gemm", request)] * args.calls
    n = args.mib * MIB // 4
    request = pb.EchoRequest(input=pb.Tensor(dtype=pb.FLOAT32, shape=[n], data=bytes(n * 4)))
    return [("Echo", request)] * (1 if args.load == "huge" else args.calls)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("server")
    parser.add_argument("load", choices=["gemm", "echo", "huge"])
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--mib", type=int, default=None)
    parser.add_argument("--bursts", type=int, default=1)
    parser.add_argument("--idle_seconds", type=float, default=5)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--cli", default="")
    parser.add_argument("--declare", action="store_true")
    args, flags = parser.parse_known_args()  # the rest are the server's
    if args.calls is None:
        args.calls = {"gemm": 40, "echo": 12, "huge": 1}[args.load]
    if args.mib is None:
        args.mib = {"gemm": 32, "echo": 200, "huge": 1536}[args.load]

    ready = os.path.join(tempfile.mkdtemp(), "ready.json")
    cmd = [args.server, "--listen=127.0.0.1:0", "--metrics_listen=", f"--ready_file={ready}",
           *flags]
    print("server:", " ".join(cmd[:1] + flags))
    server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if os.path.exists(ready):
                break
            time.sleep(0.1)
        target = f"127.0.0.1:{json.load(open(ready))['grpc_port']}"
        channel = grpc.insecure_channel(target, options=OPTIONS)
        stub = pb_grpc.ComputeStub(channel)
        stub.GetServerInfo(pb.ServerInfoRequest(), timeout=10)
        time.sleep(0.5)
        base_kb = status_kb(server.pid, "VmRSS")
        work = requests_for(args)
        sampler = Sampler(server.pid)
        sampler.start()
        outcomes = collections.Counter()
        lock = threading.Lock()

        def call(method, request):
            metadata = [("gpucompute-request-bytes", str(request.ByteSize()))] if args.declare \
                else []
            try:
                getattr(stub, method)(request, timeout=args.timeout, metadata=metadata)
                outcome = "OK"
            except grpc.RpcError as e:
                outcome = f"{e.code().name}: {e.details()[:150]}"
            with lock:
                outcomes[outcome] += 1

        def cli_burst():
            op = ["gemm", "--m=2048", "--n=2048", "--k=2048"] if args.load == "gemm" else \
                ["echo", f"--shape={args.mib * MIB // 4}"]
            out = subprocess.run(
                [args.cli, "bench", *op, f"--server={target}", f"--requests={args.calls}",
                 f"--concurrency={args.calls}", "--warmup=0", "--echo_baseline=false",
                 f"--timeout={args.timeout:.0f}s", "--offload_min_bytes=0"],
                capture_output=True, text=True)
            lines = (out.stdout + out.stderr).strip().splitlines()
            outcomes[f"CLI exit {out.returncode}: " + " | ".join(lines[-3:])[:300]] += 1

        start = time.monotonic()
        for _ in range(args.bursts):
            if args.cli and args.load != "huge":
                cli_burst()
                continue
            threads = [threading.Thread(target=call, args=w) for w in work]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        seconds = time.monotonic() - start
        sampler.stop = True
        sampler.join()
        after_kb = status_kb(server.pid, "VmRSS")
        time.sleep(args.idle_seconds)
        idle_kb = status_kb(server.pid, "VmRSS")
        hwm_kb = status_kb(server.pid, "VmHWM")
        print(f"load: {args.load}, {len(work)} calls at once x {args.bursts} "
              f"({args.mib} MiB each), {seconds:.1f} s")
        print(f"RSS baseline {mb(base_kb)}; peak {mb(max(hwm_kb, sampler.peak_kb))} "
              f"(VmHWM); at the end {mb(after_kb)}; idle after {args.idle_seconds:.0f} s "
              f"{mb(idle_kb)}")
        for outcome, count in sorted(outcomes.items()):
            print(f"  {count:3d} x {outcome}")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
