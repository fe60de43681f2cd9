"""The bookkeeping of a Batch stream that both clients share: ids out, answers matched back."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Dict, Optional, Tuple

import grpc

from gpucompute import _wire, ops
from gpucompute.errors import ComputeError
from gpucompute.v1 import compute_pb2 as pb


@dataclasses.dataclass
class BatchResult:
    """The answer to one request of a batch.

    request: the gpucompute.ops.Request it answers (the object passed in).
    index: its position in the requests.
    value: the result (as the matching Client method returns it) when it succeeded.
    error: the ComputeError of this item alone when it failed (the stream goes on).
    timings: the response's Timings (None on error).
    latency_seconds: from sending the request to reading its answer.
    """

    request: ops.Request
    index: int
    value: Any = None
    error: Optional[ComputeError] = None
    timings: Any = None
    latency_seconds: float = 0.0

    def result(self) -> Any:
        """The value, or raises the item's error."""
        if self.error is not None:
            raise self.error
        return self.value


class Tracker:
    """The requests sent and not yet answered, by id. Thread-safe."""

    def __init__(self, bfloat16: str) -> None:
        self._lock = threading.Lock()
        self._pending: Dict[str, Tuple[ops.Request, int, float]] = {}
        self._bfloat16 = bfloat16
        self.sent = 0

    def encode(self, request: Any) -> bytes:
        """The BatchRequest of the next request (its id: its index)."""
        if not isinstance(request, ops.Request):
            raise ComputeError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"requests[{self.sent}]: {type(request).__name__} is not a "
                               "gpucompute.ops request (ops.gemm(...), ...)")
        index = self.sent
        request_id = str(index)
        message = ops.encode_batch_item(request_id, request)
        with self._lock:
            self._pending[request_id] = (request, index, time.perf_counter())
        self.sent += 1
        return message

    def decode(self, raw: bytes) -> BatchResult:
        """The result of one BatchResponse. INTERNAL for an unknown or repeated id."""
        now = time.perf_counter()
        if len(raw) < 256 << 10:  # small: protobuf parses it whole, the data included
            rest, datas = raw, {}
        else:
            rest, datas = _wire.strip(raw, ops.BATCH_RESPONSE_SPEC)
        response = pb.BatchResponse.FromString(rest)
        with self._lock:
            entry = self._pending.pop(response.id, None)
        if entry is None:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"batch: the server answered an unknown or repeated id "
                               f"{response.id!r}")
        request, index, sent_at = entry
        result = BatchResult(request=request, index=index, latency_seconds=now - sent_at)
        if response.code != 0:
            result.error = ComputeError(grpc_code(response.code), response.message)
            return result
        which = response.WhichOneof("result")
        field = ops.BATCH_RESPONSE_FIELD[request.method]
        if which is None or pb.BatchResponse.DESCRIPTOR.fields_by_name[which].number != field:
            raise ComputeError(grpc.StatusCode.INTERNAL,
                               f"batch: id {response.id!r} ({request.method}) answered with "
                               f"{which!r}")
        inner = getattr(response, which)
        result.value = ops.decode(request, inner, datas, (field,), self._bfloat16)
        result.timings = inner.timings
        return result

    def unanswered(self) -> int:
        with self._lock:
            return len(self._pending)

    def check_all_answered(self) -> None:
        with self._lock:
            if self._pending:
                first = min(self._pending.values(), key=lambda e: e[1])
                raise ComputeError(grpc.StatusCode.INTERNAL,
                                   f"batch: request {first[1]} was not answered "
                                   f"({len(self._pending)} unanswered)")


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def grpc_code(code: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a google.rpc.Code number."""
    return _CODES.get(code, grpc.StatusCode.UNKNOWN)
