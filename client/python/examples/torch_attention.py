"""PyTorch tensors in, PyTorch tensors out: attention on the server checked against
torch.nn.functional.scaled_dot_product_attention.

    python3 examples/torch_attention.py [--server=localhost:50051]

CPU tensors are read without a copy (DLPack); CUDA tensors are copied to the host first.
Results come back as numpy arrays; torch.from_numpy wraps them without a copy (np.array(...)
first where a writable tensor is needed).
"""

import argparse

import numpy as np
import torch

import gpucompute

parser = argparse.ArgumentParser()
parser.add_argument("--server", default="localhost:50051")
args = parser.parse_args()

client = gpucompute.Client(args.server)
device = "cuda" if torch.cuda.is_available() else "cpu"
q = torch.randn(2, 8, 128, 64, device=device, dtype=torch.float16)
k = torch.randn(2, 2, 128, 64, device=device, dtype=torch.float16)  # grouped-query: 8 / 2
v = torch.randn(2, 2, 128, 64, device=device, dtype=torch.float16)

o = torch.from_numpy(np.array(client.attention(q, k, v, causal=True))).to(device)

ref = torch.nn.functional.scaled_dot_product_attention(
    q.float(), k.float().repeat_interleave(4, dim=1), v.float().repeat_interleave(4, dim=1),
    is_causal=True)
print("max |o - sdpa| =", (o.float() - ref).abs().max().item())

# bfloat16 tensors are sent as their bits; ask for a float32 result to get plain numbers back.
a = torch.randn(256, 128, dtype=torch.bfloat16)
c = torch.from_numpy(np.array(client.gemm(a, a.T, output_dtype="float32")))
print("bf16 gemm: max error", (c - a.float() @ a.float().T).abs().max().item())
