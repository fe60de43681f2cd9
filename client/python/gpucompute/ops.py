"""Operation requests: built once from arrays, sent by a Client method or in a Batch stream.

    import gpucompute
    from gpucompute import ops
    requests = [ops.gemm(a, b), ops.reduce(x, "sum", axis=-1)]
    for item in client.batch(requests):
        print(item.request is requests[0], item.result())

Each builder converts its arrays at once (numpy views, no copy where the array is already
contiguous and little-endian) and raises ComputeError(INVALID_ARGUMENT) naming the argument
when one cannot be sent. An operand may be an array, a Resident (from Client.upload or a
kept result) or a handle string.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from gpucompute import _wire
from gpucompute._tensors import (DTypeLike, Operand, dtype_name, from_wire, invalid, operand,
                                 parse_dtype)
from gpucompute.v1 import compute_pb2 as pb

ArrayLike = Any  # numpy array, __dlpack__ / __array__ object, Resident or handle string


@dataclasses.dataclass(frozen=True)
class Resident:
    """A tensor kept on the server, named by its handle; usable as an operand anywhere an array
    is. Made by Client.upload, by an operation with keep_output=True, and listed by
    Client.list_tensors (which also fills device, idle and expiry)."""

    handle: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int
    device: int = -1
    replicas: Tuple[int, ...] = ()
    idle_seconds: float = 0.0
    expires_in_seconds: float = 0.0

    @classmethod
    def from_info(cls, info: pb.TensorInfo) -> "Resident":
        return cls(handle=info.handle, dtype=dtype_name(info.dtype), shape=tuple(info.shape),
                   nbytes=info.bytes, device=info.device, replicas=tuple(info.replicas),
                   idle_seconds=info.idle_seconds, expires_in_seconds=info.expires_in_seconds)

    @classmethod
    def from_tensor(cls, tensor: pb.Tensor) -> "Resident":
        count = 1
        for d in tensor.shape:
            count *= d
        size = 4 if tensor.dtype == pb.FLOAT32 else 2
        return cls(handle=tensor.handle, dtype=dtype_name(tensor.dtype),
                   shape=tuple(tensor.shape), nbytes=count * size)


# The result of an operation: an array (or a Resident with keep_output), attention with
# return_lse a pair (o, lse).
Value = Any


@dataclasses.dataclass
class Request:
    """One operation, ready to send. `method` is the RPC ('Gemm', ...); `message` the request
    without its tensors' bytes, which travel beside it (`tensors`: field number, bytes)."""

    method: str
    message: Any
    tensors: Sequence[Tuple[int, memoryview]]
    # The tensors of the response, by field number; how to turn the response into the value.
    outputs: Tuple[int, ...]
    finish: Callable[[Tuple[Any, ...]], Value]

    def encode(self) -> _wire.Pieces:
        """The serialized request: the message, then each large tensor's bytes (not copied
        yet)."""
        out = _wire.Pieces(self.message.SerializeToString())
        for field, data in self.tensors:
            piece = _wire.tensor_data_field(field, data)
            out.parts.extend(piece.parts)
            out.size += piece.size
        return out

    @property
    def response_spec(self) -> _wire.Spec:
        return {f: _wire.TENSOR for f in self.outputs}


# RPC -> (response class, field of the request and response in BatchRequest/BatchResponse).
RESPONSES: Dict[str, Any] = {
    "Gemm": pb.GemmResponse, "Gemv": pb.GemvResponse, "Reduce": pb.ReduceResponse,
    "Transpose": pb.TransposeResponse, "Attention": pb.AttentionResponse, "Echo": pb.EchoResponse,
}
BATCH_REQUEST_FIELD = {"Gemm": 2, "Gemv": 3, "Reduce": 4, "Transpose": 5, "Attention": 6}
BATCH_RESPONSE_FIELD = {"Gemm": 4, "Gemv": 5, "Reduce": 6, "Transpose": 7, "Attention": 8}
RESPONSE_TENSOR_NAMES = {"Gemm": ("c",), "Gemv": ("y",), "Reduce": ("output",),
                         "Transpose": ("output",), "Attention": ("o", "lse"),
                         "Echo": ("output",)}


