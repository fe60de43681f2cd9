"""Transfer worker processes: the bytes of large uploads and downloads moved by processes of
their own (Client(transfer_processes=N)).

grpcio turns every message it receives into a `bytes` object (and every one it sends into a
slice) with the interpreter lock held, so the streams of one process share one core's copy
rate however many there are. Workers are separate interpreters, each with its connection:
the client puts an upload's bytes into a staging buffer that they share (a memfd, mapped by
each), and they write a download's bytes straight into it; the client then copies between the
staging buffer and the caller's array on several threads (numpy copies run without the lock).

An upload's bytes are copied into the staging buffer while the workers send them: the
client tells each worker how far its part is ready, a chunk at a time, and the worker builds
each message once its bytes are there (so the copy overlaps the streams instead of coming
before them).

Workers are started with subprocess (`python -m gpucompute._worker_main`), not multiprocessing,
so that the caller's main module is never imported again in them. They read jobs from stdin
and answer on stdout (length-prefixed pickles), and exit when stdin closes (the client
closed, or its process ended).
"""

from __future__ import annotations

import concurrent.futures
import mmap
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc
import numpy as np

from gpucompute import _transfer
from gpucompute._channel import Deadline, split_transfer, wait_connected_blocking
from gpucompute.errors import ComputeError

# The staging buffer: a control page, then the tensor's bytes. The control page holds the
# number of the transfer that is cancelled (8 bytes, little-endian): workers read it before
# each message and stop their call when it is theirs.
_CONTROL_BYTES = 4096
_LENGTH = struct.Struct("<Q")
_COPY_THREADS = 4
_COPY_MIN_BYTES = 8 << 20


