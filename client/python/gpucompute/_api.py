"""The operation methods both clients share. Each builds its Request (gpucompute.ops) and
hands it to the client's `_run`: the blocking client returns the value, the asyncio client
a coroutine of it."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from gpucompute import ops
from gpucompute._tensors import DTypeLike
from gpucompute.ops import ArrayLike


class Operations:
    """gemm, gemv, reduce, transpose, attention and echo.

    Every method takes, beside the operation's own arguments:
      timeout: seconds from now to the call's deadline (None: the client's default_timeout;
        math.inf: none). DEADLINE_EXCEEDED when it passes.
      wait_for_ready: wait for the server to be reachable instead of failing with
        UNAVAILABLE at once (still bounded by the deadline).
      timings: return (value, timings) where timings is the response's
        gpucompute.v1.compute_pb2.Timings (server, queue, kernel and transfer seconds, per
        shard).
    and the operation options: output_dtype (the result's dtype; default the input's),
    variant (a kernel by name, see info()), devices (indices that may run it),
    keep_output (keep the result on the server: the value is then a Resident instead of an
    array). Arrays come back as numpy arrays over the received message (read-only, no copy;
    np.array(x) for a writable copy); bfloat16 results as ml_dtypes.bfloat16 when installed
    (the client's bfloat16 setting), else as their uint16 bits. A call whose inline operands
    reach the client's offload_min_bytes goes through resident tensors over parallel
    streams, with the same value and errors (see Client).
    """

    def _run(self, request: ops.Request, timeout: Optional[float], wait_for_ready: bool,
             timings: bool) -> Any:
        raise NotImplementedError

    def gemm(self, a: ArrayLike, b: ArrayLike, c: Optional[ArrayLike] = None, *,
             transpose_a: bool = False, transpose_b: bool = False,
             alpha: Optional[float] = None, beta: float = 0.0, output_dtype: DTypeLike = None,
             variant: str = "", devices: Sequence[int] = (), allow_tf32: bool = False,
             keep_output: bool = False, timeout: Optional[float] = None,
             wait_for_ready: bool = False, timings: bool = False) -> Any:
        """C = alpha * op(A) @ op(B) + beta * C (see gpucompute.ops.gemm)."""
        return self._run(ops.gemm(a, b, c, transpose_a=transpose_a, transpose_b=transpose_b,
                                  alpha=alpha, beta=beta, output_dtype=output_dtype,
                                  variant=variant, devices=devices, allow_tf32=allow_tf32,
                                  keep_output=keep_output), timeout, wait_for_ready, timings)

    def gemv(self, a: ArrayLike, x: ArrayLike, y: Optional[ArrayLike] = None, *,
             transpose_a: bool = False, alpha: Optional[float] = None, beta: float = 0.0,
             output_dtype: DTypeLike = None, variant: str = "", devices: Sequence[int] = (),
             allow_tf32: bool = False, keep_output: bool = False,
             timeout: Optional[float] = None, wait_for_ready: bool = False,
             timings: bool = False) -> Any:
        """y = alpha * op(A) @ x + beta * y (see gpucompute.ops.gemv)."""
        return self._run(ops.gemv(a, x, y, transpose_a=transpose_a, alpha=alpha, beta=beta,
                                  output_dtype=output_dtype, variant=variant, devices=devices,
                                  allow_tf32=allow_tf32, keep_output=keep_output),
                         timeout, wait_for_ready, timings)

    def reduce(self, input: ArrayLike, op: str = "sum", *, axis: Optional[int] = None,
               keepdims: bool = False, output_dtype: DTypeLike = None, variant: str = "",
               devices: Sequence[int] = (), keep_output: bool = False,
               timeout: Optional[float] = None, wait_for_ready: bool = False,
               timings: bool = False) -> Any:
        """sum, max, min or mean over everything or one axis (see gpucompute.ops.reduce)."""
        return self._run(ops.reduce(input, op, axis=axis, keepdims=keepdims,
                                    output_dtype=output_dtype, variant=variant,
                                    devices=devices, keep_output=keep_output),
                         timeout, wait_for_ready, timings)

    def transpose(self, input: ArrayLike, perm: Optional[Sequence[int]] = None, *,
                  output_dtype: DTypeLike = None, variant: str = "",
                  devices: Sequence[int] = (), keep_output: bool = False,
                  timeout: Optional[float] = None, wait_for_ready: bool = False,
                  timings: bool = False) -> Any:
        """numpy.transpose(input, perm) for rank 1 to 4 (see gpucompute.ops.transpose)."""
        return self._run(ops.transpose(input, perm, output_dtype=output_dtype, variant=variant,
                                       devices=devices, keep_output=keep_output),
                         timeout, wait_for_ready, timings)

    def attention(self, q: ArrayLike, k: ArrayLike, v: ArrayLike, *, causal: bool = False,
                  scale: float = 0.0, return_lse: bool = False,
                  output_dtype: DTypeLike = None, variant: str = "",
                  devices: Sequence[int] = (), allow_tf32: bool = False,
                  keep_output: bool = False,
                  timeout: Optional[float] = None, wait_for_ready: bool = False,
                  timings: bool = False) -> Any:
        """softmax(scale Q K^T + mask) V; (O, LSE) with return_lse (see
        gpucompute.ops.attention)."""
        return self._run(ops.attention(q, k, v, causal=causal, scale=scale,
                                       return_lse=return_lse, output_dtype=output_dtype,
                                       variant=variant, devices=devices,
                                       allow_tf32=allow_tf32, keep_output=keep_output),
                         timeout, wait_for_ready, timings)

    def echo(self, input: ArrayLike, *, timeout: Optional[float] = None,
             wait_for_ready: bool = False, timings: bool = False) -> Any:
        """The input back unchanged: the transport's cost without any compute."""
        return self._run(ops.echo(input), timeout, wait_for_ready, timings)
