"""The blocking client."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from gpucompute import _offload, _transfer, _wire, _workers, ops
from gpucompute._api import Operations
from gpucompute._batch import BatchResult, Tracker
from gpucompute._channel import (SERVICE, Deadline, Settings, auto_transfer_processes,
                                 split_transfer, wait_connected_blocking)
from gpucompute._tensors import Operand, invalid, operand
from gpucompute.errors import ComputeError
from gpucompute.ops import ArrayLike, Resident
from gpucompute.v1 import compute_pb2 as pb

HandleLike = Union[str, Resident]

_HEALTH = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


@dataclasses.dataclass
class TensorList:
    """This session's resident tensors, the bytes they hold and its quota (0: none)."""

    tensors: List[Resident]
    used_bytes: int
    quota_bytes: int


# Responses smaller than this are parsed by protobuf whole (its copy of the data costs less
# than cutting the data out in Python).
STRIP_BYTES = 256 << 10


def finish(request: ops.Request, raw: bytes, timings: bool, bfloat16: str) -> Any:
    """The value of a unary response (with its Timings when asked for)."""
    if len(raw) < STRIP_BYTES:
        rest, datas = raw, {}
    else:
        rest, datas = _wire.strip(raw, request.response_spec)
    response = ops.RESPONSES[request.method].FromString(rest)
    value = ops.decode(request, response, datas, (), bfloat16)
    return (value, response.timings) if timings else value


def handle_of(h: HandleLike, field: str) -> str:
    value = h.handle if isinstance(h, Resident) else h
    if not isinstance(value, str) or not value:
        raise invalid(field, f"{h!r} is not a handle (a Resident or its handle string)")
    return value


def health_request(service: str) -> bytes:
    data = service.encode()
    return _wire.key(1, _wire.LEN) + _wire.varint(len(data)) + data


def health_status(raw: bytes) -> str:
    status = _wire.find_fields(raw, (1,)).get(1, 0)
    return _HEALTH.get(status, str(status))  # type: ignore[arg-type]


