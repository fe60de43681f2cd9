"""Resident tensors: upload, operations on handles, keep_output, download, free."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

import gpucompute
from conftest import assert_close, f64, random
from test_errors import expect


def test_upload_compute_on_handles_keep_download_free(server):
    rng = np.random.default_rng(10)
    with gpucompute.Client(server.address, session="resident-1", bfloat16="bits") as c:
        a = random((96, 40), "float32", rng)
        b = random((40, 24), "float32", rng)
        ha = c.upload(a)
        assert ha.dtype == "float32" and ha.shape == (96, 40) and ha.nbytes == a.nbytes
        hb = c.upload(b)
        kept = c.gemm(ha, hb.handle, keep_output=True)  # a Resident and a handle string
        assert isinstance(kept, gpucompute.Resident)
        assert kept.shape == (96, 24) and kept.dtype == "float32" and kept.nbytes == 96 * 24 * 4
        # The kept result is an operand in turn, without crossing the wire.
        total = c.reduce(kept, "sum")
        product = c.download(kept)
        assert product.flags.writeable and product.shape == (96, 24)
        assert_close(product, f64(a) @ f64(b), "float32", 40, np.abs(f64(a)) @ np.abs(f64(b)))
        assert_close(total, np.sum(f64(product)), "float32", product.size,
                     np.sum(np.abs(f64(product))))
        listed = c.list_tensors()
        assert {t.handle for t in listed.tensors} == {ha.handle, hb.handle, kept.handle}
        assert listed.used_bytes == a.nbytes + b.nbytes + kept.nbytes
        # Another session sees none of them.
        with gpucompute.Client(server.address, session="resident-2") as other:
            with expect(grpc.StatusCode.NOT_FOUND):
                other.download(ha)
            assert other.list_tensors().tensors == []
        assert c.free([ha, hb, kept]) == a.nbytes + b.nbytes + kept.nbytes
        with expect(grpc.StatusCode.NOT_FOUND, ha.handle):
            c.download(ha)
        with expect(grpc.StatusCode.NOT_FOUND):
            c.gemm(ha, b)
        with expect(grpc.StatusCode.NOT_FOUND):
            c.free(hb)
        assert c.list_tensors().used_bytes == 0


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_round_trip_every_dtype_into_out(server, dtype):
    rng = np.random.default_rng(11)
    x = random((33, 17, 5), dtype, rng)
    with gpucompute.Client(server.address, session=f"rt-{dtype}", bfloat16="bits") as c:
        h = c.upload(x)
        np.testing.assert_array_equal(c.download(h), x)
        out = np.empty_like(x)
        assert c.download(h, out=out) is out
        np.testing.assert_array_equal(out, x)
        with expect(grpc.StatusCode.INVALID_ARGUMENT, "out"):
            c.download(h, out=np.empty(3, x.dtype))
        c.free(h)


@pytest.mark.parametrize("streams", [2, 3, 7])
def test_parallel_streams_each_on_its_own_connection(server, streams):
    # parallel_min_bytes lowered so that a small tensor is split; odd sizes leave a short tail.
    x = np.random.default_rng(12).standard_normal(300_001).astype(np.float32)
    with gpucompute.Client(server.address, session=f"par-{streams}", streams=streams,
                           parallel_min_bytes=1, chunk_bytes=65536) as c:
        assert len(gpucompute.split_transfer(x.nbytes, streams, 1)) == streams
        h = c.upload(x)
        assert h.nbytes == x.nbytes
        np.testing.assert_array_equal(c.download(h), x)
        np.testing.assert_array_equal(c.download(h, streams=1), x)
        h1 = c.upload(x, streams=1)
        np.testing.assert_array_equal(c.download(h1, streams=5), x)
        c.free([h, h1])


def test_empty_tensor_and_upload_of_a_handle(server):
    with gpucompute.Client(server.address, session="empty") as c:
        h = c.upload(np.zeros((0, 4), np.float16))
        assert h.nbytes == 0 and h.shape == (0, 4)
        assert c.download(h).shape == (0, 4)
        with expect(grpc.StatusCode.INVALID_ARGUMENT, "array"):
            c.upload(h)
        with expect(grpc.StatusCode.INVALID_ARGUMENT, "handle"):
            c.download("")
        c.free(h)


def test_upload_to_a_device_that_does_not_exist(server):
    with gpucompute.Client(server.address, session="dev") as c:
        with pytest.raises(gpucompute.ComputeError) as e:
            c.upload(np.ones(4, np.float32), device=99)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert c.list_tensors().tensors == []


def test_split_transfer_matches_the_cpp_rules():
    assert gpucompute.split_transfer(0, 4, 0) == [(0, 0)]
    assert gpucompute.split_transfer(100, 4, 1000) == [(0, 100)]
    assert gpucompute.split_transfer(100, 1, 0) == [(0, 100)]
    assert gpucompute.split_transfer(5000, 4, 0) == [(0, 4096), (4096, 5000)]
    for total, streams in ((1 << 30, 4), (3 * 4096 + 7, 3), (10 * 4096, 3), (12345678, 7)):
        parts = gpucompute.split_transfer(total, streams, 0)
        assert parts[0][0] == 0 and parts[-1][1] == total
        assert all(p[1] == q[0] for p, q in zip(parts, parts[1:]))
        assert all(b % 4096 == 0 for b, _ in parts)
        sizes = [e - b for b, e in parts[:-1]]
        assert max(sizes) - min(sizes) <= 4096 if sizes else True


def test_round_robin_transfers_use_one_stream():
    # Over several servers the parts of one tensor could reach different ones (client.cc).
    from gpucompute._channel import Settings
    assert Settings().transfer(None, None)[0] == 4
    assert Settings(lb_policy="round_robin").transfer(8, None)[0] == 1
    assert Settings(channel_options=(("grpc.lb_policy_name", "round_robin"),)).balanced()
    assert not Settings(lb_policy="pick_first").balanced()
