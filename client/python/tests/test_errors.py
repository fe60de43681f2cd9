"""Bad input, deadlines and unreachable servers: exceptions carry the gRPC code and the
field's name."""

from __future__ import annotations

import math
import socket
import time

import grpc
import numpy as np

import gpucompute
from gpucompute import ops


def expect(code: grpc.StatusCode, *needles: str):
    """A context checking that the block raises ComputeError with `code` and a message
    containing each needle."""

    class Check:
        def __enter__(self):
            return self

        def __exit__(self, kind, error, tb):
            assert kind is not None, f"no error; expected {code.name}"
            assert issubclass(kind, gpucompute.ComputeError), f"{kind.__name__}: {error}"
            assert error.code == code, str(error)
            for n in needles:
                assert n in error.message, f"{n!r} not in {error.message!r}"
            return True

    return Check()


def test_server_rejects_mismatched_shapes_naming_the_field(client):
    a = np.ones((4, 5), np.float32)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "b.shape"):
        client.gemm(a, np.ones((6, 3), np.float32))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "x"):
        client.gemv(a, np.ones((7,), np.float32))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "axis"):
        client.reduce(a, "sum", axis=5)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "perm"):
        client.transpose(a, (0, 0))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "b.dtype"):
        client.gemm(a, np.ones((5, 3), np.float16))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "c"):
        client.gemm(a, np.ones((5, 3), np.float32), beta=1.0)  # beta != 0 needs C


def test_client_rejects_what_it_cannot_send_naming_the_argument(client):
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "a:", "float64"):
        client.gemm(np.ones((2, 2)), np.ones((2, 2), np.float32))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "b:", "int32"):
        client.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.int32))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "op:", "median"):
        client.reduce(np.ones(3, np.float32), "median")
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "options.output_dtype"):
        client.gemm(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32),
                    output_dtype="int8")
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "timeout"):
        client.echo(np.ones(2, np.float32), timeout=0)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "input:", "object"):
        client.echo(object())


def test_options_are_checked_like_the_cpp_client(server, tmp_path):
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "streams"):
        gpucompute.Client(server.address, streams=65)
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "client_cert_path, client_key_path"):
        gpucompute.Client(server.address, use_tls=True, client_cert_path="x.pem")
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "use_tls"):
        gpucompute.Client(server.address, root_certs_path="ca.pem")
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "session"):
        gpucompute.Client(server.address, session="caf\u00e9")
    with expect(grpc.StatusCode.NOT_FOUND, "root_certs_path", "missing.pem"):
        gpucompute.Client(server.address, use_tls=True,
                          root_certs_path=str(tmp_path / "missing.pem"))
    with expect(grpc.StatusCode.INVALID_ARGUMENT, "token, token_file"):
        gpucompute.Client(server.address, token="t", token_file="f")


def test_deadline_exceeded(client):
    # Large enough that the call cannot finish in 1 ms on any machine.
    a = np.ones((1024, 1024), np.float32)
    start = time.monotonic()
    with expect(grpc.StatusCode.DEADLINE_EXCEEDED):
        client.gemm(a, a, timeout=0.001)
    assert time.monotonic() - start < 5
    # The same call with room succeeds, and math.inf means no deadline.
    assert client.gemm(a[:64, :64], a[:64, :64], timeout=math.inf)[0, 0] == 64


def test_deadline_covers_a_batch_stream(client):
    a = np.ones((512, 512), np.float32)
    with expect(grpc.StatusCode.DEADLINE_EXCEEDED):
        list(client.batch([ops.gemm(a, a)] * 50, timeout=0.01))


def test_unreachable_server_is_unavailable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with gpucompute.Client(f"127.0.0.1:{port}", default_timeout=5) as c:
        with expect(grpc.StatusCode.UNAVAILABLE):
            c.echo(np.ones(2, np.float32))
        with expect(grpc.StatusCode.DEADLINE_EXCEEDED):
            c.echo(np.ones(2, np.float32), wait_for_ready=True, timeout=0.2)
