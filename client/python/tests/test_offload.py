"""Operations whose inline operands reach offload_min_bytes go through resident tensors
(uploaded, run on their handles, the result downloaded, every handle freed): the same bytes,
the same errors as one message, and nothing left on the server, also when a step fails."""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

import gpucompute
import gpucompute.aio
from conftest import DTYPES, Server, random
from test_errors import expect


def cases(dtype: str, rng: np.random.Generator):
    """(name, method, args, kwargs) of every operation, with operands small enough to go inside
    the message and large enough (64 KiB and more) to travel beside it."""
    f = lambda *shape: random(shape, dtype, rng)  # noqa: E731
    return [
        ("gemm", "gemm", (f(37, 41), f(41, 29), f(37, 29)), dict(beta=0.5)),
        ("gemm beside", "gemm", (f(150, 130), f(29, 130)), dict(transpose_b=True, alpha=0.75)),
        ("gemm batched", "gemm", (f(3, 20, 17), f(3, 20, 9)), dict(transpose_a=True)),
        ("gemm to float32", "gemm", (f(16, 64), f(64, 8)), dict(output_dtype="float32")),
        ("gemv", "gemv", (f(33, 17), f(17), f(33)), dict(beta=1.0)),
        ("gemv columns", "gemv", (f(300, 120), f(120, 3)), {}),
        ("reduce axis", "reduce", (f(7, 130), "sum"), dict(axis=1)),
        ("reduce all", "reduce", (f(190, 180), "mean"), {}),
        ("reduce keepdims", "reduce", (f(6, 5, 4), "max"), dict(axis=0, keepdims=True)),
        ("transpose", "transpose", (f(5, 6, 7), (2, 0, 1)), {}),
        ("transpose beside", "transpose", (f(200, 90),), {}),
        ("attention lse", "attention", (f(1, 4, 19, 32), f(1, 2, 23, 32), f(1, 2, 23, 32)),
         dict(causal=True, return_lse=True)),
        ("attention", "attention", (f(2, 2, 40, 64), f(2, 1, 150, 64), f(2, 1, 150, 64)), {}),
    ]


def same(got, want, what: str) -> None:
    """Equal values: arrays of the same dtype, shape, bytes and writability; pairs of them."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{what} [{i}]")
        return
    assert isinstance(got, np.ndarray), f"{what}: {got!r}"
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{got.shape} != {want.dtype}{want.shape}"
    assert got.flags.writeable == want.flags.writeable, what
    assert got.tobytes() == want.tobytes(), f"{what}: the bytes differ"


def count_uploads(client) -> list:
    """Wraps the client's operand upload: the list of the operands it was given."""
    seen = []
    upload = client._upload

    def recording(op, *args, **kwargs):
        seen.append(op)
        return upload(op, *args, **kwargs)

    client._upload = recording
    return seen


def holds_nothing(client, seconds: float = 0.0) -> bool:
    """Whether the client's session holds no tensors (waiting up to `seconds` for the server to
    notice cancelled calls)."""
    end = time.monotonic() + seconds
    while True:
        listed = client.list_tensors()
        if not listed.tensors and listed.used_bytes == 0:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize("dtype", DTYPES)
def test_offloaded_operations_give_the_same_bytes_and_leave_nothing(server, dtype):
    rng = np.random.default_rng(60)
    # Three streams of 4 KiB messages from the first byte: every transfer is split in parts.
    with gpucompute.Client(server.address, session=f"offload-{dtype}", bfloat16="bits",
                           offload_min_bytes=1, streams=3, chunk_bytes=4096,
                           parallel_min_bytes=0) as offload, \
            gpucompute.Client(server.address, session=f"plain-{dtype}", bfloat16="bits",
                              offload_min_bytes=0) as plain:
        uploads = count_uploads(offload)
        plain_uploads = count_uploads(plain)
        for name, method, args, kwargs in cases(dtype, rng):
            before = len(uploads)
            got, timings = getattr(offload, method)(*args, timings=True, **kwargs)
            want = getattr(plain, method)(*args, **kwargs)
            same(got, want, f"{name} {dtype}")
            assert len(uploads) - before == sum(isinstance(a, np.ndarray) for a in args), name
            assert len(timings.shards) > 0, name
        assert plain_uploads == []
        assert holds_nothing(offload)


