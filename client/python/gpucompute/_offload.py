"""Large inline operations sent through resident tensors, as the C++ client's offload
(ClientOptions::offload_min_bytes): the operands are uploaded over parallel streams, the
operation runs on their handles keeping its result, the result is downloaded over parallel
streams and every handle is freed. The caller sees the value one message would have given.

This module holds what the blocking and the asyncio client share; each runs the calls."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import grpc
import numpy as np

from gpucompute import ops
from gpucompute._channel import Settings
from gpucompute._tensors import Operand

# The operations that may be offloaded (Echo is the transport's baseline: never).
OPERATIONS = ("Gemm", "Gemv", "Reduce", "Transpose", "Attention")
# An upload failing with these ends the call; any other refusal (an older server without
# uploads, a full quota or device, an operand the upload rejects) sends it as one message,
# which the server then answers or refuses naming the field (client.cc).
FINAL_CODES = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
# Seconds given to the Free of an offloaded call's handles, whatever is left of its deadline.
FREE_TIMEOUT = 10.0

_TENSOR = "gpucompute.v1.Tensor"


@dataclasses.dataclass
class Plan:
    """An operation to offload: its request and its inline operands (field name, operand)."""

    request: ops.Request
    operands: List[Tuple[str, Operand]]

    @property
    def keep(self) -> bool:
        """Whether the caller asked to keep the result on the server."""
        return bool(self.request.message.options.keep_output)

    def shell(self, handles: List[str]) -> ops.Request:
        """The request on the uploaded operands' handles (each with its dtype and shape),
        keeping its result."""
        message = type(self.request.message)()
        message.CopyFrom(self.request.message)
        for (name, op), handle in zip(self.operands, handles):
            t = getattr(message, name)
            t.Clear()
            t.handle = handle
            t.dtype = op.dtype
            t.shape.extend(op.shape)
        message.options.keep_output = True
        r = self.request
        return ops.Request(r.method, message, (), r.outputs, r.finish)

    def results(self, response: Any) -> List[Tuple[int, str]]:
        """(field number, handle) of each result the shell's response kept."""
        out: List[Tuple[int, str]] = []
        names = ops.RESPONSE_TENSOR_NAMES[self.request.method]
        for field, name in zip(self.request.outputs, names):
            if response.HasField(name) and getattr(response, name).handle:
                out.append((field, getattr(response, name).handle))
        return out

    def value(self, response: Any, arrays: Dict[int, np.ndarray], timings: bool,
              bfloat16: str) -> Any:
        """The call's value: the downloaded results (read-only, as a response's), or the
        kept ones' Residents."""
        for a in arrays.values():
            a.flags.writeable = False
        value = ops.decode(self.request, response, {}, (), bfloat16, arrays)
        return (value, response.timings) if timings else value


def _is_repeated(field) -> bool:
    """Whether `field` is repeated: `is_repeated` on protobuf 5.28 and later (whose newest
    runtimes have no `label`), `label` on older ones (Debian's 3.21)."""
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == field.LABEL_REPEATED


def plan(request: ops.Request, settings: Settings) -> Optional[Plan]:
    """The Plan of a request whose inline operands hold offload_min_bytes or more, else None
    (one message): offload_min_bytes <= 0, an operation that is not offloaded, or calls
    spread over several servers (round_robin)."""
    least = settings.offload_min_bytes
    if least <= 0 or request.method not in OPERATIONS:
        return None
    beside = dict(request.tensors)  # field number -> bytes travelling beside the message
    # At most three operands inside the message, each under INLINE_BYTES: most calls stop here.
    if sum(d.nbytes for d in beside.values()) + 3 * ops.INLINE_BYTES < least:
        return None
    if settings.balanced():
        return None
    operands: List[Tuple[str, Operand]] = []
    total = 0
    for field, t in request.message.ListFields():
        if field.message_type is None or field.message_type.full_name != _TENSOR or \
                _is_repeated(field) or t.handle:
            continue
        data = beside.get(field.number)
        if data is None:
            if not t.data:
                continue
            data = memoryview(t.data)
        if not data.nbytes:
            continue
        operands.append((field.name, Operand(dtype=t.dtype, shape=tuple(t.shape), data=data)))
        total += data.nbytes
    if not operands or total < least:
        return None
    return Plan(request, operands)
