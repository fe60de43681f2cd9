"""Inputs other than numpy arrays (__dlpack__, __array__, tensors on another device), array
layouts, bfloat16 conversions, and the metadata every call carries (and a unary call's
request size)."""

from __future__ import annotations

from concurrent import futures

import grpc
import numpy as np
import pytest

import gpucompute
from gpucompute import _wire, ops
from gpucompute.v1 import compute_pb2 as pb
from conftest import assert_close, f64


class DLPackOnly:
    """Exposes only the DLPack protocol (as a CPU torch tensor does), over a numpy array."""

    def __init__(self, array):
        self._array = array
        self.dlpack_calls = 0

    def __dlpack__(self, stream=None, **kwargs):
        self.dlpack_calls += 1
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


class ArrayOnly:
    """Exposes only __array__ (as many array libraries do)."""

    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None):
        return self._array if dtype is None else self._array.astype(dtype)


class OnDevice:
    """A tensor on a device the host cannot read (DLPack device 2, kDLCUDA); .cpu() copies it
    to the host, as torch.Tensor.cpu() does."""

    def __init__(self, array):
        self._array = array
        self.copied = False

    def __dlpack__(self, stream=None, **kwargs):
        raise AssertionError("device memory must not be read through DLPack by the host")

    def __dlpack_device__(self):
        return (2, 0)

    def cpu(self):
        self.copied = True
        return DLPackOnly(self._array)


def test_dlpack_array_and_device_inputs(client):
    rng = np.random.default_rng(40)
    a = rng.uniform(-1, 1, (12, 7)).astype(np.float32)
    b = rng.uniform(-1, 1, (7, 5)).astype(np.float32)
    ref, mag = f64(a) @ f64(b), np.abs(f64(a)) @ np.abs(f64(b))
    dl = DLPackOnly(a)
    assert_close(client.gemm(dl, ArrayOnly(b)), ref, "float32", 7, mag)
    assert dl.dlpack_calls == 1
    dev = OnDevice(a)
    assert_close(client.gemm(dev, b), ref, "float32", 7, mag)
    assert dev.copied
    np.testing.assert_array_equal(client.echo(ArrayOnly(a.astype(np.float16))),
                                  a.astype(np.float16))


def test_dlpack_input_is_not_copied():
    a = np.arange(256 * 128, dtype=np.float32).reshape(256, 128)  # over ops.INLINE_BYTES
    op = ops.gemm(DLPackOnly(a), a.T)  # the request holds views of the arrays' memory
    data = dict(op.tensors)
    assert np.shares_memory(np.frombuffer(data[1], np.float32), a)


def test_layouts_that_need_a_copy_are_sent_right(client):
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    np.testing.assert_array_equal(client.echo(x.T), x.T)            # Fortran order
    np.testing.assert_array_equal(client.echo(x[:, ::3]), x[:, ::3])  # strided
    big_endian = x.astype(">f4")
    out = client.echo(big_endian)
    assert out.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(out, x)


def test_scalars_keep_rank_zero(client):
    # A 0-d array (or numpy scalar) is sent as shape [] and comes back 0-d, not as shape [1].
    for x in (np.float32(2.5), np.array(-1.5, dtype=np.float16), np.array(3.0, dtype=">f4")):
        out = client.echo(x)
        assert out.shape == () and out == x
    assert client.reduce(np.float32(4.0), "max").shape == ()
    with pytest.raises(gpucompute.ComputeError) as e:
        client.transpose(np.float32(1.0))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "rank 0" in e.value.message


def test_bfloat16_conversions():
    values = np.array([0.0, -0.0, 1.0, -1.5, 3.140625, 1e-40, np.inf, -np.inf, 65504.0],
                      np.float32)
    bits = gpucompute.float32_to_bfloat16(values)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(gpucompute.bfloat16_to_float32(bits)[:5],
                                  values[:5])  # exactly representable
    # Round to nearest even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7, rounds to 1.
    assert gpucompute.float32_to_bfloat16(np.float32(1 + 2**-8)) == 0x3F80
    assert gpucompute.float32_to_bfloat16(np.float32(1 + 3 * 2**-8)) == 0x3F82
    assert np.isnan(gpucompute.bfloat16_to_float32(gpucompute.float32_to_bfloat16(np.nan)))
    assert gpucompute.parse_dtype("bf16") == gpucompute.BFLOAT16
    assert gpucompute.parse_dtype(np.float16) == gpucompute.FLOAT16
    assert gpucompute.parse_dtype(np.uint16) == gpucompute.BFLOAT16
    with pytest.raises(gpucompute.ComputeError):
        gpucompute.parse_dtype("float64")