def test_keep_output_keeps_only_the_result(server):
    rng = np.random.default_rng(61)
    a, b = random((48, 40), "float32", rng), random((40, 24), "float32", rng)
    q, kv = random((1, 2, 9, 32), "float16", rng), random((1, 1, 12, 32), "float16", rng)
    with gpucompute.Client(server.address, session="offload-keep", offload_min_bytes=1) as c, \
            gpucompute.Client(server.address, session="plain-keep", offload_min_bytes=0) as p:
        kept, want = c.gemm(a, b, keep_output=True), p.gemm(a, b, keep_output=True)
        assert isinstance(kept, gpucompute.Resident)
        assert (kept.dtype, kept.shape, kept.nbytes) == (want.dtype, want.shape, want.nbytes)
        assert [t.handle for t in c.list_tensors().tensors] == [kept.handle]
        assert c.download(kept).tobytes() == p.download(want).tobytes()
        c.free(kept)
        p.free(want)
        # Attention keeps both of its results.
        o, lse = c.attention(q, kv, kv, return_lse=True, keep_output=True)
        po, plse = p.attention(q, kv, kv, return_lse=True, keep_output=True)
        assert {t.handle for t in c.list_tensors().tensors} == {o.handle, lse.handle}
        assert c.download(o).tobytes() == p.download(po).tobytes()
        assert c.download(lse).tobytes() == p.download(plse).tobytes()
        c.free([o, lse])
        p.free([po, plse])
        # A resident operand is used as it is: only the inline one is uploaded, and only what
        # the call made is freed.
        ha = c.upload(a)
        uploads = count_uploads(c)
        same(c.gemm(ha, b), p.gemm(a, b), "gemm on a handle")
        assert len(uploads) == 1 and uploads[0].shape == b.shape
        assert [t.handle for t in c.list_tensors().tensors] == [ha.handle]
        c.free(ha)
        assert holds_nothing(c)


def test_refused_requests_get_the_one_message_error_and_leave_nothing(server):
    a = np.ones((30, 20), np.float32)
    q = np.ones((1, 3, 5, 8), np.float32)
    kv = np.ones((1, 2, 6, 8), np.float32)
    bad = [
        (grpc.StatusCode.INVALID_ARGUMENT, "b.shape", lambda c: c.gemm(a, a)),
        (grpc.StatusCode.INVALID_ARGUMENT, "c", lambda c: c.gemm(a, a.T, beta=1.0)),
        (grpc.StatusCode.INVALID_ARGUMENT, "b.dtype", lambda c: c.gemm(a, a.T.astype(np.float16))),
        (grpc.StatusCode.INVALID_ARGUMENT, "x.shape", lambda c: c.gemv(a, np.ones(7, np.float32))),
        (grpc.StatusCode.INVALID_ARGUMENT, "axis", lambda c: c.reduce(a, "sum", axis=5)),
        (grpc.StatusCode.INVALID_ARGUMENT, "perm", lambda c: c.transpose(a, (0, 0))),
        (grpc.StatusCode.INVALID_ARGUMENT, "q.shape", lambda c: c.attention(q, kv, kv)),
        (grpc.StatusCode.INVALID_ARGUMENT, "options.variant",
         lambda c: c.gemm(a, a.T, variant="x")),
        (grpc.StatusCode.INVALID_ARGUMENT, "options.devices",
         lambda c: c.gemm(a, a.T, devices=[99])),
    ]
    with gpucompute.Client(server.address, session="offload-bad", offload_min_bytes=1) as c, \
            gpucompute.Client(server.address, session="plain-bad", offload_min_bytes=0) as p:
        uploads = count_uploads(c)
        for code, field, call in bad:
            with pytest.raises(gpucompute.ComputeError) as one:
                call(p)
            with expect(code, field, one.value.message):
                call(c)
        assert len(uploads) >= len(bad)
        assert holds_nothing(c)


def test_threshold_counts_every_inline_operand(server):
    rng = np.random.default_rng(62)
    small = random((256, 256), "float32", rng)  # 256 KiB
    assert gpucompute.Client(server.address).settings.offload_min_bytes == 64 << 20
    with gpucompute.Client(server.address, session="offload-min",
                           offload_min_bytes=512 << 10) as c:
        uploads = count_uploads(c)
        c.reduce(small, "sum")  # 256 KiB: one message
        assert uploads == []
        c.gemm(small, small)  # 512 KiB in two operands: offloaded
        assert len(uploads) == 2
        h = c.upload(small)
        uploads.clear()
        c.gemm(h, small)  # a resident operand does not count
        assert uploads == []
        c.free(h)
        assert holds_nothing(c)
    with gpucompute.Client(server.address, session="offload-echo", offload_min_bytes=1) as c:
        uploads = count_uploads(c)
        assert c.echo(small).tobytes() == small.tobytes()  # the transport's baseline: never
        assert uploads == []


def test_a_failed_download_frees_every_handle(server):
    from gpucompute.errors import ComputeError
    rng = np.random.default_rng(63)
    q, kv = random((1, 2, 9, 32), "float32", rng), random((1, 1, 12, 32), "float32", rng)
    with gpucompute.Client(server.address, session="offload-fail", offload_min_bytes=1) as c:
        def broken(*args, **kwargs):
            raise ComputeError(grpc.StatusCode.UNAVAILABLE, "download: connection lost")

        c._download = broken
        with expect(grpc.StatusCode.UNAVAILABLE, "connection lost"):
            c.attention(q, kv, kv, return_lse=True)  # two results kept, neither downloaded
        assert holds_nothing(c)