class Client(Operations):
    """A connection to one gpucompute server. Thread-safe: any method may be called from
    many threads at once.

        import numpy as np, gpucompute
        client = gpucompute.Client("localhost:50051")
        c = client.gemm(np.ones((64, 32), np.float32), np.ones((32, 16), np.float32))

    Options (the names of the C++ ClientOptions):
      target: host:port or any gRPC target (dns:///svc:50051 with lb_policy="round_robin"),
        or a comma-separated list of IP address:port pairs (replicas: "10.0.0.1:50051,
        10.0.0.2:50051"), balanced round_robin unless lb_policy says otherwise.
      default_timeout: seconds, the deadline of a call that gives none.
      max_message_bytes: largest message sent or received (the server's default, 1 GiB).
      lb_policy: "round_robin" or "pick_first" (gRPC's load-balancing policy; when empty,
        pick_first for one target, round_robin for a list).
      use_tls, root_certs_path, client_cert_path, client_key_path, tls_server_name: TLS; the
        paths are PEM files (no roots: the system's; client cert and key: mutual TLS, both or
        neither); tls_server_name is checked against the certificate instead of the target.
      own_connection: a connection of this client's own instead of one shared with other
        clients of the same target in this process.
      session: owner of the resident tensors this client makes, sent as "gpucompute-session"
        metadata (printable ASCII). Another session's handles are NOT_FOUND.
      token, token_file: a bearer token (or a file holding one, read at each call) sent as
        "authorization: Bearer <token>" metadata, for a server started with --token_file
        (over TLS); the token's identity then owns the resident tensors, whatever the session.
      streams: streams of a parallel upload or download, each on a connection of its own.
      chunk_bytes: tensor bytes per message of an upload or download stream.
      parallel_min_bytes: transfers smaller than this use one stream.
      offload_min_bytes: an operation (gemm, gemv, reduce, transpose, attention) whose inline
        operands hold at least this many bytes goes through resident tensors: the operands
        are uploaded over parallel streams, the operation runs on their handles, its result
        is downloaded over parallel streams and every handle is freed; the caller gets the
        same value (and error) as from one message. Where the upload is refused (an older
        server, a full quota) the call goes as one message. 0: always one message. Never
        with lb_policy="round_robin".
      keepalive_seconds: ping interval on a connection with calls in flight (0: none); the
        server accepts no more than one ping in 5 minutes without data.
      retries: retry idempotent calls (every operation, Echo, GetServerInfo, ListTensors,
        Download, the health check) that fail UNAVAILABLE or CANCELLED by the server (a
        replica that died, drains or shuts down), up to 4 attempts, each through the
        load-balancing policy again, after 50 ms doubling up to 1 s; requests of up to 64 MiB
        (larger ones are sent once). A call the client cancels is not retried.
      bfloat16: bfloat16 results as 'ml_dtypes' (ml_dtypes.bfloat16 arrays), 'bits' (uint16)
        or 'auto' (ml_dtypes when installed).
      channel_options: extra gRPC channel arguments, (name, value) pairs.
      connect_timeout: seconds a call made while its connection is not up (the first call,
        or one after the server went away) waits for one, at most half its own timeout,
        before it is sent; one that still has none then fails at once with UNAVAILABLE. A
        failed connection attempt is repeated after 0.1 s, growing to 5 s. 0: calls fail at
        once while gRPC backs off after a failed attempt, even when the server is up again.
        Calls with wait_for_ready wait for their deadline instead.
      transfer_processes: 0, or the number of worker processes that move the bytes of
        parallel uploads and downloads (and so of offloaded operations), each over a
        connection of its own, instead of this process's threads. grpcio copies every
        message's bytes with the interpreter lock held, so threads share one core's copy
        rate; processes do not. Started on first use (about 0.2 s), closed with the client;
        one transfer at a time uses them (others meanwhile use threads). Linux (memfd) only.
        None (the default): half the cores this process may use, at most 8, on a machine
        with 8 or more; else 0.
      transfer_staging_bytes: the largest transfer that goes through the worker processes:
        the buffer they share with this process grows to the largest transfer so far (and
        stays mapped until close()); larger transfers use threads.
    Errors: ComputeError(INVALID_ARGUMENT) for inconsistent options, NOT_FOUND for a TLS or
    token file that cannot be read.
    """

    def __init__(self, target: str = "localhost:50051", *, default_timeout: float = 60.0,
                 max_message_bytes: int = 1 << 30, lb_policy: str = "", use_tls: bool = False,
                 root_certs_path: str = "", client_cert_path: str = "",
                 client_key_path: str = "", tls_server_name: str = "",
                 own_connection: bool = False, session: str = "", token: Optional[str] = None,
                 token_file: str = "", streams: int = 4, chunk_bytes: int = 4 << 20,
                 parallel_min_bytes: int = 64 << 20, offload_min_bytes: int = 64 << 20,
                 keepalive_seconds: float = 300.0, retries: bool = True,
                 bfloat16: str = "auto",
                 channel_options: Sequence[Tuple[str, Any]] = (),
                 connect_timeout: float = 1.0, transfer_processes: Optional[int] = None,
                 transfer_staging_bytes: int = 2 << 30) -> None:
        if transfer_processes is None:
            transfer_processes = auto_transfer_processes()
        self._settings = Settings(
            target=target, default_timeout=default_timeout, max_message_bytes=max_message_bytes,
            lb_policy=lb_policy, use_tls=use_tls, root_certs_path=root_certs_path,
            client_cert_path=client_cert_path, client_key_path=client_key_path,
            tls_server_name=tls_server_name, own_connection=own_connection, session=session,
            token=token, token_file=token_file, streams=streams, chunk_bytes=chunk_bytes,
            parallel_min_bytes=parallel_min_bytes, offload_min_bytes=offload_min_bytes,
            keepalive_seconds=keepalive_seconds,
            retries=retries, bfloat16=bfloat16, channel_options=tuple(channel_options),
            connect_timeout=connect_timeout, transfer_processes=transfer_processes,
            transfer_staging_bytes=transfer_staging_bytes)
        self._settings.check()
        self._credentials = self._settings.credentials()
        self._settings.metadata()  # a token file that cannot be read fails here
        self._channel = self._new_channel(None)
        self._methods: dict = {}
        self._lock = threading.Lock()
        self._transfer_channels: List[grpc.Channel] = []
        self._transfer_workers: Optional[_workers.TransferWorkers] = None
        if transfer_processes > 0 and not self._settings.balanced():
            self._transfer_workers = _workers.TransferWorkers(
                self._settings, transfer_processes, transfer_staging_bytes)

    @property
    def settings(self) -> Settings:
        return self._settings

    def _new_channel(self, connection: Optional[int]) -> grpc.Channel:
        args = self._settings.channel_args(connection)
        if self._credentials is None:
            return grpc.insecure_channel(self._settings.channel_target(), options=args)
        return grpc.secure_channel(self._settings.channel_target(), self._credentials, options=args)

    def _method(self, kind: str, name: str, channel: Optional[int] = None) -> Any:
        """The multicallable of `/gpucompute.v1.Compute/name` (bytes in, bytes out) on the
        main channel, or on transfer channel `channel` (made on first use)."""
        with self._lock:
            cached = self._methods.get((kind, name, channel))
            if cached is not None:
                return cached
            path = name if name.startswith("/") else f"/{SERVICE}/{name}"
            made = getattr(self._channel_at(channel), kind)(path)
            self._methods[(kind, name, channel)] = made
            return made

    def _channel_at(self, channel: Optional[int]) -> grpc.Channel:
        """The main channel (None) or transfer channel `channel`, made on first use. Called
        with self._lock held."""
        if channel is None:
            return self._channel
        while len(self._transfer_channels) <= channel:
            self._transfer_channels.append(self._new_channel(len(self._transfer_channels)))
        return self._transfer_channels[channel]

    def _await_connection(self, channel: Optional[int], remaining: Optional[float],
                          wait_for_ready: bool) -> None:
        """Waits, as connect_timeout says, until the main channel (None) or transfer channel
        `channel` has a connection; `remaining`: seconds before the call's deadline."""
        seconds = self._settings.connect_wait(remaining, wait_for_ready)
        if seconds <= 0:
            return
        with self._lock:
            ch = self._channel_at(channel)
        wait_connected_blocking(ch, seconds)

    def _call_kwargs(self, timeout: Optional[float], wait_for_ready: bool) -> dict:
        return dict(timeout=self._settings.timeout(timeout), metadata=self._settings.metadata(),
                    wait_for_ready=wait_for_ready)

    def _unary(self, name: str, payload: bytes, timeout: Optional[float],
               wait_for_ready: bool) -> bytes:
        call = self._method("unary_unary", name)
        self._await_connection(None, self._settings.timeout(timeout), wait_for_ready)
        try:
            return call(payload, timeout=self._settings.timeout(timeout),
                        metadata=self._settings.unary_metadata(payload),
                        wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise ComputeError.from_rpc_error(e) from None

    def _unary_until(self, name: str, payload: bytes, deadline: Deadline,
                     wait_for_ready: bool) -> bytes:
        call = self._method("unary_unary", name)
        self._await_connection(None, deadline.remaining(), wait_for_ready)
        try:
            return call(payload, timeout=deadline.remaining(),
                        metadata=self._settings.unary_metadata(payload),
                        wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise ComputeError.from_rpc_error(e) from None

    def _run(self, request: ops.Request, timeout: Optional[float], wait_for_ready: bool,
             timings: bool) -> Any:
        plan = _offload.plan(request, self._settings)
        if plan is not None:
            return self._run_offloaded(plan, Deadline(self._settings.timeout(timeout)),
                                       wait_for_ready, timings)
        raw = self._unary(request.method, request.encode().join(), timeout, wait_for_ready)
        return finish(request, raw, timings, self._settings.bfloat16)

    def _run_offloaded(self, plan: _offload.Plan, deadline: Deadline, wait_for_ready: bool,
                       timings: bool) -> Any:
        """An operation through resident tensors (see offload_min_bytes); every handle it
        made is freed before it returns or raises, except the result with keep_output."""
        handles: List[str] = []
        try:
            for _, op in plan.operands:
                try:
                    handles.append(self._upload(op, None, None, None, deadline,
                                                wait_for_ready).handle)
                except ComputeError as e:
                    if e.code in _offload.FINAL_CODES:
                        raise
                    self._free_quietly(handles, wait_for_ready)
                    handles = []
                    request = plan.request
                    raw = self._unary_until(request.method, request.encode().join(), deadline,
                                            wait_for_ready)
                    return finish(request, raw, timings, self._settings.bfloat16)
            shell = plan.shell(handles)
            raw = self._unary_until(shell.method, shell.encode().join(), deadline,
                                    wait_for_ready)
            response = ops.RESPONSES[shell.method].FromString(raw)
            arrays: Dict[int, np.ndarray] = {}
            if not plan.keep:
                results = plan.results(response)
                handles += [h for _, h in results]
                for field, h in results:
                    arrays[field] = self._download(h, None, None, None, deadline,
                                                   wait_for_ready)
            return plan.value(response, arrays, timings, self._settings.bfloat16)
        finally:
            self._free_quietly(handles, wait_for_ready)

    def _free_quietly(self, handles: List[str], wait_for_ready: bool) -> None:
        """Frees an offloaded call's handles, with a deadline of its own (FREE_TIMEOUT,
        whatever is left of the call's); a failure here is not the call's."""
        if not handles:
            return
        try:
            self._unary_until("Free", pb.FreeRequest(handles=handles).SerializeToString(),
                              Deadline(_offload.FREE_TIMEOUT), wait_for_ready)
        except ComputeError:
            pass

    def info(self, *, timeout: Optional[float] = None,
             wait_for_ready: bool = False) -> pb.ServerInfoResponse:
        """Version, backend, devices, kernel variants per operation and message limits."""
        raw = self._unary("GetServerInfo", b"", timeout, wait_for_ready)
        return pb.ServerInfoResponse.FromString(raw)

    def health(self, service: str = "", *, timeout: Optional[float] = None,
               wait_for_ready: bool = False) -> str:
        """grpc.health.v1 Check of `service` ("": the server; "gpucompute.v1.Compute"):
        'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN' or 'UNKNOWN'."""
        raw = self._unary("/grpc.health.v1.Health/Check", health_request(service), timeout,
                          wait_for_ready)
        return health_status(raw)

    # Resident tensors.

    def upload(self, array: ArrayLike, *, device: Optional[int] = None,
               streams: Optional[int] = None, chunk_bytes: Optional[int] = None,
               timeout: Optional[float] = None, wait_for_ready: bool = False) -> Resident:
        """Puts `array` on the server and returns its Resident (handle, dtype, shape, bytes,
        device). Transfers of parallel_min_bytes or more go over `streams` streams (default:
        the client's) at once, each on its own connection; the deadline covers the whole
        transfer; when one stream fails the others are cancelled. device: the device to hold
        it (default: the one with the most room). Errors: INVALID_ARGUMENT for an array that
        cannot be sent; RESOURCE_EXHAUSTED over the session's quota or the device's cap."""
        op = operand(array, "array")
        if op.handle:
            raise invalid("array", f"names the resident tensor {op.handle!r} already")
        return self._upload(op, device, streams, chunk_bytes,
                            Deadline(self._settings.timeout(timeout)), wait_for_ready)

    def _upload(self, op: Operand, device: Optional[int], streams: Optional[int],
                chunk_bytes: Optional[int], deadline: Deadline,
                wait_for_ready: bool) -> Resident:
        data = op.data if op.data is not None else memoryview(b"")
        n_streams, chunk = self._settings.transfer(streams, chunk_bytes)
        parts = split_transfer(data.nbytes, n_streams, self._settings.parallel_min_bytes)
        workers = self._transfer_workers
        if len(parts) > 1 and workers is not None and workers.acquire(data.nbytes):
            try:
                return Resident.from_info(_workers.upload(
                    workers, op, data, device, chunk, deadline, wait_for_ready))
            finally:
                workers.release()
        headers = _transfer.upload_headers(op, parts, device)
        metadata = self._settings.metadata()
        group = _Group()
        for i, part in enumerate(parts):
            call = self._method("stream_unary", "Upload", i)
            self._await_connection(i, deadline.remaining(), wait_for_ready)
            future = call.future(_transfer.upload_messages(headers[i], data, part, chunk),
                                 timeout=deadline.remaining(), metadata=metadata,
                                 wait_for_ready=wait_for_ready)
            group.add(future)
        results = group.wait(lambda f: f.result())
        return Resident.from_info(_transfer.same_tensor(
            [_transfer.upload_response(r) for r in results]))

    def download(self, handle: HandleLike, *, out: Optional[np.ndarray] = None,
                 streams: Optional[int] = None, chunk_bytes: Optional[int] = None,
                 timeout: Optional[float] = None, wait_for_ready: bool = False) -> np.ndarray:
        """The resident tensor `handle` as a numpy array of its dtype and shape (bfloat16 per
        the client's bfloat16 setting), written into `out` when given (C-contiguous, writable,
        of the tensor's size). The first stream asks for the whole tensor; its first message
        tells the size, and a transfer of parallel_min_bytes or more then starts the other
        streams on the later parts. Errors: NOT_FOUND for a handle unknown, freed or another
        session's; INVALID_ARGUMENT when `out` does not fit."""
        h = handle_of(handle, "handle")
        return self._download(h, out, streams, chunk_bytes,
                              Deadline(self._settings.timeout(timeout)), wait_for_ready)

    def _download(self, h: str, out: Optional[np.ndarray], streams: Optional[int],
                  chunk_bytes: Optional[int], deadline: Deadline,
                  wait_for_ready: bool) -> np.ndarray:
        n_streams, chunk = self._settings.transfer(streams, chunk_bytes)
        metadata = self._settings.metadata()
        kwargs = dict(metadata=metadata, wait_for_ready=wait_for_ready)
        calls: List[Any] = []
        group = _Group()

        self._await_connection(0, deadline.remaining(), wait_for_ready)
        first = self._method("unary_stream", "Download", 0)(
            _transfer.download_request(h, 0, 0, chunk), timeout=deadline.remaining(), **kwargs)
        calls.append(first)
        try:
            raw = next(first)
        except StopIteration:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"download: the stream of {h!r} ended without a message") from None
        except grpc.RpcError as e:
            raise ComputeError.from_rpc_error(e) from None
        message, data = _transfer.read_download(raw)
        if not message.HasField("tensor"):
            first.cancel()
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"download: the first message for {h!r} has no TensorInfo")
        info = message.tensor
        try:
            sink = _transfer.Sink(info, out, self._settings.bfloat16, h)
        except ComputeError:
            first.cancel()
            raise
        parts = split_transfer(info.bytes, n_streams, self._settings.parallel_min_bytes)
        workers = self._transfer_workers
        if len(parts) > 1 and workers is not None and workers.acquire(info.bytes):
            first.cancel()  # the workers download every byte
            try:
                _workers.download(workers, h, sink, chunk, deadline, wait_for_ready)
                return sink.array
            finally:
                workers.release()

        def receive_first() -> None:
            taken = _transfer.Range(0, info.bytes, parts[0][1])
            if taken.take(message, data, sink) and taken.until < info.bytes:
                first.cancel()
                return
            for raw in first:
                m, d = _transfer.read_download(raw)
                if taken.take(m, d, sink) and taken.until < info.bytes:
                    first.cancel()  # the later bytes are the other streams'
                    return
            taken.finished()

        def receive_part(i: int) -> None:
            begin, end = parts[i]
            self._await_connection(i, deadline.remaining(), wait_for_ready)
            call = self._method("unary_stream", "Download", i)(
                _transfer.download_request(h, begin, end - begin, chunk),
                timeout=deadline.remaining(), **kwargs)
            group.track(call)
            taken = _transfer.Range(begin, end, end)
            for j, raw in enumerate(call):
                m, d = _transfer.read_download(raw)
                if j == 0:
                    _transfer.check_part(m, info.handle, info.bytes, begin, end)
                taken.take(m, d, sink)
            taken.finished()

        group.track(first)
        group.run([receive_first] + [lambda i=i: receive_part(i) for i in range(1, len(parts))])
        return sink.array

    def free(self, handles: Union[HandleLike, Iterable[HandleLike]], *,
             timeout: Optional[float] = None, wait_for_ready: bool = False) -> int:
        """Frees every one of `handles` (one, or several), or none: NOT_FOUND naming the first
        that is unknown, freed already or another session's. Returns the bytes freed."""
        items = [handles] if isinstance(handles, (str, Resident)) else list(handles)
        request = pb.FreeRequest(handles=[handle_of(h, f"handles[{i}]")
                                          for i, h in enumerate(items)])
        raw = self._unary("Free", request.SerializeToString(), timeout, wait_for_ready)
        return pb.FreeResponse.FromString(raw).freed_bytes

    def list_tensors(self, *, timeout: Optional[float] = None,
                     wait_for_ready: bool = False) -> TensorList:
        """This session's resident tensors, the bytes they hold and its quota."""
        raw = self._unary("ListTensors", b"", timeout, wait_for_ready)
        r = pb.ListTensorsResponse.FromString(raw)
        return TensorList([Resident.from_info(t) for t in r.tensors], r.used_bytes,
                          r.quota_bytes)

    # Batch.

    def batch(self, requests: Iterable[ops.Request], *, max_outstanding: int = 64,
              timeout: Optional[float] = None,
              wait_for_ready: bool = False) -> Iterator[BatchResult]:
        """Sends `requests` (gpucompute.ops.gemm(...), ...; any iterable, read as room frees
        up) over one Batch stream and yields a BatchResult per request as its answer comes
        (in any order), matched to its request (result.request, result.index). At most
        `max_outstanding` requests are unanswered at once. A failed item is a result with its
        error; the stream goes on. The deadline (timeout) covers the whole stream. Raises
        ComputeError when the stream itself fails (or INTERNAL when the server answers an
        unknown id or leaves one unanswered); leaving the loop early cancels the stream."""
        if max_outstanding < 1:
            raise invalid("max_outstanding", f"{max_outstanding} < 1")
        tracker = Tracker(self._settings.bfloat16)
        room = threading.Semaphore(max_outstanding)
        stop = threading.Event()
        failure: List[BaseException] = []

        def messages() -> Iterator[bytes]:
            try:
                for request in requests:
                    while not room.acquire(timeout=0.05):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    yield tracker.encode(request)
            except Exception as e:  # reported by the reader, not by gRPC's thread
                failure.append(e)
                stop.set()
                call.cancel()

        self._await_connection(None, self._settings.timeout(timeout), wait_for_ready)
        call = self._method("stream_stream", "Batch")(
            messages(), **self._call_kwargs(timeout, wait_for_ready))
        try:
            for raw in call:
                result = tracker.decode(raw)
                room.release()
                yield result
            if failure:
                raise failure[0]
            tracker.check_all_answered()
        except grpc.RpcError as e:
            if failure:
                raise failure[0] from None
            raise ComputeError.from_rpc_error(e) from None
        finally:
            stop.set()
            call.cancel()

    def close(self) -> None:
        """Closes the channels (calls in flight are cancelled) and ends the transfer
        workers (after the transfer they run, if any)."""
        with self._lock:
            channels = [self._channel] + self._transfer_channels
            self._transfer_channels = []
            self._methods.clear()
        for ch in channels:
            ch.close()
        if self._transfer_workers is not None:
            self._transfer_workers.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Group:
    """The calls of one transfer: the first failure cancels the others and is the one
    reported (their CANCELLED is its consequence)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: List[Any] = []
        self._error: Optional[BaseException] = None

    def add(self, future: Any) -> None:
        self.track(future)
        future.add_done_callback(self._done)

    def track(self, call: Any) -> None:
        with self._lock:
            self._calls.append(call)
            failed = self._error is not None
        if failed:
            call.cancel()

    def _done(self, future: Any) -> None:
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._error is not None:
                return
            self._error = error
            calls = list(self._calls)
        for c in calls:
            c.cancel()

    def raise_error(self) -> None:
        error = self._error
        if error is None:
            return
        if isinstance(error, grpc.RpcError):
            raise ComputeError.from_rpc_error(error) from None
        raise error

    def wait(self, get: Any) -> List[Any]:
        """The results of the futures added, in order, or the first failure."""
        results = []
        for f in list(self._calls):
            try:
                results.append(get(f))
            except (grpc.RpcError, grpc.FutureCancelledError) as e:
                if not isinstance(e, grpc.FutureCancelledError):
                    self.fail(e)
        self.raise_error()
        return results

    def run(self, bodies: List[Any]) -> None:
        """Runs bodies[0] here and the others on threads of their own; raises the first
        failure."""
        def guarded(body: Any) -> None:
            try:
                body()
            except BaseException as e:  # noqa: B902 - reported after the join
                self.fail(e)

        threads = [threading.Thread(target=guarded, args=(b,), daemon=True) for b in bodies[1:]]
        for t in threads:
            t.start()
        guarded(bodies[0])
        for t in threads:
            t.join()
        self.raise_error()
