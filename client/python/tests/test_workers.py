"""Transfer worker processes (Client(transfer_processes=N)): uploads and downloads whose bytes
move through processes of their own and a staging buffer shared with the client."""

from __future__ import annotations

import os
import signal
import threading

import grpc
import numpy as np
import pytest

import gpucompute
from conftest import assert_close, f64, random
from test_errors import expect

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd (Linux)")


def workers_client(server, session: str, processes: int = 3, **kwargs) -> gpucompute.Client:
    """A client whose transfers all go through `processes` workers, in small chunks, so that
    small tensors span several parts and messages."""
    options = dict(session=session, bfloat16="bits", transfer_processes=processes,
                   parallel_min_bytes=0, chunk_bytes=8192)
    options.update(kwargs)
    return gpucompute.Client(server.address, **options)


def transfers(c: gpucompute.Client) -> int:
    """How many transfers the client's workers ran."""
    return c._transfer_workers._transfer if c._transfer_workers is not None else 0


def worker_pids(c: gpucompute.Client):
    return [w.process.pid for w in c._transfer_workers._workers]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child that exited but was not reaped yet is a zombie: not alive.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("dtype,shape", [("float32", (1001, 77)), ("bfloat16", (3, 5000, 7)),
                                         ("float16", (123457,)), ("float32", (1,))])
def test_round_trip_is_bit_exact(server, dtype, shape):
    rng = np.random.default_rng(31)
    x = random(shape, dtype, rng)
    with workers_client(server, f"workers-{dtype}-{len(shape)}") as c:
        before = transfers(c)
        h = c.upload(x)
        assert h.shape == shape and h.nbytes == x.nbytes
        y = c.download(h)
        # One part of 4096 bytes or fewer goes as one stream, without the workers.
        used = 2 if x.nbytes > 4096 else 0
        assert transfers(c) - before == used
        assert y.dtype == x.dtype and y.shape == shape
        assert np.array_equal(y.view(np.uint8), x.view(np.uint8))
        # Into a caller's array, poisoned first.
        out = np.full(shape, 0x7F, dtype=x.dtype)
        assert c.download(h, out=out) is out
        assert np.array_equal(out.view(np.uint8), x.view(np.uint8))
        assert c.free(h) == x.nbytes


def test_same_bytes_as_threads_and_the_staging_grows(server):
    rng = np.random.default_rng(32)
    small = random((300, 300), "float32", rng)
    large = random((1000, 1500), "float32", rng)
    with workers_client(server, "workers-grow", processes=4) as c, \
            gpucompute.Client(server.address, session="workers-grow",
                              parallel_min_bytes=0, chunk_bytes=8192) as threads:
        sizes = []
        for x in (small, large, small):  # the staging buffer grows, then is reused
            by_workers = c.upload(x)
            sizes.append(c._transfer_workers.staging.nbytes)
            by_threads = threads.upload(x)
            assert np.array_equal(threads.download(by_workers), x)
            assert np.array_equal(c.download(by_threads), x)
            c.free([by_workers, by_threads])
        assert sizes == [small.nbytes, large.nbytes, large.nbytes]


def test_failures_name_their_cause_and_the_workers_go_on(server):
    rng = np.random.default_rng(34)
    x = random((512, 1024), "float32", rng)
    with workers_client(server, "workers-fail") as c:
        h = c.upload(x)
        # A handle the server does not know: NOT_FOUND from the first stream.
        with expect(grpc.StatusCode.NOT_FOUND, "no-such"):
            c.download("no-such-handle")
        # A deadline that passes inside the workers' streams.
        with expect(grpc.StatusCode.DEADLINE_EXCEEDED):
            c.upload(x, timeout=1e-4)
        # A worker that dies is replaced at the next transfer.
        pids = worker_pids(c)
        os.kill(pids[1], signal.SIGKILL)
        os.waitpid(pids[1], 0)
        assert np.array_equal(c.download(h), x)
        assert worker_pids(c)[0] == pids[0] and worker_pids(c)[1] != pids[1]
        # A worker killed during a transfer fails that transfer only.
        victim = c._transfer_workers._workers[2].process
        killer = threading.Timer(0.0, os.kill, (victim.pid, signal.SIGKILL))
        killer.start()
        try:
            y = c.download(h)
            assert np.array_equal(y, x)  # the kill came after the worker's part
        except gpucompute.ComputeError as e:
            assert e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), str(e)
        killer.join()
        # SIGKILL ends the process a moment after os.kill returns: the next transfer must
        # find it ended (else it is not yet known dead and that transfer fails instead).
        victim.wait(timeout=10)
        assert np.array_equal(c.download(h), x)
        assert worker_pids(c)[2] != victim.pid
        c.free(h)
        assert c.list_tensors().tensors == [], "a failed upload left a tensor"


class _Told:
    """A stand-in worker: what an upload's feed told it."""

    def __init__(self) -> None:
        self.words = []

    def send(self, value) -> bool:
        self.words.append(value)
        return True


