"""Arrays in and out: numpy, objects with __dlpack__ or __array__ (PyTorch tensors), bfloat16."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple, Union

import grpc
import numpy as np

from gpucompute.errors import ComputeError
from gpucompute.v1 import compute_pb2 as pb

try:  # optional: a numpy dtype for bfloat16
    import ml_dtypes as _ml_dtypes

    BFLOAT16_DTYPE: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16_DTYPE = None

# Server dtype <-> numpy dtype of the bytes on the wire (little-endian). bfloat16 travels as
# its raw bits: uint16 arrays are taken as bfloat16 bits (no other dtype of the server is 16-bit
# unsigned).
_NUMPY_OF = {
    pb.FLOAT32: np.dtype("<f4"),
    pb.FLOAT16: np.dtype("<f2"),
    pb.BFLOAT16: np.dtype("<u2"),
}
_NAMES = {pb.FLOAT32: "float32", pb.FLOAT16: "float16", pb.BFLOAT16: "bfloat16"}
_PARSE = {
    "float32": pb.FLOAT32, "f32": pb.FLOAT32, "fp32": pb.FLOAT32,
    "float16": pb.FLOAT16, "f16": pb.FLOAT16, "fp16": pb.FLOAT16, "half": pb.FLOAT16,
    "bfloat16": pb.BFLOAT16, "bf16": pb.BFLOAT16,
}

DTypeLike = Union[str, int, np.dtype, type, None]


def invalid(field: str, what: str) -> ComputeError:
    """The INVALID_ARGUMENT error of a bad argument, named like the server's (`field: what`)."""
    return ComputeError(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {what}")


def dtype_name(dtype: int) -> str:
    """'float32', 'float16', 'bfloat16' or 'unspecified'."""
    return _NAMES.get(dtype, "unspecified")


def parse_dtype(value: DTypeLike, field: str = "dtype") -> int:
    """A server dtype (compute_pb2.DType value) from a name ('float32'/'fp32'/'f32',
    'float16'/'fp16'/'half', 'bfloat16'/'bf16'), a numpy dtype (float32, float16, uint16 for
    bfloat16 bits, ml_dtypes.bfloat16) or a DType value. INVALID_ARGUMENT otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value in _NAMES:
        return value
    if isinstance(value, str):
        parsed = _PARSE.get(value.lower())
        if parsed is not None:
            return parsed
    try:
        dt = np.dtype(value)  # type: ignore[arg-type]
    except TypeError:
        dt = None
    if dt is not None:
        parsed = _of_numpy(dt)
        if parsed is not None:
            return parsed
    raise invalid(field, f"{value!r} is not one of float32, float16, bfloat16")


def _of_numpy(dt: np.dtype) -> Optional[int]:
    if dt.kind == "f" and dt.itemsize == 4:
        return pb.FLOAT32
    if dt.kind == "f" and dt.itemsize == 2:
        return pb.FLOAT16
    if dt.kind == "u" and dt.itemsize == 2:
        return pb.BFLOAT16
    if dt.name == "bfloat16":  # ml_dtypes.bfloat16 (kind 'V')
        return pb.BFLOAT16
    return None


def to_numpy(obj: Any, field: str) -> np.ndarray:
    """A numpy view of `obj` (a copy only where one is needed): numpy arrays as they are;
    PyTorch tensors (CPU, or CUDA through a host copy; bfloat16 as its bits); other objects
    through __dlpack__ (CPU memory; another device through their .cpu()) or __array__."""
    if isinstance(obj, np.ndarray):
        return obj
    module = type(obj).__module__ or ""
    if module.startswith("torch"):
        return _torch_to_numpy(obj)
    if hasattr(obj, "__dlpack__"):
        device = obj.__dlpack_device__()[0] if hasattr(obj, "__dlpack_device__") else 1
        if device not in (1, 3):  # kDLCPU, kDLCUDAHost: readable by the host
            if not hasattr(obj, "cpu"):
                raise invalid(field, f"a tensor on DLPack device type {device} without .cpu()")
            return to_numpy(obj.cpu(), field)
        try:
            return np.from_dlpack(obj)
        except (BufferError, TypeError, RuntimeError) as e:  # e.g. a dtype numpy lacks
            if not hasattr(obj, "__array__"):
                raise invalid(field, f"cannot be read through DLPack ({e}); pass a numpy "
                                     "array (bfloat16: its uint16 bits)") from None
    if hasattr(obj, "__array__"):
        return np.asarray(obj)
    if isinstance(obj, (list, tuple, float, int)):
        return np.asarray(obj, dtype=np.float32)
    raise invalid(field, f"{type(obj).__name__} is not an array (numpy, __dlpack__ or __array__)")


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch  # the object is a torch tensor: torch is installed

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


@dataclasses.dataclass
class Operand:
    """One tensor of a request: inline bytes (dtype, shape, data) or a resident handle."""

    dtype: int = pb.DTYPE_UNSPECIFIED
    shape: Tuple[int, ...] = ()
    data: Optional[memoryview] = None
    handle: str = ""

    def header(self) -> pb.Tensor:
        """The Tensor without its data (the data travels beside it, see _wire)."""
        t = pb.Tensor(dtype=self.dtype, shape=self.shape)
        if self.handle:
            t.handle = self.handle
        return t


def operand(obj: Any, field: str) -> Operand:
    """The Operand of an array-like, a Resident or a handle string."""
    handle = getattr(obj, "handle", None)
    if isinstance(obj, str) or isinstance(handle, str):
        h = obj if isinstance(obj, str) else handle
        if not h:
            raise invalid(field, "an empty handle")
        return Operand(handle=h)  # dtype and shape: the server takes the resident tensor's
    arr = to_numpy(obj, field)
    dtype = _of_numpy(arr.dtype)
    if dtype is None:
        raise invalid(field, f"{arr.dtype} is not supported (float32, float16, bfloat16 as uint16 "
                             f"bits or ml_dtypes.bfloat16); convert it, e.g. .astype(np.float32)")
    if arr.ndim > 8:
        raise invalid(field + ".shape", f"{arr.ndim} dimensions, at most 8")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if not arr.flags.c_contiguous:  # row-major: a copy only when the array is not
        arr = np.ascontiguousarray(arr)  # (never on 0-d arrays: it would make them 1-d)
    if arr.dtype.name == "bfloat16":
        # ml_dtypes.bfloat16, which numpy cannot export as a buffer: its bits (a view).
        arr = arr.view(np.uint16)
    return Operand(dtype=dtype, shape=arr.shape,
                   data=memoryview(arr).cast("B") if arr.size else memoryview(b""))


def from_wire(dtype: int, shape: Tuple[int, ...], data: memoryview, bfloat16: str,
              field: str) -> np.ndarray:
    """A numpy array over `data` (no copy; read-only when data is). bfloat16 as
    ml_dtypes.bfloat16 when `bfloat16` is 'ml_dtypes' (or 'auto' and it is installed), else the
    uint16 bits."""
    np_dtype = _NUMPY_OF.get(dtype)
    if np_dtype is None:
        raise ComputeError(grpc.StatusCode.INTERNAL, f"{field}.dtype: the server sent {dtype}")
    count = 1
    for d in shape:
        count *= d
    if data.nbytes != count * np_dtype.itemsize:
        raise ComputeError(grpc.StatusCode.INTERNAL,
                           f"{field}.data: {data.nbytes} bytes for {dtype_name(dtype)}"
                           f"{list(shape)}")
    arr = np.frombuffer(data, dtype=np_dtype, count=count).reshape(shape)
    if dtype == pb.BFLOAT16:
        arr = as_bfloat16(arr, bfloat16)
    return arr


def as_bfloat16(bits: np.ndarray, bfloat16: str) -> np.ndarray:
    """uint16 bits as ml_dtypes.bfloat16 when asked for (or 'auto' and installed)."""
    if bfloat16 == "bits" or (bfloat16 == "auto" and BFLOAT16_DTYPE is None):
        return bits
    if BFLOAT16_DTYPE is None:
        raise ImportError("bfloat16='ml_dtypes' needs the ml_dtypes package")
    return bits.view(BFLOAT16_DTYPE)


def numpy_dtype(dtype: int, bfloat16: str = "bits") -> np.dtype:
    """The numpy dtype holding a server dtype's elements."""
    if dtype == pb.BFLOAT16 and bfloat16 != "bits" and BFLOAT16_DTYPE is not None:
        return BFLOAT16_DTYPE
    return _NUMPY_OF[dtype]


def bfloat16_to_float32(bits: Any) -> np.ndarray:
    """float32 values of bfloat16 bits (uint16, or an ml_dtypes.bfloat16 array). Exact."""
    b = np.asarray(bits)
    if b.dtype.name == "bfloat16":
        b = b.view(np.uint16)
    wide = b.reshape(-1).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32).reshape(b.shape)


def float32_to_bfloat16(values: Any) -> np.ndarray:
    """bfloat16 bits (uint16) of float32 values, rounded to nearest even (NaN stays NaN)."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    x = f.reshape(-1).view(np.uint32)
    one, half, shift = np.uint32(1), np.uint32(0x7FFF), np.uint32(16)
    rounded = ((x + half + ((x >> shift) & one)) >> shift).astype(np.uint16)
    nan = (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    quiet = ((x >> shift) | np.uint32(0x40)).astype(np.uint16)
    return np.where(nan, quiet, rounded).reshape(f.shape)
