"""Several replicas behind one Python client, as the C++ client and its replicas test do it: a
comma-separated list of addresses is one round_robin channel over all of them, idempotent calls
that fail UNAVAILABLE are retried on the others, and a replica killed (a crash) or drained (a
rollout) in the middle of a run costs no request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
import urllib.request

import numpy as np
import pytest

import gpucompute
from gpucompute._channel import Settings, channel_target
from conftest import Server

REPLICAS = 3


def test_a_list_of_addresses_is_one_balanced_target():
    assert channel_target("127.0.0.1:1,127.0.0.1:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert channel_target("localhost:7, 10.0.0.2:8") == "ipv4:127.0.0.1:7,10.0.0.2:8"
    assert channel_target("[::1]:5,[fe80::1]:6") == "ipv6:[::1]:5,[fe80::1]:6"
    for as_is in ("localhost:50051", "dns:///svc.ns:50051", "ipv4:1.2.3.4:5,1.2.3.5:5",
                  "unix:/tmp/s", "svc:50051"):
        assert channel_target(as_is) == as_is
    listed = Settings(target="127.0.0.1:1,127.0.0.1:2")
    assert listed.balanced()
    assert ("grpc.lb_policy_name", "round_robin") in listed.channel_args()
    # pick_first named: the list is one target, tried in order; nothing balanced.
    first = Settings(target="127.0.0.1:1,127.0.0.1:2", lb_policy="pick_first")
    assert not first.balanced()
    assert ("grpc.lb_policy_name", "pick_first") in first.channel_args()
    assert not Settings(target="127.0.0.1:1").balanced()
    # Retries as the C++ client's: UNAVAILABLE and CANCELLED, requests of up to 64 MiB.
    args = dict(Settings(target="127.0.0.1:1").channel_args())
    policy = json.loads(args["grpc.service_config"])["methodConfig"][0]["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE", "CANCELLED"]
    assert args["grpc.per_rpc_retry_buffer_size"] == 64 << 20
    assert "grpc.service_config" not in dict(Settings(retries=False).channel_args())


@pytest.mark.parametrize("target, field_text", [
    ("127.0.0.1:1,127.0.0.1", '"127.0.0.1" in the list is not address:port'),
    ("127.0.0.1:1,127.0.0.1:0", "not address:port"),
    ("127.0.0.1:1,host.example:2", '"host.example" in the list is not an IP address'),
    ("127.0.0.1:1,[::1]:2", "IPv4 or IPv6 addresses, not both"),
])
def test_a_bad_list_of_addresses_names_the_entry(target, field_text):
    with pytest.raises(gpucompute.ComputeError) as e:
        gpucompute.Client(target)
    assert e.value.code.name == "INVALID_ARGUMENT"
    assert e.value.message.startswith("target: ") and field_text in e.value.message


def test_an_unknown_lb_policy_is_invalid():
    with pytest.raises(gpucompute.ComputeError) as e:
        gpucompute.Client("127.0.0.1:1", lb_policy="grpclb")
    assert e.value.code.name == "INVALID_ARGUMENT"
    assert e.value.message.startswith("lb_policy: ")


def ok_gemms(server: Server) -> float:
    """gpucompute_requests_total{method="Gemm",code="OK"} of `server`; -1 when it cannot be
    scraped (it is gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return -1
    for line in text.splitlines():
        if (line.startswith("gpucompute_requests_total{") and 'method="Gemm"' in line
                and 'code="OK"' in line):
            return float(line.rsplit(" ", 1)[1])
    return 0


def served_by_all(replicas, since) -> bool:
    return all(ok_gemms(s) > x for s, x in zip(replicas, since))


def connect_every_replica(call, replicas, seconds: float = 20) -> None:
    """Calls call() until every replica has served one of them. round_robin sends calls only to
    the replicas it is connected to, and a connection can take longer than a few quick calls
    (a loaded host): counting before then finds a replica that served nothing."""
    start = [ok_gemms(s) for s in replicas]
    end = time.monotonic() + seconds
    while not served_by_all(replicas, start):
        assert time.monotonic() < end, f"a replica served nothing in {seconds} s"
        for _ in range(len(replicas)):
            call()


@pytest.fixture()
def replicas():
    servers = [Server("--cpu_devices=1", "--worker_threads=4", "--metrics_listen=127.0.0.1:0")
               for _ in range(REPLICAS)]
    yield servers
    for s in servers:
        s.stop()


@pytest.mark.parametrize("how", ["kill", "terminate"])  # SIGKILL: a crash; SIGTERM: a drain
def test_calls_spread_over_every_replica_and_survive_losing_one(replicas, how):
    target = ",".join(s.address for s in replicas)
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (96, 80)).astype(np.float32)
    b = rng.uniform(-1, 1, (80, 64)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    with gpucompute.Client(target, default_timeout=30) as client:
        assert client.settings.balanced()
        connect_every_replica(
            lambda: np.testing.assert_allclose(client.gemm(a, b), ref, rtol=1e-5, atol=1e-5),
            replicas)
        start = [ok_gemms(s) for s in replicas]
        assert min(start) >= 0, start

        total, threads = 300, 6
        lost = []
        done = 0
        lock = threading.Lock()

        def one(_: int) -> None:
            nonlocal done
            try:
                np.testing.assert_allclose(client.gemm(a, b), ref, rtol=1e-5, atol=1e-5)
            except gpucompute.ComputeError as e:
                lost.append(f"{e.code.name}: {e.message}")
            with lock:
                done += 1

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(one, i) for i in range(total)]
            while done < total // 3:
                time.sleep(0.001)
            before = [ok_gemms(s) for s in replicas]
            kill = time.monotonic()
            getattr(replicas[1].process, how)()
            for f in futures:
                f.result()
        end = time.monotonic()
        replicas[1].process.wait(40)
        after = [ok_gemms(s) for s in replicas]
        print(f"python client, {REPLICAS} replicas, replica 1 lost ({how}) after "
              f"{total // 3} of {total} calls ({threads} threads): {len(lost)} lost; every "
              f"call answered {end - kill:.2f} s after the signal, {end - t0:.2f} s in all; "
              f"Gemm calls served before {[x - y for x, y in zip(before, start)]}, after "
              f"{after}")

    assert not lost, lost[:3]
    # round_robin: every replica took a share of the calls before the kill.
    for i in range(REPLICAS):
        assert before[i] - start[i] > (total // 3) / REPLICAS / 2, (start, before)
    assert after[1] == -1, "replica 1 still answers scrapes"
    gained = [after[i] - before[i] for i in (0, 2)]
    assert min(gained) > sum(gained) * 0.25, gained  # both survivors took the rest
    assert end - kill < 5.0  # the calls caught by the kill: retried within seconds


def test_pick_first_keeps_a_list_on_one_replica(replicas):
    target = ",".join(s.address for s in replicas)
    a = np.ones((16, 16), np.float32)
    start = [ok_gemms(s) for s in replicas]
    with gpucompute.Client(target, lb_policy="pick_first", default_timeout=30) as client:
        assert not client.settings.balanced()
        for _ in range(12):
            client.gemm(a, a)
    grew = [ok_gemms(s) - x for s, x in zip(replicas, start)]
    assert sorted(grew) == [0, 0, 12], grew


def test_the_asyncio_client_balances_a_list_too(replicas):
    target = ",".join(s.address for s in replicas)
    a = np.ones((16, 16), np.float32)
    start: list = []

    async def run() -> None:
        async with gpucompute.aio.Client(target, default_timeout=30) as client:
            assert client.settings.balanced()
            # Every replica connected before counting (as connect_every_replica, awaited).
            connected = [ok_gemms(s) for s in replicas]
            end = time.monotonic() + 20
            while not served_by_all(replicas, connected):
                assert time.monotonic() < end, "a replica served nothing in 20 s"
                for _ in range(REPLICAS):
                    await client.gemm(a, a)
            start.extend(ok_gemms(s) for s in replicas)
            results = await asyncio.gather(*(client.gemm(a, a) for _ in range(30)))
            for c in results:
                np.testing.assert_array_equal(c, np.full((16, 16), 16, np.float32))

    asyncio.run(run())
    grew = [ok_gemms(s) - x for s, x in zip(replicas, start)]
    assert sum(grew) == 30, grew
    assert min(grew) >= 5, grew  # round_robin: every replica took a share
