"""Client settings (the C++ ClientOptions' names and checks), channel arguments, credentials."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import math
import os
import secrets
import time
from typing import Any, List, Optional, Sequence, Tuple

import grpc

from gpucompute._tensors import invalid
from gpucompute.errors import ComputeError

SERVICE = "gpucompute.v1.Compute"
SESSION_METADATA_KEY = "gpucompute-session"
# Sent with every unary call: the request's size in bytes, so that the server admits the
# call before receiving the request (or refuses it before it is sent if it can never fit).
REQUEST_BYTES_METADATA_KEY = "gpucompute-request-bytes"
# Most streams of one transfer; room in a transfer message beside its chunk (client.cc).
MAX_STREAMS = 64
MESSAGE_OVERHEAD = 1024
# Where the parts of a parallel transfer begin: a multiple of this (client.h).
TRANSFER_ALIGNMENT = 4096

# Calls that may be repeated without changing what they do: retried on UNAVAILABLE (a replica
# that died, is draining or cannot be reached) and CANCELLED by the server (a replica shutting
# down cancels calls that reach it as it stops), as the C++ client does. (Upload, Free and
# Batch are not: a repeated Free answers NOT_FOUND, a repeated upload or batch item does the
# work twice.) gRPC retries only while the request is still buffered: up to
# RETRY_BUFFER_BYTES per call, as the C++ client's retry_buffer_bytes; larger requests are
# sent once.
IDEMPOTENT = ("Gemm", "Gemv", "Reduce", "Transpose", "Attention", "Echo", "GetServerInfo",
              "ListTensors", "Download")
RETRY_BUFFER_BYTES = 64 << 20
# transfer_processes when a client is not given it (auto_transfer_processes): worker
# processes on machines with at least this many cores (RESULTS.md: on 16-core hosts 8 workers
# moved 1 GiB 1.5-2x faster than threads; on 2 cores, shared with the server, they gained
# nothing), at most this many.
AUTO_TRANSFER_MIN_CORES = 8
AUTO_TRANSFER_MAX_PROCESSES = 8


def auto_transfer_processes() -> int:
    """The transfer_processes of a client not given one: half the cores this process may run
    on, at most AUTO_TRANSFER_MAX_PROCESSES, where there are AUTO_TRANSFER_MIN_CORES or more
    and the platform has memfd (Linux); else 0 (threads)."""
    if not hasattr(os, "memfd_create"):
        return 0
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    if cores < AUTO_TRANSFER_MIN_CORES:
        return 0
    return min(AUTO_TRANSFER_MAX_PROCESSES, cores // 2)


def service_config() -> str:
    names = [{"service": SERVICE, "method": m} for m in IDEMPOTENT]
    names.append({"service": "grpc.health.v1.Health", "method": "Check"})
    return json.dumps({"methodConfig": [{
        "name": names,
        "retryPolicy": {
            "maxAttempts": 4,
            "initialBackoff": "0.05s",
            "maxBackoff": "1s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
        },
    }]})


def _is_ip(kind: Any, text: str) -> bool:
    """Whether `text` is an address of `kind` (ipaddress.IPv4Address or IPv6Address)."""
    try:
        kind(text)
        return True
    except ValueError:
        return False


def channel_target(target: str) -> str:
    """The gRPC target of `target`, as the C++ client's ChannelTarget: a comma-separated list
    of IP addresses ("10.0.0.1:50051,10.0.0.2:50051"; "localhost" is 127.0.0.1; IPv6 in
    brackets) becomes one "ipv4:" or "ipv6:" target over all of them; any other target (one
    address, a name, dns:///name:port, ipv4:..., unix:...) is used as it is. A list is not
    resolved: ComputeError(INVALID_ARGUMENT) names an entry that is not address:port or not an
    IP address, and a list that mixes IPv4 and IPv6."""
    if ("," not in target or "://" in target
            or target.startswith(("ipv4:", "ipv6:", "unix:"))):
        return target
    v4 = v6 = False
    addresses = []
    for item in target.split(","):
        address = item.strip()
        host, colon, port = address.rpartition(":")
        if not colon or not port.isdigit() or not 0 < int(port) <= 65535:
            raise invalid("target", f'"{address}" in the list is not address:port')
        if host == "localhost":
            address, v4 = f"127.0.0.1:{int(port)}", True
        elif _is_ip(ipaddress.IPv4Address, host):
            v4 = True
        elif host[:1] == "[" and host[-1:] == "]" and _is_ip(ipaddress.IPv6Address, host[1:-1]):
            v6 = True
        else:
            raise invalid("target", f'"{host}" in the list is not an IP address (a list is not '
                          "resolved; for names use one dns:///name:port target that resolves "
                          "to every replica)")
        addresses.append(address)
    if v4 and v6:
        raise invalid("target", "a list holds IPv4 or IPv6 addresses, not both")
    return ("ipv4:" if v4 else "ipv6:") + ",".join(addresses)


@dataclasses.dataclass
class Settings:
    """How a client reaches the server; see Client for each field."""

    target: str = "localhost:50051"
    default_timeout: float = 60.0
    max_message_bytes: int = 1 << 30
    lb_policy: str = ""
    use_tls: bool = False
    root_certs_path: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""
    tls_server_name: str = ""
    own_connection: bool = False
    session: str = ""
    token: Optional[str] = None
    token_file: str = ""
    streams: int = 4
    chunk_bytes: int = 4 << 20
    parallel_min_bytes: int = 64 << 20
    offload_min_bytes: int = 64 << 20
    keepalive_seconds: float = 300.0
    retries: bool = True
    bfloat16: str = "auto"
    channel_options: Sequence[Tuple[str, Any]] = ()
    connect_timeout: float = 1.0
    transfer_processes: int = 0
    transfer_staging_bytes: int = 2 << 30

    def check(self) -> None:
        """INVALID_ARGUMENT for inconsistent settings (as the C++ Client::Create); NOT_FOUND
        for a TLS or token file that cannot be read (when the channel is made)."""
        if not self.target:
            raise invalid("target", "empty")
        channel_target(self.target)  # a list of addresses must be IP address:port pairs
        if self.lb_policy not in ("", "round_robin", "pick_first"):
            raise invalid("lb_policy", f'"{self.lb_policy}" is not round_robin or pick_first')
        if self.max_message_bytes <= 0:
            raise invalid("max_message_bytes", "must be positive")
        if not self.default_timeout > 0:
            raise invalid("default_timeout", "must be positive")
        if bool(self.client_cert_path) != bool(self.client_key_path):
            raise invalid("client_cert_path, client_key_path",
                          "give both (mutual TLS) or neither")
        if not self.use_tls and (self.root_certs_path or self.client_cert_path
                                 or self.tls_server_name):
            raise invalid("use_tls", "TLS files or server name given without TLS")
        if not 1 <= self.streams <= MAX_STREAMS:
            raise invalid("streams", f"{self.streams} is not in [1, {MAX_STREAMS}]")
        if self.chunk_bytes < 1:
            raise invalid("chunk_bytes", "must be positive")
        if self.parallel_min_bytes < 0:
            raise invalid("parallel_min_bytes", "negative")
        if any(not 0x20 <= ord(c) <= 0x7E for c in self.session):
            raise invalid("session", "not printable ASCII (it travels as metadata)")
        if self.token is not None and self.token_file:
            raise invalid("token, token_file", "give one or neither")
        if self.bfloat16 not in ("auto", "bits", "ml_dtypes"):
            raise invalid("bfloat16", f"{self.bfloat16!r} is not auto, bits or ml_dtypes")
        if self.keepalive_seconds < 0:
            raise invalid("keepalive_seconds", "negative")
        if not self.connect_timeout >= 0:
            raise invalid("connect_timeout", "negative")
        if not 0 <= self.transfer_processes <= MAX_STREAMS:
            raise invalid("transfer_processes",
                          f"{self.transfer_processes} is not in [0, {MAX_STREAMS}]")
        if self.transfer_staging_bytes < 1:
            raise invalid("transfer_staging_bytes", "must be positive")

    def channel_target(self) -> str:
        """The target the channels connect to (see channel_target())."""
        return channel_target(self.target)

    def listed(self) -> bool:
        """Whether the target is a list of addresses (balanced round_robin by default)."""
        return self.channel_target() != self.target

    def balanced(self) -> bool:
        """Whether calls are spread over several servers (round_robin, also the default for a
        list of addresses): then a resident tensor made by one call may not be on the server
        of the next, so transfers use one stream and operations are not offloaded (as the C++
        client)."""
        if self.lb_policy == "round_robin" or (not self.lb_policy and self.listed()):
            return True
        return any(name == "grpc.lb_policy_name" and value == "round_robin"
                   for name, value in self.channel_options)

    def channel_args(self, connection: Optional[int] = None) -> List[Tuple[str, Any]]:
        """Channel arguments; `connection` i: transfer channel i, on a connection of its own."""
        limit = min(self.max_message_bytes, 2**31 - 1)
        args: List[Tuple[str, Any]] = [
            ("grpc.max_send_message_length", limit),
            ("grpc.max_receive_message_length", limit),
            ("grpc.enable_retries", 1 if self.retries else 0),
            # A failed connection attempt is repeated after 100 ms (gRPC's default: 1 s),
            # growing 1.6x with jitter up to 5 s (gRPC's: 120 s), as in the C++ client.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 5000),
        ]
        if self.retries:
            args += [("grpc.service_config", service_config()),
                     ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES)]
        if self.keepalive_seconds > 0:
            # The server (gRPC's defaults) accepts a ping every 5 minutes at most without
            # data; more often and it closes the connection (too_many_pings).
            args += [("grpc.keepalive_time_ms", int(self.keepalive_seconds * 1000)),
                     ("grpc.keepalive_timeout_ms", 20000),
                     ("grpc.keepalive_permit_without_calls", 0),
                     ("grpc.http2.max_pings_without_data", 0)]
        if self.lb_policy:
            args.append(("grpc.lb_policy_name", self.lb_policy))
        elif self.listed():
            args.append(("grpc.lb_policy_name", "round_robin"))
        if self.tls_server_name:
            args.append(("grpc.ssl_target_name_override", self.tls_server_name))
        if self.own_connection or connection is not None:
            args.append(("grpc.use_local_subchannel_pool", 1))
        if connection is not None:
            # A distinct argument keeps two transfer channels from being taken as equal.
            args.append(("gpucompute.connection", connection))
        args += list(self.channel_options)
        return args

    def credentials(self) -> Optional[grpc.ChannelCredentials]:
        """TLS credentials, or None for a plaintext channel."""
        if not self.use_tls:
            return None
        roots = _read(self.root_certs_path, "root_certs_path") if self.root_certs_path else None
        cert = key = None
        if self.client_cert_path:
            cert = _read(self.client_cert_path, "client_cert_path")
            key = _read(self.client_key_path, "client_key_path")
        return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key,
                                            certificate_chain=cert)

    def unary_metadata(self, payload: bytes) -> Tuple[Tuple[str, str], ...]:
        """The metadata of a unary call carrying `payload`: metadata() and its size."""
        return self.metadata() + ((REQUEST_BYTES_METADATA_KEY, str(len(payload))),)

    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        """The metadata of every call: the session and the bearer token, when set."""
        md = []
        if self.session:
            md.append((SESSION_METADATA_KEY, self.session))
        token = self.token
        if self.token_file:
            token = _read(self.token_file, "token_file").decode().strip()
        if token:
            md.append(("authorization", f"Bearer {token}"))
        return tuple(md)

    def timeout(self, timeout: Optional[float]) -> Optional[float]:
        """gRPC's timeout of a call: None -> the default; math.inf -> none."""
        if timeout is None:
            return self.default_timeout
        if not timeout > 0:
            raise invalid("timeout", f"{timeout} is not positive (math.inf: no deadline)")
        return None if math.isinf(timeout) else float(timeout)

    def connect_wait(self, remaining: Optional[float], wait_for_ready: bool) -> float:
        """Seconds a call with `remaining` seconds before its deadline (None: no deadline) may
        wait for a connection before it is sent: connect_timeout, at most half of what
        remains; 0 for a call that waits for readiness anyway (gRPC's wait_for_ready)."""
        if wait_for_ready or self.connect_timeout <= 0:
            return 0.0
        if remaining is None:
            return self.connect_timeout
        return min(self.connect_timeout, remaining / 2)

    def transfer(self, streams: Optional[int], chunk_bytes: Optional[int]) -> Tuple[int, int]:
        """The streams and chunk size of one transfer: the overrides or the client's (one
        stream over several servers: the parts of one tensor must reach the same one), the
        chunk cut down to fit in a message."""
        s = streams if streams else self.streams
        c = chunk_bytes if chunk_bytes else self.chunk_bytes
        if not 1 <= s <= MAX_STREAMS:
            raise invalid("streams", f"{s} is not in [1, {MAX_STREAMS}]")
        if c < 1:
            raise invalid("chunk_bytes", "must be positive")
        if self.balanced():
            s = 1
        return s, min(c, max(1, self.max_message_bytes - MESSAGE_OVERHEAD))


def wait_connected_blocking(channel: grpc.Channel, seconds: float) -> None:
    """Unless `seconds` is 0 or the channel is connected: asks it to connect and waits up to
    `seconds` for it to be (the call then goes either way). Without this, one failed
    connection attempt fails every call started while gRPC backs off before the next, however
    briefly the server was out of reach; calls that are not retried (Upload, Free, Batch) would
    report UNAVAILABLE for a server that is up.

    It asks the channel's state in the calling thread (grpcio's Cython channel, as grpcio's own
    polling does), not through subscribe(): a subscription's polling thread may find the channel
    closed under it and print a ValueError. Where grpcio has no such channel, the public
    channel_ready_future does it."""
    if seconds <= 0:
        return
    core = getattr(channel, "_channel", None)
    if core is None or not hasattr(core, "watch_connectivity_state"):
        try:
            grpc.channel_ready_future(channel).result(timeout=seconds)
        except grpc.FutureTimeoutError:
            pass
        return
    ready = grpc.ChannelConnectivity.READY.value[0]
    deadline = time.monotonic() + seconds
    try:
        state = core.check_connectivity_state(True)
        while state != ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            core.watch_connectivity_state(state, time.time() + min(remaining, 0.2))
            state = core.check_connectivity_state(True)
    except ValueError:  # the channel was closed meanwhile: the call will say so
        return


async def wait_connected(channel: Any, seconds: float) -> None:
    """As wait_connected_blocking, for a grpc.aio.Channel (whose state is asked without a
    polling thread)."""
    if seconds <= 0:
        return
    if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
        return
    try:
        await asyncio.wait_for(channel.channel_ready(), seconds)
    except asyncio.TimeoutError:
        pass


def _read(path: str, what: str) -> bytes:
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return f.read()
    except OSError as e:
        raise ComputeError(grpc.StatusCode.NOT_FOUND, f"{what}: cannot read {path}: "
                                                      f"{e.strerror}") from None


def split_transfer(nbytes: int, streams: int, parallel_min_bytes: int) -> List[Tuple[int, int]]:
    """How a transfer of `nbytes` is cut into the [begin, end) parts of its streams, as the C++
    SplitTransfer: one part when streams <= 1 or nbytes < parallel_min_bytes (0 bytes
    included); otherwise min(streams, ceil(nbytes / 4096)) parts covering [0, nbytes) in
    order, each beginning at a multiple of 4096, of sizes that differ by at most 4096."""
    if streams <= 1 or nbytes == 0 or nbytes < parallel_min_bytes:
        return [(0, nbytes)]
    units = (nbytes + TRANSFER_ALIGNMENT - 1) // TRANSFER_ALIGNMENT
    parts = min(streams, units)
    return [(units * i // parts * TRANSFER_ALIGNMENT,
             units * (i + 1) // parts * TRANSFER_ALIGNMENT if i + 1 < parts else nbytes)
            for i in range(parts)]


def new_upload_id() -> str:
    """A fresh id for the parts of one upload (128 random bits)."""
    return secrets.token_hex(16)


class Deadline:
    """One deadline shared by the streams of a transfer or the calls of a batch."""

    def __init__(self, timeout: Optional[float]) -> None:
        self._end = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        if self._end is None:
            return None
        return max(0.0, self._end - time.monotonic())