def test_the_feed_copies_each_part_in_order_and_tells_its_worker_last_once():
    from gpucompute._workers import _Feed

    src = np.arange(1, 41, dtype=np.uint8)
    parts = [(0, 10), (10, 10), (10, 25), (25, 40)]
    for threads in (1, 2, 4):
        staging = np.zeros(40, np.uint8)
        told = [_Told() for _ in parts]
        gpucompute._workers._COPY_THREADS, saved = threads, gpucompute._workers._COPY_THREADS
        try:
            feed = _Feed(src, staging, parts, 4)
            feed.start(told)
            feed.join()
        finally:
            gpucompute._workers._COPY_THREADS = saved
        assert np.array_equal(staging, src)
        for (begin, end), worker in zip(parts, told):
            upto = [w[1] for w in worker.words]
            assert all(w[0] == "ready" for w in worker.words)
            assert upto == list(range(min(begin + 4, end), end, 4)) + [end], (begin, end, upto)
    # Stopped before it started: only the workers given to start() hear, each once, -1.
    staging = np.zeros(40, np.uint8)
    told = [_Told() for _ in parts]
    feed = _Feed(src, staging, parts, 4)
    feed.stop()
    feed.start(told[:2])
    feed.join()
    assert [t.words for t in told] == [[("ready", -1)], [("ready", -1)], [], []]
    assert not staging.any()


def test_an_upload_that_fails_midway_leaves_the_workers_in_step(server):
    rng = np.random.default_rng(38)
    x = random((1024, 1024), "float32", rng)  # 4 MiB: 512 chunks of 8 KiB over 3 workers
    with workers_client(server, "workers-midway") as c:
        for _ in range(3):
            # A deadline that may pass while the staging copy still runs.
            try:
                c.free(c.upload(x, timeout=0.004))
            except gpucompute.ComputeError as e:
                assert e.code == grpc.StatusCode.DEADLINE_EXCEEDED, str(e)
            h = c.upload(x)
            assert np.array_equal(c.download(h), x)
            c.free(h)
        # A worker killed while the parts are copied and sent.
        victim = c._transfer_workers._workers[1].process
        killer = threading.Timer(0.002, os.kill, (victim.pid, signal.SIGKILL))
        killer.start()
        try:
            c.free(c.upload(x))
        except gpucompute.ComputeError as e:
            assert e.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), str(e)
        killer.join()
        victim.wait(timeout=10)
        y = random((1024, 1024), "float32", rng)
        h = c.upload(y)
        assert np.array_equal(c.download(h), y)
        c.free(h)
        assert c.list_tensors().tensors == [], "a failed upload left a tensor"


def test_concurrent_transfers_and_close(server):
    rng = np.random.default_rng(35)
    xs = [random((400, 500), "float32", rng) for _ in range(6)]
    c = workers_client(server, "workers-concurrent")
    results = [None] * len(xs)

    def round_trip(i: int) -> None:
        h = c.upload(xs[i])
        results[i] = c.download(h)
        c.free(h)

    threads = [threading.Thread(target=round_trip, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, results):
        assert y is not None and np.array_equal(x, y)
    assert transfers(c) >= 1
    pids = worker_pids(c)
    c.close()
    assert not any(alive(p) for p in pids)


def test_the_default_uses_processes_on_machines_with_cores_to_spare(server, monkeypatch):
    from gpucompute import _channel

    for cores, expected in ((1, 0), (2, 0), (7, 0), (8, 4), (12, 6), (16, 8), (128, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert _channel.auto_transfer_processes() == expected, cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    with gpucompute.Client(server.address) as c:
        assert c._transfer_workers is not None and c._transfer_workers.count == 8
    with gpucompute.Client(server.address, transfer_processes=0) as c:
        assert c._transfer_workers is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with gpucompute.Client(server.address) as c:
        assert c._transfer_workers is None
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert _channel.auto_transfer_processes() == 0


def test_bad_settings_name_the_field(server):
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "transfer_processes"):
        gpucompute.Client(server.address, transfer_processes=-1)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "transfer_processes"):
        gpucompute.Client(server.address, transfer_processes=65)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "transfer_staging_bytes"):
        gpucompute.Client(server.address, transfer_processes=2, transfer_staging_bytes=0)


def test_larger_than_the_staging_limit_uses_threads(server):
    rng = np.random.default_rng(36)
    x = random((256, 256), "float32", rng)
    with workers_client(server, "workers-limit", transfer_staging_bytes=x.nbytes - 1) as c:
        h = c.upload(x)
        assert np.array_equal(c.download(h), x)
        assert transfers(c) == 0
        c.free(h)


def test_offloaded_gemm_through_the_workers(server):
    rng = np.random.default_rng(33)
    a = random((300, 200), "float32", rng)
    b = random((200, 250), "float32", rng)
    with workers_client(server, "workers-offload", offload_min_bytes=1) as c:
        before = transfers(c)
        got = c.gemm(a, b)
        # Two uploads and one download, each through the workers; every handle freed.
        assert transfers(c) - before == 3
        assert_close(got, f64(a) @ f64(b), "float32", 200, np.abs(f64(a)) @ np.abs(f64(b)))
        assert c.list_tensors().tensors == []


def test_asyncio_client_through_the_workers(server):
    import asyncio

    import gpucompute.aio

    async def main():
        rng = np.random.default_rng(37)
        xs = [random((700, 300), "bfloat16", rng) for _ in range(3)]
        async with gpucompute.aio.Client(server.address, session="workers-aio", bfloat16="bits",
                                         transfer_processes=2, parallel_min_bytes=0,
                                         chunk_bytes=8192) as c:
            handles = await asyncio.gather(*(c.upload(x) for x in xs))
            for x, h in zip(xs, handles):
                assert np.array_equal(await c.download(h), x)
            assert c._transfer_workers._transfer >= 3
            # A task cancelled while the workers move its bytes: the next transfer runs.
            task = asyncio.ensure_future(c.download(handles[0]))
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            got = await c.download(handles[1])
            assert np.array_equal(got, xs[1])
            await c.free(handles)
            assert (await c.list_tensors()).tensors == []

    asyncio.run(main())