def test_deadline_ends_the_call_and_leaves_nothing(server):
    # 16 MiB operands: the deadline passes while the first one is uploading, which the server
    # then drops. (A deadline passing just as the server finishes an upload or the operation
    # can leave that tensor until its lease expires: the server keeps what it finished.)
    a = np.ones((2048, 2048), np.float32)
    with gpucompute.Client(server.address, session="offload-deadline",
                           offload_min_bytes=1) as c:
        uploads = count_uploads(c)
        with expect(grpc.StatusCode.DEADLINE_EXCEEDED):
            c.gemm(a, a, timeout=0.001)
        assert len(uploads) == 1  # the deadline ends the call: b is not uploaded
        # The server learns of the cancelled upload a little late.
        assert holds_nothing(c, seconds=10)


@pytest.fixture(scope="module")
def small_quota_server():
    s = Server("--resident_quota_bytes=16384")
    yield s
    s.stop()


def test_refused_uploads_fall_back_to_one_message(small_quota_server):
    rng = np.random.default_rng(64)
    big = random((80, 64), "float32", rng)  # 20 KiB: over the quota
    a, b = random((32, 64), "float32", rng), random((64, 48), "float32", rng)  # 8 + 12 KiB
    with gpucompute.Client(small_quota_server.address, session="quota", bfloat16="bits",
                           offload_min_bytes=1) as c:
        uploads = count_uploads(c)
        assert c.transpose(big).tobytes() == big.T.tobytes()  # over the quota
        assert len(uploads) == 1
        # The first operand fits, the second does not: the first is freed, and the call goes
        # as one message.
        with gpucompute.Client(small_quota_server.address, session="quota-plain",
                               bfloat16="bits", offload_min_bytes=0) as p:
            same(c.gemm(a, b), p.gemm(a, b), "gemm half uploaded")
        assert len(uploads) == 3
        assert holds_nothing(c)


def test_asyncio_client_offloads_the_same_way(server, small_quota_server):
    async def main():
        rng = np.random.default_rng(65)
        async with gpucompute.aio.Client(server.address, session="aio-offload",
                                         bfloat16="bits", offload_min_bytes=1, streams=3,
                                         chunk_bytes=4096, parallel_min_bytes=0) as c, \
                gpucompute.aio.Client(server.address, session="aio-plain", bfloat16="bits",
                                      offload_min_bytes=0) as p:
            uploads = count_uploads(c)
            for dtype in DTYPES:
                for name, method, args, kwargs in cases(dtype, rng):
                    got = await getattr(c, method)(*args, **kwargs)
                    same(got, await getattr(p, method)(*args, **kwargs), f"{name} {dtype}")
            assert len(uploads) > 0
            kept = await c.gemm(*cases("float32", rng)[0][2][:2], keep_output=True)
            assert [t.handle for t in (await c.list_tensors()).tensors] == [kept.handle]
            await c.free(kept)
            with expect(grpc.StatusCode.INVALID_ARGUMENT, "b.shape"):
                await c.gemm(np.ones((4, 5), np.float32), np.ones((6, 3), np.float32))

            async def broken(*args, **kwargs):
                raise gpucompute.ComputeError(grpc.StatusCode.UNAVAILABLE, "lost")

            download, c._download = c._download, broken
            with expect(grpc.StatusCode.UNAVAILABLE, "lost"):
                await c.reduce(np.ones((5, 5), np.float32), "sum", axis=0)
            c._download = download
            assert not (await c.list_tensors()).tensors
        async with gpucompute.aio.Client(small_quota_server.address, session="aio-quota",
                                         bfloat16="bits", offload_min_bytes=1) as c:
            big = random((80, 64), "float32", rng)
            assert (await c.transpose(big)).tobytes() == big.T.tobytes()  # over the quota
            assert not (await c.list_tensors()).tensors

    asyncio.run(main())


def test_repeated_fields_are_told_on_every_protobuf_runtime():
    """protobuf 7's descriptors have `is_repeated` and no `label` (the offload once failed on
    them); 3.21's have `label` only."""
    from gpucompute import _offload

    class New:  # protobuf 5.28 and later
        is_repeated = True

    class Old:  # protobuf 3.21
        LABEL_REPEATED = 3
        label = 1

    assert _offload._is_repeated(New())
    assert not _offload._is_repeated(Old())
    from gpucompute.v1 import compute_pb2
    field = compute_pb2.GemmRequest.DESCRIPTOR.fields_by_name["a"]
    assert not _offload._is_repeated(field)
