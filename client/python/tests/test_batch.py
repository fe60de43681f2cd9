"""Client.batch over the Batch stream: answers matched to requests, bounded read-ahead."""

from __future__ import annotations

import threading

import grpc
import numpy as np

import gpucompute
from gpucompute import ops
from conftest import assert_close, f64, random


def test_results_are_matched_to_their_requests(client):
    rng = np.random.default_rng(20)
    requests, refs = [], []
    for i in range(30):
        m = 8 + i
        a = random((m, 16), "float32", rng)
        b = random((16, 4), "float32", rng)
        requests.append(ops.gemm(a, b))
        refs.append((f64(a) @ f64(b), np.abs(f64(a)) @ np.abs(f64(b))))
    x = random((5, 40), "float16", rng)
    requests.append(ops.reduce(x, "max", axis=1))
    requests.append(ops.transpose(x))
    seen = set()
    for item in client.batch(requests, max_outstanding=4):
        assert item.request is requests[item.index]
        assert item.error is None and item.latency_seconds > 0
        assert item.timings.server_seconds > 0
        seen.add(item.index)
        if item.index < 30:
            ref, mag = refs[item.index]
            assert_close(item.result(), ref, "float32", 16, mag)
        elif item.index == 30:
            assert_close(item.value, f64(x).max(axis=1), "float16")
        else:
            np.testing.assert_array_equal(item.value, x.T)
    assert seen == set(range(len(requests)))


def test_a_failed_item_does_not_stop_the_stream(client):
    good = np.ones((4, 4), np.float32)
    requests = [ops.gemm(good, good), ops.gemm(good, np.ones((3, 3), np.float32)),
                ops.reduce(good, "sum")]
    items = sorted(client.batch(requests), key=lambda r: r.index)
    assert [i.error is None for i in items] == [True, False, True]
    assert items[1].error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "b.shape" in items[1].error.message
    try:
        items[1].result()
        raise AssertionError("result() of a failed item must raise")
    except gpucompute.ComputeError as e:
        assert e is items[1].error
    assert items[2].value == 16


def test_read_ahead_is_bounded(client):
    a = np.ones((32, 32), np.float32)
    produced = 0
    answered = 0
    worst = 0
    lock = threading.Lock()

    def requests():
        nonlocal produced, worst
        for _ in range(40):
            with lock:
                produced += 1
                worst = max(worst, produced - answered)
            yield ops.gemm(a, a)

    for item in client.batch(requests(), max_outstanding=3):
        with lock:
            answered += 1
        assert item.error is None
    assert answered == 40
    # One request may be taken from the iterable while it waits for room.
    assert worst <= 3 + 1, worst


def test_leaving_early_cancels_the_stream(client):
    a = np.ones((16, 16), np.float32)
    taken = 0

    def endless():
        nonlocal taken
        while True:
            taken += 1
            yield ops.gemm(a, a)

    for i, item in enumerate(client.batch(endless(), max_outstanding=2)):
        if i == 5:
            break
    # The generator stops being read once the stream is cancelled.
    import time
    time.sleep(0.3)
    settled = taken
    time.sleep(0.3)
    assert taken == settled and taken < 20


def test_resident_operands_and_kept_results_in_a_batch(server):
    with gpucompute.Client(server.address, session="batch-resident") as c:
        a = c.upload(np.full((8, 8), 2, np.float32))
        items = list(c.batch([ops.gemm(a, a, keep_output=True), ops.reduce(a, "sum")]))
        kept = next(i.value for i in items if i.index == 0)
        assert isinstance(kept, gpucompute.Resident) and kept.shape == (8, 8)
        np.testing.assert_array_equal(c.download(kept), np.full((8, 8), 32, np.float32))
        assert next(i.value for i in items if i.index == 1) == 128
        c.free([a, kept])


def test_echo_cannot_go_in_a_batch(client):
    try:
        list(client.batch([ops.echo(np.ones(2, np.float32))]))
        raise AssertionError("expected an error")
    except gpucompute.ComputeError as e:
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "Echo" in e.message
