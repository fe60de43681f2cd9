#!/usr/bin/python3
"""Soak: many clients for minutes against one server, over TLS with bearer tokens.

    deploy/soak.py SERVER [--clients=64] [--seconds=600] [--warmup=60] [--json=F]
                          [-- server flags...]

Starts SERVER (a gpucompute-server binary; CPU backend, two devices unless the flags
after "--" say otherwise) with TLS (a CA and a certificate made by openssl now) and a
token file holding one token per client plus one that rotates. Then, for --seconds:
  - --clients threads, each with a client and connection of its own (gpucompute.Client,
    retries off, so that nothing the server fails is hidden), call a mix of operations and
    check every answer against numpy in float64: small and mid-size GEMMs (float32 and
    bfloat16), GEMV, reductions, transposes, attention, Echos of 4-32 MiB, resident tensors
    (upload, GEMM on handles keeping the result, download, free), Batch streams of 16 items,
    and cancellations: calls with deadlines too short to finish, and Batch streams left
    after their first answer;
  - every --reload_every seconds the rotating token is replaced in the file and the server
    gets SIGHUP; the new token must then be accepted and the old one refused
    (UNAUTHENTICATED), while the clients' own tokens keep working;
  - every --rotate_every seconds a new key and certificate from the same CA replace the
    server's files; new connections must be served the new certificate within 45 s (the
    server reads the files every --tls_reload_interval, 30 s by default), while the clients'
    open connections go on;
  - the server's VmRSS is sampled every second.
At the end it compares the server's request counters with what the clients saw, stops the
server with SIGTERM and prints: calls by outcome, lost calls, RSS per minute after
--warmup, p50/p99 of the 64^3 GEMM probe per minute, reloads, and the exit time. Exit 0
when nothing was lost, RSS stayed within +-10% of its mean after warm-up (by minute), every
reload and rotation did what it should and the server's counters agree with the clients; 1
otherwise.

Outcomes: "ok" (answered and correct); "expired" (DEADLINE_EXCEEDED or CANCELLED of a call
made to be cancelled); "refused" (RESOURCE_EXHAUSTED: admission, reported but not lost);
"lost": a wrong answer, or any other error (UNAVAILABLE, INTERNAL, UNAUTHENTICATED with a
valid token, DEADLINE_EXCEEDED of a call with the normal 120 s deadline, ...).

Needs Debian's python3-grpcio, python3-numpy and openssl (/usr/bin/python3).
"""
import argparse
import collections
import json
import os
import random
import re
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                "python"))
import grpc  # noqa: E402
import numpy as np  # noqa: E402

import gpucompute  # noqa: E402
from gpucompute import ops  # noqa: E402
from server_exit import terminate_and_time  # noqa: E402

MIB = 1 << 20
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl(d, "req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=soak-ca")
    openssl(d, "req", *EC, "-keyout", "server.key", "-out", "server.csr", "-subj",
            "/CN=localhost")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "2", "-extfile", "server.ext")


def issue_server_certificate(d, name):
    """A new key and certificate for localhost from the soak's CA: d/name.key, d/name.pem."""
    openssl(d, "req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
            "/CN=localhost")
    openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", "server.ext")


