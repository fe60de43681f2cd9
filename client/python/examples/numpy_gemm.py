"""A GEMM from numpy, checked against numpy, then the same operands kept on the server.

    python3 examples/numpy_gemm.py [--server=localhost:50051]
"""

import argparse

import numpy as np

import gpucompute

parser = argparse.ArgumentParser()
parser.add_argument("--server", default="localhost:50051")
args = parser.parse_args()

client = gpucompute.Client(args.server)
print(client.info().backend, "backend")

rng = np.random.default_rng(0)
a = rng.standard_normal((512, 256), dtype=np.float32)
b = rng.standard_normal((256, 128), dtype=np.float32)

c = client.gemm(a, b, timeout=30)
print("max |c - a @ b| =", np.abs(c - a @ b).max())

# bfloat16 travels as its bits (uint16); float32_to_bfloat16 rounds to nearest even.
c16 = client.gemm(gpucompute.float32_to_bfloat16(a), gpucompute.float32_to_bfloat16(b),
                  output_dtype="float32")
print("bf16 inputs, fp32 result: max error", np.abs(c16 - a @ b).max())

# Upload once, compute on handles keeping the results on the server, download at the end.
ha, hb = client.upload(a), client.upload(b)
hc = client.gemm(ha, hb, keep_output=True)
total = client.reduce(hc, "sum")
print("sum of c:", float(total), "vs", float((a @ b).sum()))
np.testing.assert_allclose(client.download(hc), a @ b, rtol=1e-4, atol=1e-3)
client.free([ha, hb, hc])

try:
    client.gemm(a, a)  # [512, 256] @ [512, 256]: the inner dimensions differ
except gpucompute.ComputeError as e:
    print("refused:", e.code.name, e.message)
