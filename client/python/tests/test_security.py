"""TLS, mutual TLS and bearer tokens against the real server, with certificates made by
openssl at test time: the Python client's options match what the server expects."""

from __future__ import annotations

import pathlib
import subprocess

import grpc
import numpy as np
import pytest

import gpucompute
from conftest import Server

ALICE = "alice-0123456789abcdef"
BOB = "bob-0123456789abcdef"
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(cwd: pathlib.Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> pathlib.Path:
    """ca.pem, server.pem/key (localhost, 127.0.0.1), client.pem/key (CN carol)."""
    d = tmp_path_factory.mktemp("pki")
    (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    openssl(d, "req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=pytest-ca")
    for name, cn in (("server", "localhost"), ("client", "carol")):
        openssl(d, "req", *EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                f"/CN={cn}")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile",
                f"{name}.ext")
    (d / "tokens").write_text(f"{ALICE} alice\n{BOB} bob\n")
    return d


def tls_client(server: Server, pki: pathlib.Path, **options) -> gpucompute.Client:
    return gpucompute.Client(server.address, use_tls=True, root_certs_path=str(pki / "ca.pem"),
                             retries=False, default_timeout=20, **options)


def test_tokens_over_tls(pki, tmp_path):
    server = Server(f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}",
                    f"--token_file={pki / 'tokens'}")
    try:
        a = np.random.rand(20, 30).astype(np.float32)
        b = np.random.rand(30, 10).astype(np.float32)
        with tls_client(server, pki) as anonymous:
            with pytest.raises(gpucompute.ComputeError) as error:
                anonymous.gemm(a, b)
            assert error.value.code == grpc.StatusCode.UNAUTHENTICATED
            assert "Bearer" in error.value.message
            assert anonymous.health() == "SERVING"  # open to probes by default
        with tls_client(server, pki, token="not-a-token-of-this-server") as wrong:
            with pytest.raises(gpucompute.ComputeError) as error:
                wrong.info()
            assert error.value.code == grpc.StatusCode.UNAUTHENTICATED
        token_file = tmp_path / "alice.token"
        token_file.write_text(ALICE + "\n")
        with tls_client(server, pki, token_file=str(token_file), session="x") as alice, \
                tls_client(server, pki, token=BOB, session="x") as bob:
            assert np.allclose(alice.gemm(a, b), a @ b, rtol=1e-4)
            h = alice.upload(a)
            # The token's identity owns the tensor, not the session.
            assert [t.handle for t in alice.list_tensors().tensors] == [h.handle]
            assert bob.list_tensors().tensors == []
            with pytest.raises(gpucompute.ComputeError) as error:
                bob.download(h)
            assert error.value.code == grpc.StatusCode.NOT_FOUND
            alice.free(h)
    finally:
        server.stop()


def test_mutual_tls(pki):
    server = Server(f"--tls_cert={pki / 'server.pem'}", f"--tls_key={pki / 'server.key'}",
                    f"--tls_client_ca={pki / 'ca.pem'}")
    try:
        with tls_client(server, pki) as no_certificate:
            with pytest.raises(gpucompute.ComputeError) as error:
                no_certificate.info(timeout=10)
            assert error.value.code == grpc.StatusCode.UNAVAILABLE
        with tls_client(server, pki, client_cert_path=str(pki / "client.pem"),
                        client_key_path=str(pki / "client.key")) as carol:
            assert carol.info().backend == "cpu"
    finally:
        server.stop()