def served_certificate(port, ca):
    """The DER certificate the server presents to a new TLS connection now."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with ctx.wrap_socket(sock, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def vm_rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def f64(x):
    x = np.asarray(x)
    if x.dtype == np.uint16:
        return gpucompute.bfloat16_to_float32(x).astype(np.float64)
    return x.astype(np.float64)


def rand(rng, shape, dtype):
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    return gpucompute.float32_to_bfloat16(x) if dtype == "bfloat16" else x.astype(dtype)


EPS = {"float32": 2.0**-22, "bfloat16": 2.0**-7}


def close(got, ref, dtype, depth, magnitude):
    got = f64(got)
    if got.shape != ref.shape:
        return False
    tol = 4 * depth * 2.0**-23 * magnitude + 2 * EPS[dtype] * np.abs(ref) + 1e-30
    return bool(np.all(np.abs(got - ref) <= tol))


def gemm_check(a, b, dtype, k):
    ref = f64(a) @ f64(b)
    mag = np.abs(f64(a)) @ np.abs(f64(b))
    return lambda v: close(v, ref, dtype, k, mag)


def make_gemm_probe(rng, pick):
    a, b = rand(rng, (64, 64), "float32"), rand(rng, (64, 64), "float32")
    return a, b, gemm_check(a, b, "float32", 64)


def make_gemm_mid(rng, pick):
    dtype = pick.choice(["float32", "bfloat16"])
    m, n, k = pick.randint(100, 400), pick.randint(100, 400), pick.randint(100, 400)
    a, b = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    return dtype, a, b, gemm_check(a, b, dtype, k)


def make_gemv(rng, pick):
    m, n = pick.randint(50, 3000), pick.randint(50, 3000)
    a, x = rand(rng, (m, n), "float32"), rand(rng, (n,), "float32")
    ref, mag = f64(a) @ f64(x), np.abs(f64(a)) @ np.abs(f64(x))
    return a, x, lambda v: close(v, ref, "float32", n, mag)


def make_reduce(rng, pick):
    shape = (pick.randint(1, 500), pick.randint(1, 500))
    axis = pick.choice([None, 0, 1])
    x = rand(rng, shape, "float32")
    ref = np.asarray(f64(x).sum(axis=axis))
    mag = np.asarray(np.abs(f64(x)).sum(axis=axis))
    depth = x.size if axis is None else shape[axis]
    return x, axis, lambda v: close(np.asarray(v).reshape(ref.shape), ref, "float32", depth, mag)


def make_transpose(rng, pick):
    shape = tuple(pick.randint(1, 40) for _ in range(3))
    perm = pick.choice([(2, 1, 0), (1, 0, 2), (0, 2, 1), (2, 0, 1)])
    x = rand(rng, shape, "bfloat16")
    ref = np.transpose(x, perm)
    return x, perm, lambda v: np.array_equal(np.asarray(v), ref)


def make_attention(rng, pick):
    s, d = pick.randint(8, 96), pick.choice([32, 64])
    q, k, v = (rand(rng, (1, 2, s, d), "float32") for _ in range(3))
    causal = pick.random() < 0.5
    scores = f64(q) @ np.swapaxes(f64(k), -1, -2) / np.sqrt(d)
    if causal:
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ f64(v)
    return q, k, v, causal, lambda out: bool(np.allclose(f64(out), ref, rtol=1e-3, atol=1e-4))


def make_echo(rng, pick):
    bits = rng.integers(0, 1 << 16, size=pick.randint(4, 32) * MIB // 2, dtype=np.uint16)
    return bits.view(np.float16), lambda v: np.array_equal(np.asarray(v).view(np.uint16), bits)


def make_resident(rng, pick):
    a = rand(rng, (512, pick.randint(200, 2000)), "float32")
    b = rand(rng, (a.shape[1], 128), "float32")
    return a, b, gemm_check(a, b, "float32", a.shape[1])


def make_batch(rng, pick):
    items = []
    for _ in range(16):
        a, b = rand(rng, (32, 48), "float32"), rand(rng, (48, 16), "float32")
        items.append((ops.gemm(a, b), gemm_check(a, b, "float32", 48)))

    def check(results):
        return (len(results) == len(items) and
                all(r.error is None and items[r.index][1](r.value) for r in results))

    return [r for r, _ in items], check


class Soak:
    def __init__(self, args, address, metrics_port, pid, pki, tokens, token_path):
        self.args, self.address, self.metrics_port, self.pid = args, address, metrics_port, pid
        self.pki, self.tokens, self.token_path = pki, tokens, token_path
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes = collections.Counter()  # (op, outcome)
        self.lost_examples = []
        self.ok_by_method = collections.Counter()
        self.expired_by_method = collections.Counter()
        self.probe = collections.defaultdict(list)  # minute -> latencies (s)
        self.rss = []  # (t, MB)
        self.reloads = []  # dicts
        self.rotations = []  # dicts
        self.grpc_port = 0
        self.start = 0.0

    # -- clients ----------------------------------------------------------------------
    def client(self, token, **kw):
        return gpucompute.Client(self.address, use_tls=True,
                                 root_certs_path=os.path.join(self.pki, "ca.pem"),
                                 token=token, own_connection=True, retries=False,
                                 default_timeout=120, bfloat16="bits", **kw)

    def record(self, op, outcome, detail=""):
        with self.lock:
            self.outcomes[(op, outcome)] += 1
            if outcome == "lost" and len(self.lost_examples) < 20:
                self.lost_examples.append(f"{op}: {detail}"[:400])

    def call(self, op, method, fn, check, cancelled=False):
        """Runs fn(); classifies its end. `method` names the unary RPC that the server counts
        once when the call succeeds ("" for none)."""
        t0 = time.monotonic()
        try:
            value = fn()
        except gpucompute.ComputeError as e:
            if cancelled and e.code in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                        grpc.StatusCode.CANCELLED):
                self.record(op, "expired")
                with self.lock:
                    self.expired_by_method[method] += 1
            elif e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.record(op, "refused")
            else:
                self.record(op, "lost", f"{e.code.name}: {e.message}")
            return None
        except Exception as e:  # noqa: BLE001 - any other failure is a lost call
            self.record(op, "lost", f"{type(e).__name__}: {e}")
            return None
        elapsed = time.monotonic() - t0
        ok = check(value)
        self.record(op, "ok" if ok else "lost", "" if ok else "wrong answer")
        if ok and method:
            with self.lock:
                self.ok_by_method[method] += 1
        return elapsed if ok else None

    def prepare(self, variants=6):
        """Inputs and float64 references made once and shared by every worker (read only), so
        that the clients' own numpy work stays small beside the server's."""
        rng, pick = np.random.default_rng(7), random.Random(7)
        makers = {"gemm_probe": make_gemm_probe, "gemm_mid": make_gemm_mid, "gemv": make_gemv,
                  "reduce": make_reduce, "transpose": make_transpose,
                  "attention": make_attention, "echo": make_echo,
                  "resident": make_resident, "batch": make_batch}
        self.pools = {name: [make(rng, pick) for _ in range(variants)]
                      for name, make in makers.items()}
        self.cancel_gemm_inputs = (rand(rng, (768, 768), "float32"),
                                   rand(rng, (768, 768), "float32"))
        self.cancel_echo_input = np.zeros(16 * MIB // 4, np.float32)
        self.abandon_requests = [ops.gemm(rand(rng, (256, 256), "float32"),
                                          rand(rng, (256, 256), "float32")) for _ in range(8)]

    def worker(self, index):
        pick = random.Random(index)
        c = self.client(self.tokens[index], session=f"s{index}", streams=2,
                        parallel_min_bytes=8 * MIB)
        mix = [(30, self.gemm_probe), (8, self.gemm_mid), (8, self.gemv), (8, self.reduce),
               (8, self.transpose), (6, self.attention), (5, self.echo_large),
               (5, self.resident), (6, self.batch), (8, self.cancel_gemm),
               (3, self.cancel_echo), (3, self.abandon_batch)]
        total = sum(w for w, _ in mix)
        with c:
            while not self.stop.is_set():
                r = pick.uniform(0, total)
                for w, fn in mix:
                    r -= w
                    if r <= 0:
                        fn(c, pick)
                        break

    def gemm_probe(self, c, pick):
        a, b, check = pick.choice(self.pools["gemm_probe"])
        took = self.call("gemm 64^3 f32", "Gemm", lambda: c.gemm(a, b), check)
        if took is not None:
            minute = int((time.monotonic() - self.start) // 60)
            with self.lock:
                self.probe[minute].append(took)

    def gemm_mid(self, c, pick):
        dtype, a, b, check = pick.choice(self.pools["gemm_mid"])
        self.call(f"gemm 100-400 {dtype}", "Gemm", lambda: c.gemm(a, b), check)

    def gemv(self, c, pick):
        a, x, check = pick.choice(self.pools["gemv"])
        self.call("gemv", "Gemv", lambda: c.gemv(a, x), check)

    def reduce(self, c, pick):
        x, axis, check = pick.choice(self.pools["reduce"])
        self.call("reduce sum", "Reduce", lambda: c.reduce(x, "sum", axis=axis), check)

    def transpose(self, c, pick):
        x, perm, check = pick.choice(self.pools["transpose"])
        self.call("transpose", "Transpose", lambda: c.transpose(x, perm), check)

    def attention(self, c, pick):
        q, k, v, causal, check = pick.choice(self.pools["attention"])
        self.call("attention", "Attention", lambda: c.attention(q, k, v, causal=causal), check)

    def echo_large(self, c, pick):
        x, check = pick.choice(self.pools["echo"])
        self.call("echo 4-32 MiB", "Echo", lambda: c.echo(x), check)

    def resident(self, c, pick):
        a, b, check = pick.choice(self.pools["resident"])

        def run():
            ha, hb = c.upload(a), c.upload(b)
            try:
                hc = c.gemm(ha, hb, keep_output=True)
                try:
                    return c.download(hc)
                finally:
                    c.free(hc)
            finally:
                c.free([ha, hb])

        self.call("resident upload/gemm/download/free", "Gemm", run, check)

    def batch(self, c, pick):
        requests, check = pick.choice(self.pools["batch"])
        self.call("batch 16 gemm", "", lambda: list(c.batch(requests, max_outstanding=8)),
                  check)

    def cancel_gemm(self, c, pick):
        a, b = self.cancel_gemm_inputs
        self.call("cancel: gemm 768^3 in 2-20 ms", "Gemm",
                  lambda: c.gemm(a, b, timeout=pick.uniform(0.002, 0.02)),
                  lambda v: np.asarray(v).shape == (768, 768), cancelled=True)

    def cancel_echo(self, c, pick):
        x = self.cancel_echo_input
        self.call("cancel: echo 16 MiB in 5 ms", "Echo", lambda: c.echo(x, timeout=0.005),
                  lambda v: np.asarray(v).shape == x.shape, cancelled=True)

    def abandon_batch(self, c, pick):
        def run():
            for result in c.batch(self.abandon_requests, max_outstanding=4):
                return result  # leaving the loop cancels the stream

        self.call("cancel: batch left after 1 of 8", "", run,
                  lambda r: r is not None and r.error is None, cancelled=True)

    # -- token reloads, RSS -------------------------------------------------------------
    def token_file_text(self, rotating):
        lines = [f"{t} client{i}" for i, t in enumerate(self.tokens)]
        lines.append(f"{rotating} rotating")
        return "\n".join(lines) + "\n"

    def reloader(self, first_rotating):
        old = first_rotating
        while not self.stop.wait(self.args.reload_every):
            new = "rot-" + secrets.token_hex(16)
            write_atomically(self.token_path, self.token_file_text(new))
            sent = time.monotonic()
            os.kill(self.pid, signal.SIGHUP)
            accepted_after, refused_old = None, False
            with self.client(new) as fresh, self.client(old) as stale:
                while time.monotonic() - sent < 5:
                    try:
                        fresh.info(timeout=10)
                        accepted_after = time.monotonic() - sent
                        break
                    except gpucompute.ComputeError as e:
                        if e.code != grpc.StatusCode.UNAUTHENTICATED:
                            break
                        time.sleep(0.01)
                try:
                    stale.info(timeout=10)
                except gpucompute.ComputeError as e:
                    refused_old = e.code == grpc.StatusCode.UNAUTHENTICATED
            self.reloads.append({"at_s": round(sent - self.start, 1),
                                 "new_token_accepted_after_s": accepted_after,
                                 "old_token_refused": refused_old})
            old = new

    def rotator(self):
        """Every --rotate_every seconds: a new key and certificate replace the served ones (the
        key first); new connections must get the new certificate within the server's
        --tls_reload_interval (30 s by default) and a margin."""
        n = 0
        while not self.stop.wait(self.args.rotate_every):
            n += 1
            issue_server_certificate(self.pki, f"rotated{n}")
            with open(os.path.join(self.pki, f"rotated{n}.key")) as f:
                write_atomically(os.path.join(self.pki, "server.key"), f.read())
            with open(os.path.join(self.pki, f"rotated{n}.pem")) as f:
                pem = f.read()
            write_atomically(os.path.join(self.pki, "server.pem"), pem)
            want = ssl.PEM_cert_to_DER_cert(pem)
            written = time.monotonic()
            served_after = None
            while not self.stop.is_set() and time.monotonic() - written < 45:
                try:
                    if served_certificate(self.grpc_port,
                                          os.path.join(self.pki, "ca.pem")) == want:
                        served_after = time.monotonic() - written
                        break
                except (OSError, ssl.SSLError):
                    pass
                time.sleep(0.5)
            if self.stop.is_set() and served_after is None:
                break  # the run ended while waiting: not a verdict
            self.rotations.append({"at_s": round(written - self.start, 1),
                                   "served_after_s": served_after})

    def sampler(self):
        while not self.stop.wait(1.0):
            self.rss.append((time.monotonic() - self.start, vm_rss_mb(self.pid)))

    def scrape(self):
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        ok = collections.Counter()
        pattern = re.compile(r'^gpucompute_requests_total\{([^}]*)\} ([0-9.e+]+)$')
        for line in text.splitlines():
            m = pattern.match(line)
            if not m:
                continue
            labels = dict(kv.split("=", 1) for kv in m.group(1).split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            if labels.get("code") == "OK":
                ok[labels.get("method", "")] += int(float(m.group(2)))
        return ok


def percentile(values, q):
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--warmup", type=float, default=60)
    parser.add_argument("--reload_every", type=float, default=30)
    parser.add_argument("--rotate_every", type=float, default=150)
    parser.add_argument("--json", default="")
    args, server_flags = parser.parse_known_args()
    args.server_flags = [f for f in server_flags if f != "--"]

    work = tempfile.mkdtemp(prefix="gpucompute-soak-")
    make_pki(work)
    tokens = [f"soak-{i:02d}-" + secrets.token_hex(12) for i in range(args.clients)]
    rotating = "rot-" + secrets.token_hex(16)
    token_path = os.path.join(work, "tokens")
    ready = os.path.join(work, "ready.json")
    log_path = os.path.join(work, "server.log")
    argv = [args.server, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
            f"--ready_file={ready}", "--backend=cpu", "--cpu_devices=2",
            f"--tls_cert={work}/server.pem", f"--tls_key={work}/server.key",
            f"--token_file={token_path}", *args.server_flags]
    soak = Soak(args, "", 0, 0, work, tokens, token_path)
    write_atomically(token_path, soak.token_file_text(rotating))
    log = open(log_path, "wb")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            with open(ready) as f:
                ports = json.load(f)
            break
        except (OSError, ValueError):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                sys.exit(f"soak: the server did not start; its log is {log_path}")
            time.sleep(0.05)
    soak.address = f"localhost:{ports['grpc_port']}"
    soak.metrics_port, soak.pid = ports["metrics_port"], server.pid
    soak.grpc_port = ports["grpc_port"]
    print(f"soak: server pid {server.pid} on {soak.address}, {args.clients} clients, "
          f"{args.seconds:.0f} s; argv: {' '.join(argv)}", flush=True)

    soak.prepare()
    soak.start = time.monotonic()
    threads = [threading.Thread(target=soak.worker, args=(i,), daemon=True)
               for i in range(args.clients)]
    threads += [threading.Thread(target=soak.reloader, args=(rotating,), daemon=True),
                threading.Thread(target=soak.rotator, daemon=True),
                threading.Thread(target=soak.sampler, daemon=True)]
    for t in threads:
        t.start()
    next_report = 60
    while time.monotonic() - soak.start < args.seconds:
        time.sleep(1)
        elapsed = time.monotonic() - soak.start
        if elapsed >= next_report:
            with soak.lock:
                done = sum(soak.outcomes.values())
                lost = sum(n for (_, o), n in soak.outcomes.items() if o == "lost")
            print(f"  {elapsed:5.0f} s: {done} calls, {lost} lost, RSS "
                  f"{vm_rss_mb(server.pid):.0f} MB", flush=True)
            next_report += 60
    soak.stop.set()
    for t in threads:
        t.join(timeout=180)
    hung = [t.name for t in threads if t.is_alive()]
    # Idle: what the server keeps once the load is gone (the allocator's
    # retained memory, and anything leaked).
    time.sleep(5)
    idle_rss = vm_rss_mb(server.pid)
    server_ok = soak.scrape()
    server_cpu = cpu_seconds(server.pid)
    own = os.times()
    client_cpu = own.user + own.system
    code, exit_s = terminate_and_time(server)
    log.close()

    # -- summary -------------------------------------------------------------------------
    by_outcome = collections.Counter()
    for (_, outcome), n in soak.outcomes.items():
        by_outcome[outcome] += n
    lost = by_outcome["lost"]
    after = [mb for t, mb in soak.rss if t >= args.warmup]
    minutes = collections.defaultdict(list)
    for t, mb in soak.rss:
        if t >= args.warmup:
            minutes[int(t // 60)].append(mb)
    rss_minutes = {m: float(np.mean(v)) for m, v in sorted(minutes.items())}
    rss_mean = float(np.mean(after)) if after else float("nan")
    rss_dev = max((abs(v - rss_mean) / rss_mean for v in rss_minutes.values()), default=0.0)
    probe = {m: {"n": len(v), "p50_ms": percentile(v, 50) * 1e3,
                 "p99_ms": percentile(v, 99) * 1e3}
             for m, v in sorted(soak.probe.items())
             if m * 60 >= args.warmup and (m + 1) * 60 <= args.seconds}  # whole minutes
    p99s = [p["p99_ms"] for p in probe.values()]
    reloads_ok = all(r["new_token_accepted_after_s"] is not None and r["old_token_refused"]
                     for r in soak.reloads)
    rotations_ok = all(r["served_after_s"] is not None for r in soak.rotations)
    # A call the client gave up on may still have finished on the server: the server's OK
    # count lies between the clients' and that plus the calls they gave up on.
    counters = {m: {"clients_ok": soak.ok_by_method[m], "server_ok": server_ok.get(m, 0),
                    "clients_gave_up": soak.expired_by_method[m]}
                for m in ("Gemm", "Gemv", "Reduce", "Transpose", "Attention", "Echo")}
    counters_ok = all(v["clients_ok"] <= v["server_ok"] <= v["clients_ok"] + v["clients_gave_up"]
                      for v in counters.values())
    result = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "argv": argv, "clients": args.clients, "seconds": args.seconds,
        "warmup_s": args.warmup, "calls": sum(by_outcome.values()),
        "by_outcome": dict(by_outcome),
        "by_op": {f"{op} / {o}": n for (op, o), n in sorted(soak.outcomes.items())},
        "lost": lost, "lost_examples": soak.lost_examples, "hung_threads": hung,
        "rss_mb_per_minute": rss_minutes, "rss_mb_mean": rss_mean,
        "rss_mb_min": min(after, default=0.0), "rss_mb_max": max(after, default=0.0),
        "rss_max_minute_deviation": rss_dev, "rss_mb_idle_after": idle_rss,
        "probe_gemm_64_f32_per_minute": probe,
        "probe_p99_max_over_min": (max(p99s) / min(p99s)) if p99s else float("nan"),
        "reloads": soak.reloads, "reloads_ok": reloads_ok,
        "certificate_rotations": soak.rotations, "rotations_ok": rotations_ok,
        "server_cpu_s": server_cpu, "clients_cpu_s": client_cpu, "cpus": os.cpu_count(),
        "ok_counters": counters, "ok_counters_agree": counters_ok, "sigterm_exit_s": exit_s, "exit_code": code,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)

    print(f"\nsoak: {result['calls']} calls in {args.seconds:.0f} s from {args.clients} "
          f"clients: " + ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items())))
    for (op, o), n in sorted(soak.outcomes.items()):
        print(f"  {op:40s} {o:8s} {n:8d}")
    for e in soak.lost_examples:
        print(f"  lost: {e}")
    print("RSS after warm-up, MB per minute: " +
          ", ".join(f"{m}: {v:.0f}" for m, v in rss_minutes.items()) +
          f"; mean {rss_mean:.0f}, largest minute off the mean by {100 * rss_dev:.1f}%; "
          f"5 s after the load: {idle_rss:.0f}")
    print("64^3 GEMM probe per minute (p50 / p99 ms): " +
          ", ".join(f"{m}: {p['p50_ms']:.2f}/{p['p99_ms']:.2f}" for m, p in probe.items()))
    print(f"token reloads: {len(soak.reloads)}, all right: {reloads_ok}; "
          f"new token accepted after (s): "
          f"{[round(r['new_token_accepted_after_s'] or -1, 3) for r in soak.reloads]}")
    print(f"certificate rotations: {len(soak.rotations)}, all served: {rotations_ok}; after (s): "
          f"{[r['served_after_s'] and round(r['served_after_s'], 1) for r in soak.rotations]}")
    print("OK calls, clients / server counters (+ calls the clients gave up on): " +
          ", ".join(f"{m} {v['clients_ok']}/{v['server_ok']} (+{v['clients_gave_up']})"
                    for m, v in counters.items()) + f"; agree: {counters_ok}")
    print(f"CPU seconds: server {server_cpu:.0f}, clients (this process) {client_cpu:.0f}, "
          f"on {os.cpu_count()} CPUs")
    print(f"SIGTERM to exit: {exit_s:.2f} s (exit code {code}); hung threads: {len(hung)}")
    good = (lost == 0 and not hung and rss_dev <= 0.10 and reloads_ok and rotations_ok and
            counters_ok and code == 0)
    print("soak:", "PASS" if good else "FAIL")
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
