"""The asyncio client: the same calls as coroutines."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

import gpucompute
import gpucompute.aio
from gpucompute import ops
from conftest import assert_close, f64, random


def run(coro):
    return asyncio.run(coro)


def test_operations_and_errors(server):
    async def main():
        rng = np.random.default_rng(30)
        async with gpucompute.aio.Client(server.address, bfloat16="bits") as c:
            a = random((20, 12), "bfloat16", rng)
            b = random((12, 6), "bfloat16", rng)
            out, t = await c.gemm(a, b, timings=True)
            assert out.dtype == np.uint16 and t.server_seconds > 0
            assert_close(out, f64(a) @ f64(b), "bfloat16", 12, np.abs(f64(a)) @ np.abs(f64(b)))
            # Concurrent calls on one client.
            xs = [random((10, 10), "float32", rng) for _ in range(8)]
            sums = await asyncio.gather(*(c.reduce(x, "sum") for x in xs))
            for x, s in zip(xs, sums):
                assert_close(s, f64(x).sum(), "float32", 100, np.abs(f64(x)).sum())
            np.testing.assert_array_equal(await c.transpose(xs[0]), xs[0].T)
            assert (await c.info()).backend == "cpu"
            assert await c.health() == "SERVING"
            try:
                await c.gemm(xs[0], np.ones((3, 3), np.float32))
                raise AssertionError("expected INVALID_ARGUMENT")
            except gpucompute.ComputeError as e:
                assert e.code == grpc.StatusCode.INVALID_ARGUMENT and "b.shape" in e.message
            big = np.ones((1024, 1024), np.float32)
            try:
                await c.gemm(big, big, timeout=0.001)
                raise AssertionError("expected DEADLINE_EXCEEDED")
            except gpucompute.ComputeError as e:
                assert e.code == grpc.StatusCode.DEADLINE_EXCEEDED

    run(main())


def test_resident_tensors_and_batch(server):
    async def main():
        x = np.random.default_rng(31).standard_normal(100_003).astype(np.float32)
        async with gpucompute.aio.Client(server.address, session="aio", streams=3,
                                         parallel_min_bytes=1, chunk_bytes=32768) as c:
            h = await c.upload(x)
            np.testing.assert_array_equal(await c.download(h), x)
            kept = await c.reduce(h, "max", keep_output=True)
            assert isinstance(kept, gpucompute.Resident)
            assert (await c.download(kept)) == x.max()
            assert {t.handle for t in (await c.list_tensors()).tensors} == {h.handle,
                                                                            kept.handle}
            requests = [ops.reduce(h, "sum"), ops.gemm(x[:4].reshape(2, 2), np.eye(3,
                        dtype=np.float32)), ops.reduce(h, "min")]
            items = {}
            async for item in c.batch(requests, max_outstanding=2):
                items[item.index] = item
            assert sorted(items) == [0, 1, 2]
            assert items[1].error.code == grpc.StatusCode.INVALID_ARGUMENT
            assert items[2].value == x.min()
            assert_close(items[0].value, f64(x).sum(), "float32", x.size, np.abs(f64(x)).sum())
            assert await c.free([h, kept]) == x.nbytes + 4
            try:
                await c.download(h)
                raise AssertionError("expected NOT_FOUND")
            except gpucompute.ComputeError as e:
                assert e.code == grpc.StatusCode.NOT_FOUND

    run(main())
