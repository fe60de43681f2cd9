"""The asyncio client (grpc.aio): the blocking Client's methods, as coroutines.

    import asyncio, numpy as np, gpucompute.aio

    async def main():
        async with gpucompute.aio.Client("localhost:50051") as client:
            c = await client.gemm(np.ones((4, 4), np.float32), np.eye(4, dtype=np.float32))
            async for item in client.batch([gpucompute.ops.reduce(c, "sum")]):
                print(item.result())

    asyncio.run(main())

A client belongs to the event loop it is first used on (grpc.aio's rule for channels).
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio
import numpy as np

from gpucompute import _offload, _transfer, _workers, ops
from gpucompute._api import Operations
from gpucompute._batch import BatchResult, Tracker
from gpucompute._channel import (SERVICE, Deadline, Settings, auto_transfer_processes,
                                 split_transfer, wait_connected)
from gpucompute._tensors import Operand, invalid, operand
from gpucompute.client import (HandleLike, TensorList, finish, handle_of, health_request,
                               health_status)
from gpucompute.errors import ComputeError
from gpucompute.ops import ArrayLike, Resident
from gpucompute.v1 import compute_pb2 as pb


class Client(Operations):
    """The asyncio twin of gpucompute.Client: the same options, the same methods (gemm, gemv,
    reduce, transpose, attention, echo, info, health, upload, download, free,
    list_tensors) as coroutines, and batch as an async iterator. Parallel transfer streams
    run as tasks, each on a channel (connection) of its own."""

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
        self._settings.metadata()
        self._channel = self._new_channel(None)
        self._methods: dict = {}
        self._transfer_channels: List[grpc.aio.Channel] = []
        # Transfer worker processes (Client's transfer_processes); their blocking calls run
        # in the event loop's default executor.
        self._transfer_workers: Optional[_workers.TransferWorkers] = None
        if transfer_processes > 0 and not self._settings.balanced():
            self._transfer_workers = _workers.TransferWorkers(
                self._settings, transfer_processes, transfer_staging_bytes)

    @property
    def settings(self) -> Settings:
        return self._settings

    def _new_channel(self, connection: Optional[int]) -> grpc.aio.Channel:
        args = self._settings.channel_args(connection)
        if self._credentials is None:
            return grpc.aio.insecure_channel(self._settings.channel_target(), options=args)
        return grpc.aio.secure_channel(self._settings.channel_target(), self._credentials, options=args)

    def _method(self, kind: str, name: str, channel: Optional[int] = None) -> Any:
        cached = self._methods.get((kind, name, channel))
        if cached is not None:
            return cached
        path = name if name.startswith("/") else f"/{SERVICE}/{name}"
        made = getattr(self._channel_at(channel), kind)(path)
        self._methods[(kind, name, channel)] = made
        return made

    async def _await_connection(self, channel: Optional[int], remaining: Optional[float],
                                wait_for_ready: bool) -> None:
        """As gpucompute.Client's: waits, as connect_timeout says, until the main channel
        (None) or transfer channel `channel` has a connection."""
        seconds = self._settings.connect_wait(remaining, wait_for_ready)
        if seconds <= 0:
            return
        await wait_connected(self._channel_at(channel), seconds)

    def _channel_at(self, channel: Optional[int]) -> grpc.aio.Channel:
        """The main channel (None) or transfer channel `channel`, made on first use."""
        if channel is None:
            return self._channel
        while len(self._transfer_channels) <= channel:
            self._transfer_channels.append(self._new_channel(len(self._transfer_channels)))
        return self._transfer_channels[channel]

    async def _unary(self, name: str, payload: bytes, timeout: Optional[float],
                     wait_for_ready: bool) -> bytes:
        return await self._unary_until(name, payload, Deadline(self._settings.timeout(timeout)),
                                       wait_for_ready)

    async def _unary_until(self, name: str, payload: bytes, deadline: Deadline,
                           wait_for_ready: bool) -> bytes:
        call = self._method("unary_unary", name)
        await self._await_connection(None, deadline.remaining(), wait_for_ready)
        try:
            return await call(payload, timeout=deadline.remaining(),
                              metadata=self._settings.unary_metadata(payload),
                              wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise ComputeError.from_rpc_error(e) from None

    async def _run_async(self, request: ops.Request, timeout: Optional[float],
                         wait_for_ready: bool, timings: bool) -> Any:
        deadline = Deadline(self._settings.timeout(timeout))
        plan = _offload.plan(request, self._settings)
        if plan is not None:
            return await self._run_offloaded(plan, deadline, wait_for_ready, timings)
        raw = await self._unary_until(request.method, request.encode().join(), deadline,
                                      wait_for_ready)
        return finish(request, raw, timings, self._settings.bfloat16)

    async def _run_offloaded(self, plan: _offload.Plan, deadline: Deadline,
                             wait_for_ready: bool, timings: bool) -> Any:
        """As gpucompute.Client's: an operation through resident tensors; every handle it
        made is freed before it returns or raises (cancelled too), except the result with
        keep_output."""
        handles: List[str] = []
        try:
            for _, op in plan.operands:
                try:
                    made = await self._upload(op, None, None, None, deadline, wait_for_ready)
                    handles.append(made.handle)
                except ComputeError as e:
                    if e.code in _offload.FINAL_CODES:
                        raise
                    await self._free_quietly(handles, wait_for_ready)
                    handles = []
                    request = plan.request
                    raw = await self._unary_until(request.method, request.encode().join(),
                                                  deadline, wait_for_ready)
                    return finish(request, raw, timings, self._settings.bfloat16)
            shell = plan.shell(handles)
            raw = await self._unary_until(shell.method, shell.encode().join(), deadline,
                                          wait_for_ready)
            response = ops.RESPONSES[shell.method].FromString(raw)
            arrays: Dict[int, np.ndarray] = {}
            if not plan.keep:
                results = plan.results(response)
                handles += [h for _, h in results]
                for field, h in results:
                    arrays[field] = await self._download(h, None, None, None, deadline,
                                                         wait_for_ready)
            return plan.value(response, arrays, timings, self._settings.bfloat16)
        finally:
            if handles:
                # Shielded: a second cancellation leaves the Free running.
                await asyncio.shield(self._free_quietly(handles, wait_for_ready))

    async def _free_quietly(self, handles: List[str], wait_for_ready: bool) -> None:
        """Frees an offloaded call's handles, with a deadline of its own (FREE_TIMEOUT,
        whatever is left of the call's); a failure here is not the call's."""
        if not handles:
            return
        try:
            await self._unary_until("Free", pb.FreeRequest(handles=handles).SerializeToString(),
                                    Deadline(_offload.FREE_TIMEOUT), wait_for_ready)
        except ComputeError:
            pass

    def _run(self, request: ops.Request, timeout: Optional[float], wait_for_ready: bool,
             timings: bool) -> Any:
        return self._run_async(request, timeout, wait_for_ready, timings)

    async def info(self, *, timeout: Optional[float] = None,
                   wait_for_ready: bool = False) -> pb.ServerInfoResponse:
        """Version, backend, devices, kernel variants per operation and message limits."""
        return pb.ServerInfoResponse.FromString(
            await self._unary("GetServerInfo", b"", timeout, wait_for_ready))

    async def health(self, service: str = "", *, timeout: Optional[float] = None,
                     wait_for_ready: bool = False) -> str:
        """grpc.health.v1 Check: 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN' or 'UNKNOWN'."""
        return health_status(await self._unary("/grpc.health.v1.Health/Check",
                                               health_request(service), timeout,
                                               wait_for_ready))

    async def upload(self, array: ArrayLike, *, device: Optional[int] = None,
                     streams: Optional[int] = None, chunk_bytes: Optional[int] = None,
                     timeout: Optional[float] = None, wait_for_ready: bool = False) -> Resident:
        """As gpucompute.Client.upload."""
        op = operand(array, "array")
        if op.handle:
            raise invalid("array", f"names the resident tensor {op.handle!r} already")
        return await self._upload(op, device, streams, chunk_bytes,
                                  Deadline(self._settings.timeout(timeout)), wait_for_ready)

    async def _upload(self, op: Operand, device: Optional[int], streams: Optional[int],
                      chunk_bytes: Optional[int], deadline: Deadline,
                      wait_for_ready: bool) -> Resident:
        data = op.data if op.data is not None else memoryview(b"")
        n_streams, chunk = self._settings.transfer(streams, chunk_bytes)
        parts = split_transfer(data.nbytes, n_streams, self._settings.parallel_min_bytes)
        workers = self._transfer_workers
        if len(parts) > 1 and workers is not None and workers.acquire(data.nbytes):
            info = await _run_by_workers(workers, _workers.upload, op, data, device, chunk,
                                         deadline, wait_for_ready)
            return Resident.from_info(info)
        headers = _transfer.upload_headers(op, parts, device)
        metadata = self._settings.metadata()

        async def send(i: int) -> bytes:
            async def messages() -> AsyncIterator[bytes]:
                for m in _transfer.upload_messages(headers[i], data, parts[i], chunk):
                    yield m

            call = self._method("stream_unary", "Upload", i)
            await self._await_connection(i, deadline.remaining(), wait_for_ready)
            return await call(messages(), timeout=deadline.remaining(), metadata=metadata,
                              wait_for_ready=wait_for_ready)

        results = await _gather([send(i) for i in range(len(parts))])
        return Resident.from_info(_transfer.same_tensor(
            [_transfer.upload_response(r) for r in results]))

    async def download(self, handle: HandleLike, *, out: Optional[np.ndarray] = None,
                       streams: Optional[int] = None, chunk_bytes: Optional[int] = None,
                       timeout: Optional[float] = None,
                       wait_for_ready: bool = False) -> np.ndarray:
        """As gpucompute.Client.download."""
        h = handle_of(handle, "handle")
        return await self._download(h, out, streams, chunk_bytes,
                                    Deadline(self._settings.timeout(timeout)), wait_for_ready)

    async def _download(self, h: str, out: Optional[np.ndarray], streams: Optional[int],
                        chunk_bytes: Optional[int], deadline: Deadline,
                        wait_for_ready: bool) -> np.ndarray:
        n_streams, chunk = self._settings.transfer(streams, chunk_bytes)
        kwargs = dict(metadata=self._settings.metadata(), wait_for_ready=wait_for_ready)
        await self._await_connection(0, deadline.remaining(), wait_for_ready)
        first = self._method("unary_stream", "Download", 0)(
            _transfer.download_request(h, 0, 0, chunk), timeout=deadline.remaining(), **kwargs)
        try:
            raw = await first.read()
        except grpc.RpcError as e:
            raise ComputeError.from_rpc_error(e) from None
        if raw is grpc.aio.EOF:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"download: the stream of {h!r} ended without a message")
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
            await _run_by_workers(workers, _workers.download, h, sink, chunk, deadline,
                                  wait_for_ready)
            return sink.array

        async def receive_first() -> None:
            taken = _transfer.Range(0, info.bytes, parts[0][1])
            if taken.take(message, data, sink) and taken.until < info.bytes:
                first.cancel()
                return
            while True:  # read(), as for the first message: gRPC does not mix the styles
                raw = await first.read()
                if raw is grpc.aio.EOF:
                    break
                m, d = _transfer.read_download(raw)
                if taken.take(m, d, sink) and taken.until < info.bytes:
                    first.cancel()
                    return
            taken.finished()

        async def receive_part(i: int) -> None:
            begin, end = parts[i]
            await self._await_connection(i, deadline.remaining(), wait_for_ready)
            call = self._method("unary_stream", "Download", i)(
                _transfer.download_request(h, begin, end - begin, chunk),
                timeout=deadline.remaining(), **kwargs)
            taken = _transfer.Range(begin, end, end)
            j = 0
            async for raw in call:
                m, d = _transfer.read_download(raw)
                if j == 0:
                    try:
                        _transfer.check_part(m, info.handle, info.bytes, begin, end)
                    except ComputeError:
                        call.cancel()
                        raise
                taken.take(m, d, sink)
                j += 1
            taken.finished()

        try:
            await _gather([receive_first()] + [receive_part(i) for i in range(1, len(parts))])
        finally:
            first.cancel()
        return sink.array

    async def free(self, handles: Union[HandleLike, Iterable[HandleLike]], *,
                   timeout: Optional[float] = None, wait_for_ready: bool = False) -> int:
        """As gpucompute.Client.free: the bytes freed."""
        items = [handles] if isinstance(handles, (str, Resident)) else list(handles)
        request = pb.FreeRequest(handles=[handle_of(h, f"handles[{i}]")
                                          for i, h in enumerate(items)])
        raw = await self._unary("Free", request.SerializeToString(), timeout, wait_for_ready)
        return pb.FreeResponse.FromString(raw).freed_bytes

    async def list_tensors(self, *, timeout: Optional[float] = None,
                           wait_for_ready: bool = False) -> TensorList:
        """This session's resident tensors, the bytes they hold and its quota."""
        r = pb.ListTensorsResponse.FromString(
            await self._unary("ListTensors", b"", timeout, wait_for_ready))
        return TensorList([Resident.from_info(t) for t in r.tensors], r.used_bytes,
                          r.quota_bytes)

    async def batch(self, requests: Iterable[ops.Request], *, max_outstanding: int = 64,
                    timeout: Optional[float] = None,
                    wait_for_ready: bool = False) -> AsyncIterator[BatchResult]:
        """As gpucompute.Client.batch, as an async iterator (`async for item in ...`)."""
        if max_outstanding < 1:
            raise invalid("max_outstanding", f"{max_outstanding} < 1")
        tracker = Tracker(self._settings.bfloat16)
        room = asyncio.Semaphore(max_outstanding)
        await self._await_connection(None, self._settings.timeout(timeout), wait_for_ready)
        call = self._method("stream_stream", "Batch")(
            timeout=self._settings.timeout(timeout), metadata=self._settings.metadata(),
            wait_for_ready=wait_for_ready)

        async def write() -> None:
            for request in requests:
                await room.acquire()
                await call.write(tracker.encode(request))
            await call.done_writing()

        writer = asyncio.ensure_future(write())
        try:
            while True:
                read = asyncio.ensure_future(call.read())
                await asyncio.wait([read, writer], return_when=asyncio.FIRST_COMPLETED)
                if writer.done() and writer.exception() is not None and not read.done():
                    read.cancel()
                    raise writer.exception()  # type: ignore[misc]
                raw = await read
                if raw is grpc.aio.EOF:
                    break
                result = tracker.decode(raw)
                room.release()
                yield result
            if writer.done() and writer.exception() is not None:
                raise writer.exception()  # type: ignore[misc]
            tracker.check_all_answered()
        except grpc.RpcError as e:
            if writer.done() and not writer.cancelled() and writer.exception() is not None \
                    and not isinstance(writer.exception(), grpc.RpcError):
                raise writer.exception() from None  # type: ignore[misc]
            raise ComputeError.from_rpc_error(e) from None
        finally:
            call.cancel()
            writer.cancel()

    async def close(self) -> None:
        """Closes the channels (calls in flight are cancelled) and ends the transfer
        workers."""
        channels = [self._channel] + self._transfer_channels
        self._transfer_channels = []
        self._methods.clear()
        for ch in channels:
            await ch.close()
        if self._transfer_workers is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._transfer_workers.close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def _gather(coroutines: Sequence[Any]) -> List[Any]:
    """Runs the streams of one transfer as tasks; the first failure cancels the others and is
    raised (as a ComputeError for a gRPC status)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                error = t.exception()
                if isinstance(error, grpc.RpcError):
                    raise ComputeError.from_rpc_error(error) from None
                raise error  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_by_workers(workers: _workers.TransferWorkers, transfer: Any, *args: Any) -> Any:
    """transfer(workers, *args) (_workers.upload or download) on the loop's executor, the
    workers acquired by the caller and released when it returns. A task cancelled meanwhile
    cancels the workers' streams; they are released once those have ended."""
    def run() -> Any:
        try:
            return transfer(workers, *args)
        finally:
            workers.release()

    future = asyncio.get_running_loop().run_in_executor(None, run)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        workers.cancel()
        raise
