"""PyTorch tensors as inputs (skipped where torch is not installed): CPU tensors through
DLPack without a copy, CUDA tensors through a host copy, bfloat16 as its bits."""

from __future__ import annotations

import numpy as np
import pytest

from gpucompute import ops
from gpucompute.v1 import compute_pb2 as pb

torch = pytest.importorskip("torch")


def _parsed(request):
    return pb.GemmRequest.FromString(request.encode().join())


def test_cpu_tensors_without_a_copy():
    a = torch.arange(256 * 128, dtype=torch.float32).reshape(256, 128)
    request = ops.gemm(a, a.T.contiguous())
    (field, data), = [t for t in request.tensors if t[0] == 1]
    assert np.shares_memory(np.frombuffer(data, np.float32), a.numpy())
    assert _parsed(request).a.data == a.numpy().tobytes()


def test_bfloat16_and_half_tensors():
    x = torch.tensor([[1.5, -2.0], [0.25, 3.0]], dtype=torch.bfloat16)
    parsed = _parsed(ops.gemm(x, x))
    assert parsed.a.dtype == pb.BFLOAT16
    bits = np.frombuffer(parsed.a.data, np.uint16)
    np.testing.assert_array_equal(bits, x.view(torch.int16).numpy().view(np.uint16).ravel())
    h = torch.ones(3, 3, dtype=torch.float16, requires_grad=True)
    assert _parsed(ops.gemm(h, h)).a.dtype == pb.FLOAT16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_tensors_through_a_host_copy():
    x = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    parsed = _parsed(ops.gemm(x, x.T))
    bits = np.frombuffer(parsed.a.data, np.uint16)
    np.testing.assert_array_equal(bits, x.cpu().view(torch.int16).numpy().view(np.uint16).ravel())