def decode(request: Request, response: Any, datas: Dict[_wire.Path, memoryview],
           prefix: _wire.Path, bfloat16: str,
           arrays: Optional[Dict[int, np.ndarray]] = None) -> Value:
    """The value of `response` (a parsed response whose tensors' bytes are in `datas`);
    `arrays`: results by field number that stand for the response's tensors (an offloaded
    call's downloads)."""
    names = RESPONSE_TENSOR_NAMES[request.method]
    values = []
    for field, name in zip(request.outputs, names):
        if arrays and field in arrays:
            values.append(arrays[field])
            continue
        if not response.HasField(name):
            values.append(None)
            continue
        tensor = getattr(response, name)
        if tensor.handle:
            values.append(Resident.from_tensor(tensor))
        else:
            data = datas.get(prefix + (field, _wire.TENSOR_DATA_FIELD))
            if data is None:  # parsed by protobuf (a small response) or empty
                data = memoryview(tensor.data)
            values.append(from_wire(tensor.dtype, tuple(tensor.shape), data, bfloat16, name))
    return request.finish(tuple(values))


def _options(opts: pb.OpOptions, output_dtype: DTypeLike, variant: str,
             devices: Sequence[int], allow_tf32: bool, keep_output: bool) -> None:
    """Sets the options that are not their defaults (an untouched OpOptions is not sent)."""
    if variant:
        opts.variant = variant
    if devices:
        opts.devices.extend(int(d) for d in devices)
    if allow_tf32:
        opts.allow_tf32 = True
    if keep_output:
        opts.keep_output = True
    if output_dtype is not None:
        opts.output_dtype = parse_dtype(output_dtype, "options.output_dtype")


# Tensors smaller than this go into the protobuf message (a copy costs less there than the
# splicing); larger ones travel beside it, copied once (see _wire).
INLINE_BYTES = 64 << 10


def _fill(message: Any, **named: Optional[Operand]) -> List[Tuple[int, memoryview]]:
    """Writes the operands into their fields of `message`: handles, dtypes and shapes, and
    the data of small tensors. Returns (field number, data) of the large tensors, which
    travel beside the message."""
    large = []
    for name, op in named.items():
        if op is None:
            continue
        t = getattr(message, name)
        if op.handle:
            t.handle = op.handle
            continue
        t.dtype = op.dtype
        t.shape.extend(op.shape)
        n = op.data.nbytes if op.data is not None else 0
        if 0 < n < INLINE_BYTES:
            t.data = op.data.tobytes()  # type: ignore[union-attr]
        elif n:
            large.append((message.DESCRIPTOR.fields_by_name[name].number, op.data))
    return large


def _first(values: Tuple[Any, ...]) -> Value:
    return values[0]


def _pair(values: Tuple[Any, ...]) -> Value:
    return values[0], values[1]


def gemm(a: ArrayLike, b: ArrayLike, c: Optional[ArrayLike] = None, *, transpose_a: bool = False,
         transpose_b: bool = False, alpha: Optional[float] = None, beta: float = 0.0,
         output_dtype: DTypeLike = None, variant: str = "", devices: Sequence[int] = (),
         allow_tf32: bool = False, keep_output: bool = False) -> Request:
    """C = alpha * op(A) @ op(B) + beta * C. A: [M, K] (or [K, M] with transpose_a) or batched
    [batch, M, K]; B: [K, N] (or [N, K] with transpose_b) or [batch, K, N]; C (needed when
    beta != 0): [M, N] or [batch, M, N]. A and B of one dtype; the result in output_dtype or
    A's. alpha: 1 when None."""
    msg = pb.GemmRequest(transpose_a=transpose_a, transpose_b=transpose_b, beta=beta)
    large = _fill(msg, a=operand(a, "a"), b=operand(b, "b"),
                  c=None if c is None else operand(c, "c"))
    _options(msg.options, output_dtype, variant, devices, allow_tf32, keep_output)
    if alpha is not None:
        msg.alpha = alpha
    return Request("Gemm", msg, large, (1,), _first)


def gemv(a: ArrayLike, x: ArrayLike, y: Optional[ArrayLike] = None, *, transpose_a: bool = False,
         alpha: Optional[float] = None, beta: float = 0.0, output_dtype: DTypeLike = None,
         variant: str = "", devices: Sequence[int] = (), allow_tf32: bool = False,
         keep_output: bool = False) -> Request:
    """y = alpha * op(A) @ x + beta * y. A: [M, K] (or [K, M] with transpose_a); x: [K] or
    [K, n] with 1 <= n <= 8; y (needed when beta != 0) like the result, [M] or [M, n]."""
    msg = pb.GemvRequest(transpose_a=transpose_a, beta=beta)
    large = _fill(msg, a=operand(a, "a"), x=operand(x, "x"),
                  y=None if y is None else operand(y, "y"))
    _options(msg.options, output_dtype, variant, devices, allow_tf32, keep_output)
    if alpha is not None:
        msg.alpha = alpha
    return Request("Gemv", msg, large, (1,), _first)


