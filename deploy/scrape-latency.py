#!/usr/bin/env python3
"""Scrape latency of a server's /metrics endpoint with idle connections held open.

    deploy/scrape-latency.py PATH/TO/gpucompute-server

Starts the server (CPU backend, loopback, free ports), then for 0, 1, 4, 10 and
100 connections that connect and send nothing, times 20 scrapes of /metrics
and prints the median and the slowest as a markdown table.
"""
import socket, subprocess, time, json, os, sys, tempfile
server = sys.argv[1]
d = tempfile.mkdtemp()
ready = os.path.join(d, "ready.json")
p = subprocess.Popen([server, "--backend=cpu", "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", f"--ready_file={ready}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(300):
    if os.path.exists(ready) and os.path.getsize(ready) > 0: break
    time.sleep(0.05)
port = json.load(open(ready))["metrics_port"]
def scrape():
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while True:
        b = s.recv(65536)
        if not b: break
        data += b
    s.close(); return data
scrape()
rows = []
for idle_n in (0, 1, 4, 10, 100):
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle_n)]
    times = []
    for _ in range(20):
        t = time.perf_counter(); r = scrape(); times.append(time.perf_counter() - t)
        assert r.startswith(b"HTTP/1.1 200")
    times.sort()
    rows.append((idle_n, times[len(times)//2]*1e3, times[-1]*1e3))
    for s in idle: s.close()
p.terminate(); p.wait()
print("| idle connections open | scrape p50 (ms) | scrape max of 20 (ms) |")
print("|---|---|---|")
for r in rows: print(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} |")
