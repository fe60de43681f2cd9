"""The real gpucompute-server on a free loopback port, started once per test session, and
the float64 checks the tests share.

The server binary: $GPUCOMPUTE_TEST_SERVER (ctest sets it to the build's), else
build/release/server/gpucompute-server of this checkout. $GPUCOMPUTE_TEST_SERVER_ARGS
(space-separated) adds server flags, as in the C++ integration tests.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "client" / "python"))

import gpucompute  # noqa: E402


class Server:
    """One running gpucompute-server; stopped (SIGKILL) by stop()."""

    def __init__(self, *args: str) -> None:
        binary = os.environ.get("GPUCOMPUTE_TEST_SERVER") or str(
            ROOT / "build" / "release" / "server" / "gpucompute-server")
        if not os.path.exists(binary):
            pytest.fail(f"no server binary at {binary} (build first, or set "
                        "GPUCOMPUTE_TEST_SERVER)")
        self.dir = tempfile.TemporaryDirectory(prefix="gpucompute-pytest-")
        ready = os.path.join(self.dir.name, "ready.json")
        self.log_path = os.path.join(self.dir.name, "server.log")
        argv = [binary, "--listen=127.0.0.1:0", "--metrics_listen=", f"--ready_file={ready}",
                "--backend=cpu", *args, *os.environ.get("GPUCOMPUTE_TEST_SERVER_ARGS", "").split()]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with open(ready) as f:
                    info = json.load(f)
                self.port = info["grpc_port"]
                self.metrics_port = info.get("metrics_port", 0)  # 0: no metrics endpoint
                if self.port > 0:
                    break
            except (OSError, ValueError, KeyError):
                pass
            if self.process.poll() is not None:
                pytest.fail(f"the server exited ({self.process.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server was not ready in 30 s:\n{self.log()}")
            time.sleep(0.02)
        self.address = f"127.0.0.1:{self.port}"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.dir.cleanup()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = Server("--cpu_devices=2")
    yield s
    s.stop()


@pytest.fixture()
def client(server: Server) -> Iterator[gpucompute.Client]:
    with gpucompute.Client(server.address, default_timeout=30, bfloat16="bits") as c:
        yield c


DTYPES = ["float32", "float16", "bfloat16"]
# Relative rounding error of one result element (half an ulp, doubled for safety).
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
ACCUMULATE_EPS = 2.0**-23  # the server accumulates in fp32


def random(shape, dtype: str, rng: np.random.Generator, low: float = -1.0,
           high: float = 1.0) -> np.ndarray:
    """Uniform values of `dtype` (bfloat16: uint16 bits)."""
    x = rng.uniform(low, high, size=shape).astype(np.float32)
    if dtype == "bfloat16":
        return gpucompute.float32_to_bfloat16(x)
    return x.astype(dtype)


def f64(x) -> np.ndarray:
    """float64 values of an array of any of the wire dtypes (uint16: bfloat16 bits)."""
    x = np.asarray(x)
    if x.dtype == np.uint16 or x.dtype.name == "bfloat16":
        return gpucompute.bfloat16_to_float32(x).astype(np.float64)
    return x.astype(np.float64)


def assert_close(out, ref: np.ndarray, dtype: str, depth: int = 1, magnitude=None) -> None:
    """|out - ref| <= atol + rtol |ref| elementwise: rtol the rounding of a `dtype` result,
    atol fp32 accumulation over `depth` terms of total magnitude `magnitude` (the sum of the
    terms' absolute values; default |ref|)."""
    got = f64(out)
    assert got.shape == ref.shape, f"shape {got.shape} != {ref.shape}"
    mag = np.abs(ref) if magnitude is None else magnitude
    tol = 2 * depth * ACCUMULATE_EPS * mag + EPS[dtype] * np.abs(ref) + 1e-30
    err = np.abs(got - ref)
    bad = ~(err <= tol)
    assert not bad.any(), (f"{bad.sum()} of {bad.size} elements off; worst error "
                           f"{err.max():.3g} where the tolerance is {tol.flat[np.argmax(err)]:.3g}")
