#!/usr/bin/python3
"""How long SIGTERM takes to end the server, idle and with health Watches open.

    deploy/probe-shutdown.py SERVER [--runs=3] [--watches=1,8] [server flags...]

For each case and run: starts SERVER (CPU backend, one device), opens the given number of
grpc.health.v1.Health/Watch streams (what clients with gRPC's client-side health checking
hold) and waits for their first SERVING, sends SIGTERM, and measures the time to the
process's exit; it also records what each Watch received last (NOT_SERVING expected) and
how it ended. Prints a table of the exit times per case (issue 15: an idle server exits
within 1 s, and a Watch does not hold it up).

Needs Debian's python3-grpcio (/usr/bin/python3).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from server_exit import terminate_and_time

WATCH = "/grpc.health.v1.Health/Watch"
STATUS = {1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def health_status(raw):
    # HealthCheckResponse { ServingStatus status = 1; }: one varint field (or empty: 0).
    if len(raw) >= 2 and raw[0] == 0x08:
        return STATUS.get(raw[1], str(raw[1]))
    return "UNKNOWN"


def start(server, flags, work):
    ready = os.path.join(work, "ready.json")
    if os.path.exists(ready):
        os.remove(ready)
    log = open(os.path.join(work, "server.log"), "ab")
    p = subprocess.Popen([server, "--listen=127.0.0.1:0", "--metrics_listen=",
                          f"--ready_file={ready}", "--backend=cpu", "--cpu_devices=1", *flags],
                         stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(ready) as f:
                return p, json.load(f)["grpc_port"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    p.kill()
    sys.exit("the server did not start")


def run_case(server, flags, work, watches):
    p, port = start(server, flags, work)
    channels, ended = [], []
    seen_serving = threading.Barrier(watches + 1) if watches else None

    def watch(i):
        ch = grpc.insecure_channel(f"127.0.0.1:{port}",
                                   options=[("grpc.use_local_subchannel_pool", 1),
                                            ("gpucompute.probe", i)])
        channels.append(ch)
        call = ch.unary_stream(WATCH)(b"", timeout=120)
        last, told = None, False
        try:
            for raw in call:
                last = health_status(raw)
                if last == "SERVING" and not told:
                    told = True
                    seen_serving.wait(timeout=30)
            ended.append((last, "closed by the server (OK)"))
        except grpc.RpcError as e:
            ended.append((last, e.code().name))

    threads = [threading.Thread(target=watch, args=(i,), daemon=True) for i in range(watches)]
    for t in threads:
        t.start()
    if seen_serving:
        seen_serving.wait(timeout=30)
    time.sleep(0.2)
    code, exit_s = terminate_and_time(p)
    for t in threads:
        t.join(timeout=10)
    for ch in channels:
        ch.close()
    return {"watches": watches, "exit_s": exit_s, "exit_code": code, "watch_ends": ended}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--watches", default="1,8")
    parser.add_argument("--json", default="")
    parser.add_argument("flags", nargs="*")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpucompute-shutdown-")
    cases = [0] + [int(w) for w in args.watches.split(",") if w]
    results = []
    for watches in cases:
        for _ in range(args.runs):
            results.append(run_case(args.server, args.flags, work, watches))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("| Watches open | exit after SIGTERM (s) | exit code | what each Watch saw last, how it ended |")
    print("|---|---|---|---|")
    for watches in cases:
        rows = [r for r in results if r["watches"] == watches]
        ends = sorted({f"{last} / {how}" for r in rows for last, how in r["watch_ends"]})
        times = ", ".join("%.2f" % r["exit_s"] for r in rows)
        codes = ", ".join(str(r["exit_code"]) for r in rows)
        print(f"| {watches} | {times} | {codes} | {'; '.join(ends) or '-'} |")


if __name__ == "__main__":
    main()