def test_wire_splicing_round_trips_through_protobuf():
    small = np.arange(6, dtype=np.float32).reshape(2, 3)          # inside the message
    a = np.arange(200 * 300, dtype=np.float32).reshape(200, 300)  # spliced beside it
    op = ops.gemm(a, "t123", small, alpha=2.0, transpose_b=True, keep_output=True)
    assert [field for field, _ in op.tensors] == [1]
    parsed = pb.GemmRequest.FromString(op.encode().join())
    assert parsed.a.dtype == pb.FLOAT32 and list(parsed.a.shape) == [200, 300]
    assert parsed.a.data == a.tobytes() and parsed.c.data == small.tobytes()
    assert parsed.b.handle == "t123" and parsed.b.data == b""
    assert parsed.alpha == 2.0 and parsed.transpose_b and parsed.options.keep_output
    # A response: tensors cut out as views, the rest parsed by protobuf.
    resp = pb.AttentionResponse(o=pb.Tensor(dtype=pb.FLOAT16, shape=[2], data=b"\x01\x02\x03\x04"),
                                lse=pb.Tensor(dtype=pb.FLOAT32, shape=[1], data=b"abcd"),
                                timings=pb.Timings(server_seconds=1.5))
    raw = resp.SerializeToString()
    rest, datas = _wire.strip(raw, {1: _wire.TENSOR, 2: _wire.TENSOR})
    stripped = pb.AttentionResponse.FromString(rest)
    assert stripped.o.data == b"" and list(stripped.o.shape) == [2]
    assert stripped.timings.server_seconds == 1.5
    assert bytes(datas[(1, 3)]) == b"\x01\x02\x03\x04" and bytes(datas[(2, 3)]) == b"abcd"
    with pytest.raises(ValueError):
        _wire.strip(raw[:-3], {1: _wire.TENSOR})


class _Recorder(grpc.GenericRpcHandler):
    """A stand-in server that records each call's metadata and answers Echo with its input."""

    def __init__(self):
        self.metadata = []

    def service(self, details):
        if details.method != "/gpucompute.v1.Compute/Echo":
            return None

        def echo(request, context):
            self.metadata.append(dict(context.invocation_metadata()))
            return pb.EchoResponse(output=request.input).SerializeToString()

        return grpc.unary_unary_rpc_method_handler(
            echo, request_deserializer=pb.EchoRequest.FromString)


def test_session_and_token_metadata(tmp_path):
    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[recorder])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        x = np.ones(3, np.float32)
        with gpucompute.Client(f"127.0.0.1:{port}", session="me", token="s3cret") as c:
            np.testing.assert_array_equal(c.echo(x), x)
        token_file = tmp_path / "token"
        token_file.write_text("from-file\n")
        with gpucompute.Client(f"127.0.0.1:{port}", token_file=str(token_file)) as c:
            c.echo(x)
        with gpucompute.Client(f"127.0.0.1:{port}") as c:
            c.echo(x)
    finally:
        server.stop(None)
    first, second, third = recorder.metadata
    assert first["gpucompute-session"] == "me"
    assert first["authorization"] == "Bearer s3cret"
    assert second["authorization"] == "Bearer from-file" and "gpucompute-session" not in second
    assert "authorization" not in third and "gpucompute-session" not in third
    # Every unary call declares its request's size, for the server's admission.
    request = pb.EchoRequest(input=pb.Tensor(dtype=pb.FLOAT32, shape=[3], data=x.tobytes()))
    assert third["gpucompute-request-bytes"] == str(request.ByteSize())
