"""The client against a stand-in server written with the generated gRPC stubs
(compute_pb2_grpc), in this process: it needs no server binary, so it checks the client and
the shipped stubs on any grpcio and protobuf runtime (run it where the runtime differs from
Debian's: `python3 -m pytest client/python/tests/test_standin.py`)."""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
import numpy as np
import pytest

import gpucompute
import gpucompute.aio
from gpucompute import ops
from gpucompute.v1 import compute_pb2 as pb
from gpucompute.v1 import compute_pb2_grpc


def _array(t: pb.Tensor) -> np.ndarray:
    assert t.dtype == pb.FLOAT32
    return np.frombuffer(t.data, np.float32).reshape(tuple(t.shape))


def _tensor(x: np.ndarray) -> pb.Tensor:
    return pb.Tensor(dtype=pb.FLOAT32, shape=x.shape, data=x.astype(np.float32).tobytes())


class StandIn(compute_pb2_grpc.ComputeServicer):
    """Echo, float32 Gemm, Batch of Gemms, Upload (in parts), Download, Free."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.tensors = {}
        self.parts = {}

    def Echo(self, request, context):
        return pb.EchoResponse(output=request.input)

    @staticmethod
    def _gemm(request):
        a, b = _array(request.a), _array(request.b)
        if a.shape[1] != b.shape[0]:
            raise ValueError("b.shape: inner dimensions")
        return pb.GemmResponse(c=_tensor(a @ b), timings=pb.Timings(server_seconds=1e-3))

    def Gemm(self, request, context):
        try:
            return self._gemm(request)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def Batch(self, request_iterator, context):
        for item in request_iterator:
            try:
                yield pb.BatchResponse(id=item.id, gemm=self._gemm(item.gemm))
            except ValueError as e:  # the item's error; the stream goes on
                yield pb.BatchResponse(id=item.id, code=3, message=str(e))

    def Upload(self, request_iterator, context):
        header = None
        chunks = []
        for m in request_iterator:
            if m.HasField("header"):
                header = m.header
            chunks.append((m.offset, m.data))
        key = header.upload_id or object()
        with self.lock:
            got = self.parts.setdefault(key, [])
            got.extend(chunks)
            parts = max(1, header.parts)
            self.parts.setdefault((key, "n"), []).append(1)
            self.lock.notify_all()
            self.lock.wait_for(lambda: len(self.parts[(key, "n")]) == parts, timeout=10)
            size = int(np.prod(header.shape)) * 4
            data = bytearray(size)
            for offset, d in got:
                data[offset:offset + len(d)] = d
            handle = f"h{abs(hash(bytes(data))) % 10**12}-{size}"
            self.tensors[handle] = (header, bytes(data))
        return pb.UploadResponse(tensor=pb.TensorInfo(handle=handle, dtype=header.dtype,
                                                      shape=header.shape, bytes=size))

    def Download(self, request, context):
        if request.handle not in self.tensors:
            context.abort(grpc.StatusCode.NOT_FOUND, f"handle: {request.handle}")
        header, data = self.tensors[request.handle]
        end = len(data) if request.length == 0 else request.offset + request.length
        info = pb.TensorInfo(handle=request.handle, dtype=header.dtype, shape=header.shape,
                             bytes=len(data))
        offset, first = request.offset, True
        while first or offset < end:
            n = min(request.chunk_bytes or 4 << 20, end - offset)
            yield pb.DownloadResponse(tensor=info if first else None, offset=offset,
                                      data=data[offset:offset + n])
            first = False
            offset += n

    def Free(self, request, context):
        freed = 0
        for h in request.handles:
            if h not in self.tensors:
                context.abort(grpc.StatusCode.NOT_FOUND, f"handles: {h}")
            freed += len(self.tensors.pop(h)[1])
        return pb.FreeResponse(freed_bytes=freed)


@pytest.fixture(scope="module")
def standin():
    server = grpc.server(futures.ThreadPoolExecutor(16),
                         options=[("grpc.max_receive_message_length", 1 << 30),
                                  ("grpc.max_send_message_length", 1 << 30)])
    compute_pb2_grpc.add_ComputeServicer_to_server(StandIn(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_unary_batch_and_transfers(standin):
    rng = np.random.default_rng(50)
    a = rng.standard_normal((300, 200)).astype(np.float32)  # over ops.INLINE_BYTES: spliced
    b = rng.standard_normal((200, 5)).astype(np.float32)
    with gpucompute.Client(standin, streams=3, parallel_min_bytes=1, chunk_bytes=50_000) as c:
        np.testing.assert_array_equal(c.echo(a), a)
        np.testing.assert_allclose(c.gemm(a, b), a @ b, rtol=1e-5, atol=1e-4)
        with pytest.raises(gpucompute.ComputeError) as e:
            c.gemm(a, a)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        items = sorted(c.batch([ops.gemm(a, b), ops.gemm(b, b), ops.gemm(b.T, a.T)]),
                       key=lambda r: r.index)
        np.testing.assert_allclose(items[0].value, a @ b, rtol=1e-5, atol=1e-4)
        assert items[1].error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert items[2].value.shape == (5, 300)
        h = c.upload(a)
        assert h.nbytes == a.nbytes and h.shape == a.shape
        np.testing.assert_array_equal(c.download(h), a)
        assert c.free(h) == a.nbytes
        with pytest.raises(gpucompute.ComputeError) as e:
            c.download(h)
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_asyncio_client(standin):
    import asyncio

    async def main():
        x = np.arange(100_000, dtype=np.float32)
        async with gpucompute.aio.Client(standin, streams=2, parallel_min_bytes=1) as c:
            np.testing.assert_array_equal(await c.echo(x), x)
            h = await c.upload(x)
            np.testing.assert_array_equal(await c.download(h), x)
            got = [r async for r in c.batch([ops.gemm(x[:4].reshape(2, 2), np.eye(2,
                                                      dtype=np.float32))])]
            np.testing.assert_array_equal(got[0].value, x[:4].reshape(2, 2))

    asyncio.run(main())
