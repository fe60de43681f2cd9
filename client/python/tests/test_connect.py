"""Calls made while the server cannot be reached yet: connect_timeout, as in the C++ client."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import grpc
import numpy as np
import pytest

import gpucompute
import gpucompute.aio
from conftest import Server


def unused_port() -> int:
    """A loopback port nobody listens on (unless someone takes it meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_later(address: str, servers: list, seconds: float = 0.5) -> threading.Thread:
    def start() -> None:
        time.sleep(seconds)
        servers.append(Server(f"--listen={address}"))

    t = threading.Thread(target=start)
    t.start()
    return t


@pytest.mark.parametrize("processes", [0, 3])
def test_calls_wait_for_a_server_that_comes_up_late(processes):
    if processes and not hasattr(os, "memfd_create"):
        pytest.skip("transfer worker processes need memfd (Linux)")
    address = f"127.0.0.1:{unused_port()}"
    a = np.arange(3 * 1024, dtype=np.float32)
    # Without the wait an upload (never retried) fails on the refused connection.
    with gpucompute.Client(address, connect_timeout=0, retries=False,
                           transfer_processes=processes) as impatient:
        with pytest.raises(gpucompute.ComputeError) as error:
            impatient.upload(a)
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
    servers: list = []
    starter = start_later(address, servers)
    try:
        with gpucompute.Client(address, connect_timeout=30, retries=False, streams=3,
                               parallel_min_bytes=0, transfer_processes=processes) as patient:
            began = time.monotonic()
            # Three streams, each on a connection of its own (or three workers, each with
            # its own).
            h = patient.upload(a)
            assert time.monotonic() - began >= 0.4
            np.testing.assert_array_equal(patient.download(h), a)
            patient.free(h)
    finally:
        starter.join()
        for s in servers:
            s.stop()
    assert len(servers) == 1


def test_aio_calls_wait_for_a_server_that_comes_up_late():
    address = f"127.0.0.1:{unused_port()}"
    a = np.arange(2 * 1024, dtype=np.float32)

    async def main() -> None:
        async with gpucompute.aio.Client(address, connect_timeout=30, retries=False,
                                         streams=2, parallel_min_bytes=0) as patient:
            h = await patient.upload(a)
            np.testing.assert_array_equal(await patient.download(h), a)
            await patient.free(h)

    servers: list = []
    starter = start_later(address, servers)
    try:
        asyncio.run(main())
    finally:
        starter.join()
        for s in servers:
            s.stop()


def test_nobody_listening_fails_after_the_connect_timeout():
    address = f"127.0.0.1:{unused_port()}"
    with gpucompute.Client(address, connect_timeout=0.4, retries=False,
                           default_timeout=30) as client:
        began = time.monotonic()
        with pytest.raises(gpucompute.ComputeError) as error:
            client.info()
        took = time.monotonic() - began
        assert error.value.code == grpc.StatusCode.UNAVAILABLE
        assert 0.35 <= took < 10
        # At most half the call's own timeout: what fails is the connection, not the deadline.
        with gpucompute.Client(address, connect_timeout=30, retries=False) as halved:
            began = time.monotonic()
            with pytest.raises(gpucompute.ComputeError) as error:
                halved.info(timeout=2)
            assert error.value.code == grpc.StatusCode.UNAVAILABLE
            assert 0.9 <= time.monotonic() - began < 2


def test_a_negative_connect_timeout_is_invalid():
    with pytest.raises(gpucompute.ComputeError) as error:
        gpucompute.Client("localhost:1", connect_timeout=-1)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "connect_timeout" in error.value.message
