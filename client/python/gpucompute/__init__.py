"""gpucompute: a Python client of the gpucompute service (GEMM, GEMV, reduce, transpose and
attention on the server's GPUs).

    import numpy as np
    import gpucompute

    client = gpucompute.Client("localhost:50051")
    a = np.random.rand(512, 256).astype(np.float32)
    b = np.random.rand(256, 128).astype(np.float32)
    c = client.gemm(a, b)                      # a numpy array, [512, 128]

gpucompute.aio.Client has the same methods as coroutines. Requests for Client.batch come
from gpucompute.ops; resident tensors are gpucompute.Resident.
"""

from gpucompute._batch import BatchResult
from gpucompute._host_memory import keep_freed_host_memory
from gpucompute._channel import SESSION_METADATA_KEY, split_transfer
from gpucompute._tensors import (bfloat16_to_float32, dtype_name, float32_to_bfloat16,
                                 parse_dtype)
from gpucompute.client import Client, TensorList
from gpucompute.errors import ComputeError
from gpucompute.ops import Request, Resident
from gpucompute.v1.compute_pb2 import BFLOAT16, FLOAT16, FLOAT32

from gpucompute import aio, ops  # noqa: E402  (after Client: aio builds on it)

__version__ = "0.1.0"

__all__ = [
    "BFLOAT16", "FLOAT16", "FLOAT32", "BatchResult", "aio", "ops", "Client", "ComputeError", "Request",
    "Resident", "SESSION_METADATA_KEY", "TensorList", "bfloat16_to_float32", "dtype_name",
    "float32_to_bfloat16", "keep_freed_host_memory", "parse_dtype", "split_transfer",
]