def _send(stream: Any, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    """The next value on `stream`, or EOFError when it closed."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    size = _LENGTH.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def parallel_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src for flat uint8 arrays of one size, on up to _COPY_THREADS threads."""
    n = dst.nbytes
    if n < _COPY_MIN_BYTES:
        np.copyto(dst, src)
        return
    step = (n + _COPY_THREADS - 1) // _COPY_THREADS
    threads = [threading.Thread(target=np.copyto, args=(dst[i:i + step], src[i:i + step]))
               for i in range(step, n, step)]
    for t in threads:
        t.start()
    np.copyto(dst[:step], src[:step])
    for t in threads:
        t.join()


class _Staging:
    """A memfd of `size` tensor bytes after the control page, mapped here; workers open it as
    /proc/<pid>/fd/<fd>."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("gpucompute-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, _CONTROL_BYTES + size)
            self.map = mmap.mmap(self.fd, _CONTROL_BYTES + size)
        except OSError:
            os.close(self.fd)
            raise
        self.path = f"/proc/{os.getpid()}/fd/{self.fd}"
        self.data = np.frombuffer(self.map, np.uint8, count=size, offset=_CONTROL_BYTES)

    def cancel(self, transfer: int) -> None:
        self.map[0:8] = transfer.to_bytes(8, "little")

    def close(self) -> None:
        del self.data
        try:
            self.map.close()
        except BufferError:  # a view is still exported: the mapping goes with it
            pass
        os.close(self.fd)


class _Worker:
    """One worker process and the pipe ends the client talks to it through. send() may be
    called from several threads (a job, then an upload's progress); receive() from one."""

    def __init__(self, settings: Any, index: int) -> None:
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpucompute._worker_main"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env, close_fds=True)
        self._broken = False
        self._lock = threading.Lock()
        _send(self.process.stdin, (settings, index))

    def send(self, value: Any) -> bool:
        """Writes `value` to the worker; False (the worker then counts as broken) when its
        pipe failed."""
        try:
            with self._lock:
                _send(self.process.stdin, value)
            return True
        except (OSError, ValueError):
            self._broken = True
            return False

    def receive(self) -> Tuple[Any, ...]:
        """The worker's answer to the job sent: ('ok', value) or ('error', code name,
        message)."""
        try:
            return _receive(self.process.stdout)
        except (EOFError, OSError, ValueError):
            self._broken = True
            return self.exited()

    def exited(self) -> Tuple[Any, ...]:
        return ("error", "UNAVAILABLE",
                f"transfer worker {self.process.pid} exited (status {self.process.poll()})")

    def call(self, job: Tuple[Any, ...]) -> Tuple[Any, ...]:
        """Runs `job` in the worker: ('ok', value) or ('error', code name, message)."""
        return self.receive() if self.send(job) else self.exited()

    def alive(self) -> bool:
        """False once the process has ended or its pipes failed (a killed process may not
        have ended yet when its pipes do)."""
        return not self._broken and self.process.poll() is None

    def discard(self) -> None:
        """Ends a worker that is replaced: killed if it still runs, then reaped."""
        if self.process.poll() is None:
            self.process.kill()
        self.close()

    def close(self) -> None:
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class TransferWorkers:
    """`count` worker processes of one client, started on first use, and their staging buffer
    (grown to the largest transfer, at most `staging_max_bytes`). One transfer uses them at a
    time: acquire() says whether this one may."""

    def __init__(self, settings: Any, count: int, staging_max_bytes: int) -> None:
        self.count = count
        self._settings = settings
        self._staging_max = staging_max_bytes
        self._busy = threading.Lock()
        self._workers: List[_Worker] = []
        self._staging: Optional[_Staging] = None
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._transfer = 0
        self._cancelled = False
        self._closed = False

    def acquire(self, nbytes: int) -> bool:
        """True when a transfer of `nbytes` may go through the workers now (release() after);
        False when they are busy with another, it is larger than the staging limit, or the
        platform has no memfd."""
        if nbytes > self._staging_max or not hasattr(os, "memfd_create"):
            return False
        if not self._busy.acquire(blocking=False):
            return False
        self._cancelled = False
        try:
            if self._closed:
                raise ValueError("closed")
            if self._staging is None or self._staging.size < nbytes:
                if self._staging is not None:
                    self._staging.close()
                    self._staging = None
                self._staging = _Staging(max(nbytes, 1))
            for i, w in enumerate(self._workers):
                if not w.alive():
                    w.discard()
                    self._workers[i] = _Worker(self._settings, i)
            while len(self._workers) < self.count:
                self._workers.append(_Worker(self._settings, len(self._workers)))
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.count, thread_name_prefix="gpucompute-transfer")
        except (OSError, ValueError):
            self._busy.release()
            return False
        return True

    def release(self) -> None:
        self._busy.release()

    def cancel(self) -> None:
        """Stops the streams of the transfer acquired (from another thread): those running
        end, and run() starts none."""
        self._cancelled = True
        staging = self._staging
        if staging is not None:
            staging.cancel(self._transfer)

    @property
    def staging(self) -> np.ndarray:
        assert self._staging is not None
        return self._staging.data

    def run(self, jobs: List[Tuple[Any, ...]], after: Optional[Callable[[int], None]] = None,
            feed: Optional["_Feed"] = None) -> List[Any]:
        """Runs jobs[i] on worker i (each job without its transfer number and staging, which
        are added); the values in order, or the first failure as ComputeError after the other
        jobs were cancelled and finished. after(i) runs here once job i succeeded (a
        download's part copied out while the later ones arrive). feed: an upload's copy into
        the staging buffer, started once every job is sent and stopped at the first failure;
        its jobs wait for it (see _Feed). Called between acquire() and release()."""
        assert self._staging is not None and self._pool is not None
        self._transfer += 1
        transfer = self._transfer
        staging = self._staging
        if self._cancelled:
            raise ComputeError(grpc.StatusCode.CANCELLED, "the transfer was cancelled")
        head = (transfer, staging.path, staging.size)
        futures: Dict[Any, int] = {}
        failure: Optional[Tuple[str, str]] = None

        def settle(done: Any) -> None:
            nonlocal failure
            answer = done.result()
            if answer[0] != "ok":
                if failure is None:
                    failure = (answer[1], answer[2])
                    staging.cancel(transfer)
            elif after is not None and failure is None:
                after(futures[done])

        attempted = 0  # the workers sent their job (or about to be), when fed
        try:
            for i, job in enumerate(jobs):
                w = self._workers[i]
                if feed is None:
                    futures[self._pool.submit(w.call, (job[0],) + head + job[1:])] = i
                else:  # every job is sent before the feed tells any worker of its progress
                    attempted = i + 1
                    sent = w.send((job[0],) + head + job[1:])
                    futures[self._pool.submit(w.receive if sent else w.exited)] = i
            if feed is not None:
                feed.start(self._workers[:attempted])
            for done in concurrent.futures.as_completed(list(futures)):
                settle(done)
                if failure is not None and feed is not None:
                    feed.stop()
        except BaseException:
            # (KeyboardInterrupt included.) The parts sent stop, and their answers are
            # waited for: a worker talks to one transfer at a time.
            staging.cancel(transfer)
            if feed is not None:
                feed.stop()
                if not feed.started:  # the workers sent a job are told it stopped
                    feed.start(self._workers[:attempted])
            concurrent.futures.wait(list(futures))
            raise
        finally:
            if feed is not None:
                feed.join()
        if failure is not None:
            raise ComputeError(getattr(grpc.StatusCode, failure[0], grpc.StatusCode.UNKNOWN),
                               failure[1])
        return [f.result()[1] for f in sorted(futures, key=futures.__getitem__)]

    def close(self) -> None:
        with self._busy:
            self._closed = True
            for w in self._workers:
                w.close()
            self._workers = []
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            if self._staging is not None:
                self._staging.close()
                self._staging = None


class _Feed:
    """An upload's copy into the staging buffer, made while the workers send: parts[i] is
    worker i's. The parts are dealt out among up to _COPY_THREADS threads; each thread copies
    a piece (`piece` bytes) of each of its parts in turn, and after each piece tells that
    part's worker how far it is ready: ("ready", upto), the last with upto = the part's end,
    or ("ready", -1) when the copy stopped first (stop(), or a failure). Every worker is told
    its last before its thread ends, so that no worker waits for bytes that will not come."""

    def __init__(self, src: np.ndarray, staging: np.ndarray, parts: List[Tuple[int, int]],
                 piece: int) -> None:
        self._src, self._staging, self._parts = src, staging, parts
        self._piece = max(piece, 1)
        self._last_told = [False] * len(parts)
        self._stopped = False
        self.started = False
        self._threads: List[threading.Thread] = []
        self._workers: List[_Worker] = []

    def start(self, workers: List[_Worker]) -> None:
        """Starts the copy of the first len(workers) parts, those whose worker was sent its
        job (after stop(): only tells them it stopped)."""
        self.started = True
        self._workers = workers
        n = len(workers)
        k = min(_COPY_THREADS, n)
        self._threads = [threading.Thread(target=self._copy, args=(range(t, n, k),),
                                          name="gpucompute-staging", daemon=True)
                         for t in range(k)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopped = True

    def join(self) -> None:
        for t in self._threads:
            t.join()

    def _copy(self, mine: range) -> None:
        next_at = {i: self._parts[i][0] for i in mine}
        try:
            while next_at and not self._stopped:
                for i in list(next_at):
                    begin, end = next_at[i], min(next_at[i] + self._piece, self._parts[i][1])
                    np.copyto(self._staging[begin:end], self._src[begin:end])
                    if end >= self._parts[i][1]:
                        del next_at[i]
                    else:
                        next_at[i] = end
                    self._tell(i, end)
                    if self._stopped:
                        break
        finally:
            for i in mine:
                self._tell(i, -1)

    def _tell(self, i: int, upto: int) -> None:
        """Only the thread that owns part i calls this (no lock needed for _last_told[i])."""
        if self._last_told[i]:
            return
        self._last_told[i] = upto < 0 or upto >= self._parts[i][1]
        self._workers[i].send(("ready", upto))


def upload(workers: TransferWorkers, op: Any, data: memoryview, device: Optional[int],
           chunk: int, deadline: Any, wait_for_ready: bool) -> Any:
    """An upload's parallel streams run by `workers` (acquired): a part per worker, each
    copied into the staging buffer a chunk at a time while the workers send (_Feed). The
    TensorInfo the server answered."""
    n = data.nbytes
    parts = split_transfer(n, workers.count, 0)
    headers = _transfer.upload_headers(op, parts, device)
    feed = _Feed(np.frombuffer(data, np.uint8), workers.staging, parts, chunk)
    answers = workers.run([("upload", headers[i], begin, end, chunk, deadline, wait_for_ready)
                           for i, (begin, end) in enumerate(parts)], feed=feed)
    return _transfer.same_tensor([_transfer.upload_response(r) for r in answers])


def download(workers: TransferWorkers, handle: str, sink: _transfer.Sink, chunk: int,
             deadline: Any, wait_for_ready: bool) -> None:
    """A download's parallel streams run by `workers` (acquired): a part per worker into the
    staging buffer, each copied into the sink as soon as its worker is done."""
    n = sink.info.bytes
    staging = workers.staging
    parts = split_transfer(n, workers.count, 0)

    def copy_out(i: int) -> None:
        begin, end = parts[i]
        parallel_copy(sink.flat[begin:end], staging[begin:end])

    workers.run([("download", handle, begin, end, n, chunk, deadline, wait_for_ready)
                 for begin, end in parts], after=copy_out)


# The worker process.

class _Mapped:
    """The staging buffer as a worker maps it: put() is a download sink."""

    def __init__(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, _CONTROL_BYTES + size)
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self.view = memoryview(self.map)
        self.data = self.view[_CONTROL_BYTES:]

    def cancelled(self, transfer: int) -> bool:
        return int.from_bytes(self.view[0:8], "little") == transfer

    def put(self, offset: int, data: memoryview) -> None:
        self.data[offset:offset + data.nbytes] = data

    def close(self) -> None:
        self.data.release()
        self.view.release()
        self.map.close()


class _Ready:
    """How far the part of an upload is in the staging buffer, as the client said (-1: it
    stopped copying)."""

    def __init__(self, upto: int) -> None:
        self.upto = upto
        self._changed = threading.Condition()

    def set(self, upto: int) -> None:
        with self._changed:
            self.upto = upto
            self._changed.notify_all()

    def wait(self, upto: int, cancelled: Callable[[], bool]) -> bool:
        """True once the bytes below `upto` are there; False when the copy stopped or the
        transfer was cancelled first."""
        with self._changed:
            while 0 <= self.upto < upto:
                if cancelled():
                    return False
                self._changed.wait(0.05)
            return self.upto >= 0


class _Server:
    """A worker's state: its channel and the staging buffer it mapped last; `jobs`, the pipe
    it reads jobs (and an upload's progress) from."""

    def __init__(self, settings: Any, index: int, jobs: Any) -> None:
        self.settings = settings
        self.jobs = jobs
        args = settings.channel_args(index)
        credentials = settings.credentials()
        target = settings.channel_target()
        self.channel = (grpc.insecure_channel(target, options=args) if credentials is None
                        else grpc.secure_channel(target, credentials, options=args))
        self.mapped: Optional[_Mapped] = None

    def map(self, path: str, size: int) -> _Mapped:
        if self.mapped is None or self.mapped.path != path or self.mapped.size != size:
            if self.mapped is not None:
                self.mapped.close()
            self.mapped = _Mapped(path, size)
        return self.mapped

    def download(self, transfer: int, path: str, size: int, handle: str, begin: int, end: int,
                 tensor_bytes: int, chunk: int, deadline: Deadline, wait_for_ready: bool) -> int:
        """Bytes [begin, end) of `handle` into the staging buffer. (`deadline` is the client's:
        the monotonic clock is the host's.)"""
        mapped = self.map(path, size)
        self._await_connection(deadline, wait_for_ready)
        call = self.channel.unary_stream(_DOWNLOAD)(
            _transfer.download_request(handle, begin, end - begin, chunk),
            timeout=deadline.remaining(),
            metadata=self.settings.metadata(), wait_for_ready=wait_for_ready)
        taken = _transfer.Range(begin, end, end)
        for j, raw in enumerate(call):
            if mapped.cancelled(transfer):
                call.cancel()
                raise ComputeError(grpc.StatusCode.CANCELLED, "another stream failed")
            m, d = _transfer.read_download(raw)
            if j == 0:
                _transfer.check_part(m, handle, tensor_bytes, begin, end)
            taken.take(m, d, mapped)
        taken.finished()
        return end - begin

    def upload(self, transfer: int, path: str, size: int, header: bytes, begin: int, end: int,
               chunk: int, deadline: Deadline, wait_for_ready: bool) -> bytes:
        """One part's Upload stream from the staging buffer, each message built once the
        client said its bytes are there; the UploadResponse. The client's word on the part's
        progress is read to its last ("ready", end or -1) before this returns, so that the
        next job read is a job."""
        ready = _Ready(begin)
        try:
            mapped = self.map(path, size)
            self._await_connection(deadline, wait_for_ready)
            call = self._upload_call(transfer, mapped, ready, header, begin, end, chunk,
                                     deadline, wait_for_ready)
        finally:
            self._follow(ready, end)  # whether or not the call could start
        return call.result()

    def _await_connection(self, deadline: Deadline, wait_for_ready: bool) -> None:
        """Waits, as the client's connect_timeout says, for this worker's connection (as the
        client does for its own channels before a call)."""
        wait_connected_blocking(
            self.channel, self.settings.connect_wait(deadline.remaining(), wait_for_ready))

    def _follow(self, ready: _Ready, end: int) -> None:
        """Reads the client's word on an upload part's progress (ending at `end`) to its
        last."""
        while True:
            word = _receive(self.jobs)
            if word[0] != "ready":
                raise ValueError(f"{word[0]!r} where an upload's progress was due")
            ready.set(word[1])
            if word[1] < 0 or word[1] >= end:
                return

    def _upload_call(self, transfer: int, mapped: _Mapped, ready: _Ready, header: bytes,
                     begin: int, end: int, chunk: int, deadline: Deadline,
                     wait_for_ready: bool) -> Any:
        """The Upload call of one part, its messages built as the bytes come."""
        call: Any = None

        def there(upto: int) -> bool:
            return ready.wait(upto, lambda: mapped.cancelled(transfer))

        def messages() -> Any:
            for message in _transfer.upload_messages(header, mapped.data, (begin, end), chunk,
                                                     there):
                if mapped.cancelled(transfer):
                    break
                yield message
            if ready.upto < end or mapped.cancelled(transfer):
                # The copy stopped or the transfer was cancelled: the part is abandoned, not
                # sent short.
                if call is not None:
                    call.cancel()

        call = self.channel.stream_unary(_UPLOAD).future(
            messages(), timeout=deadline.remaining(), metadata=self.settings.metadata(),
            wait_for_ready=wait_for_ready)
        return call


_SERVICE = "/gpucompute.v1.Compute/"
_DOWNLOAD = _SERVICE + "Download"
_UPLOAD = _SERVICE + "Upload"


def main() -> None:
    """The worker: (settings, index) first, then jobs until stdin closes."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client's Ctrl-C is the client's
    from gpucompute._host_memory import keep_freed_host_memory
    keep_freed_host_memory()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the answer pipe
    try:
        settings, index = _receive(stdin)
    except EOFError:
        return
    server = _Server(settings, index, stdin)
    handlers: Dict[str, Callable[..., Any]] = {"download": server.download,
                                               "upload": server.upload}
    while True:
        try:
            job = _receive(stdin)
        except EOFError:
            return
        if job[0] == "ready":
            # The word on an upload's progress for a job that the client stopped before it
            # was sent: no answer is due.
            continue
        try:
            answer: Tuple[Any, ...] = ("ok", handlers[job[0]](*job[1:]))
        except ComputeError as e:
            answer = ("error", e.code.name, e.message)
        except grpc.RpcError as e:
            error = ComputeError.from_rpc_error(e)
            answer = ("error", error.code.name, error.message)
        except grpc.FutureCancelledError:
            answer = ("error", "CANCELLED", "another stream failed")
        except EOFError:  # the client closed the pipe while an upload waited for its word
            return
        except Exception as e:  # reported to the client, which raises it
            answer = ("error", "INTERNAL", f"transfer worker: {type(e).__name__}: {e}")
        _send(stdout, answer)