_REDUCE_OPS = {"sum": pb.SUM, "max": pb.MAX, "min": pb.MIN, "mean": pb.MEAN}


def reduce(input: ArrayLike, op: str = "sum", *, axis: Optional[int] = None,
           keepdims: bool = False, output_dtype: DTypeLike = None, variant: str = "",
           devices: Sequence[int] = (), keep_output: bool = False) -> Request:
    """'sum', 'max', 'min' or 'mean' of all elements (axis None) or along one axis (negative
    counts from the end), numpy semantics; accumulation in fp32."""
    kind = _REDUCE_OPS.get(op.lower()) if isinstance(op, str) else None
    if kind is None:
        raise invalid("op", f"{op!r} is not one of sum, max, min, mean")
    msg = pb.ReduceRequest(op=kind, keepdims=keepdims)
    large = _fill(msg, input=operand(input, "input"))
    _options(msg.options, output_dtype, variant, devices, False, keep_output)
    if axis is not None:
        msg.has_axis = True
        msg.axis = int(axis)
    return Request("Reduce", msg, large, (1,), _first)


def transpose(input: ArrayLike, perm: Optional[Sequence[int]] = None, *,
              output_dtype: DTypeLike = None, variant: str = "", devices: Sequence[int] = (),
              keep_output: bool = False) -> Request:
    """numpy.transpose of a tensor of rank 1 to 4: output.shape[i] = input.shape[perm[i]];
    perm None reverses the axes."""
    msg = pb.TransposeRequest(perm=[int(p) for p in (perm or ())])
    large = _fill(msg, input=operand(input, "input"))
    _options(msg.options, output_dtype, variant, devices, False, keep_output)
    return Request("Transpose", msg, large, (1,), _first)


def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False,
              scale: float = 0.0, return_lse: bool = False, output_dtype: DTypeLike = None,
              variant: str = "", devices: Sequence[int] = (), allow_tf32: bool = False,
              keep_output: bool = False) -> Request:
    """O = softmax(scale * Q K^T + mask) V. Q: [B, Hq, Sq, D]; K, V: [B, Hkv, Skv, D] with Hq
    a multiple of Hkv. causal: aligned to the bottom-right corner. scale 0: 1/sqrt(D). With
    return_lse the value is (O, LSE) where LSE: [B, Hq, Sq] float32. allow_tf32: float32
    inputs may run on the GPU's flash rungs, which round Q, K and V to bfloat16 (without it
    they run in float32 throughout)."""
    msg = pb.AttentionRequest(causal=causal, scale=scale, return_lse=return_lse)
    large = _fill(msg, q=operand(q, "q"), k=operand(k, "k"), v=operand(v, "v"))
    _options(msg.options, output_dtype, variant, devices, allow_tf32, keep_output)
    return Request("Attention", msg, large, (1, 2), _pair if return_lse else _first)


def echo(input: ArrayLike) -> Request:
    """Echo: the input back unchanged (the transport baseline). Not part of Batch."""
    msg = pb.EchoRequest()
    large = _fill(msg, input=operand(input, "input"))
    return Request("Echo", msg, large, (1,), _first)


def encode_batch_item(request_id: str, request: Request) -> bytes:
    """A serialized BatchRequest carrying `request` with `request_id`."""
    field = BATCH_REQUEST_FIELD.get(request.method)
    if field is None:
        raise invalid("requests", f"{request.method} cannot go in a Batch stream")
    out = _wire.Pieces(pb.BatchRequest(id=request_id).SerializeToString())
    out.add_field(field, request.encode())
    return out.join()


def batch_response_spec() -> _wire.Spec:
    """Where the tensors are in a BatchResponse."""
    spec: _wire.Spec = {}
    for method, field in BATCH_RESPONSE_FIELD.items():
        outputs = (1, 2) if method == "Attention" else (1,)
        spec[field] = {f: _wire.TENSOR for f in outputs}
    return spec


BATCH_RESPONSE_SPEC = batch_response_spec()


__all__ = ["Request", "Resident", "gemm", "gemv", "reduce", "transpose", "attention", "echo"]
