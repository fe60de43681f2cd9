#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets: tests/fuzz/corpus/<target>/.

    tests/fuzz/make_corpus.py     # Debian's python3 with python3-numpy; rewrites the seeds

Each seed is a small valid (or nearly valid) input in the target's input
format (see the header of each fuzz_*.cc): the fuzzer mutates from there.
Messages are encoded here by hand in protobuf's wire format (field numbers
from proto/gpucompute/v1/compute.proto), so that only Python is needed; the
.npy seeds are written by numpy. Seeds whose names start with "regression-"
are inputs that once failed, kept by hand; this script leaves them alone.
"""

import io
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")

# DType and ReduceOp values.
F32, F16, BF16 = 1, 2, 3
SUM, MAX, MIN, MEAN = 1, 2, 3, 4


# --- protobuf's wire format ----------------------------------------------------------------


def varint(value):
    value &= (1 << 64) - 1  # negative int32/int64: ten bytes, as protobuf writes them
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number, wire_type):
    return varint((number << 3) | wire_type)


def uint(number, value):
    """An int32, int64, enum or bool field (wire type 0)."""
    return tag(number, 0) + varint(value)


def double(number, value):
    return tag(number, 1) + struct.pack("<d", value)


def blob(number, payload):
    """A bytes, string or message field (wire type 2)."""
    if isinstance(payload, str):
        payload = payload.encode()
    return tag(number, 2) + varint(len(payload)) + payload


def packed(number, values):
    return blob(number, b"".join(varint(v) for v in values))


# --- gpucompute.v1 messages ----------------------------------------------------------------

ELEMENT_BYTES = {F32: 4, F16: 2, BF16: 2}


def sample_bytes(dtype, count, salt=0):
    """count elements of dtype: small values, with a NaN and an Inf among them."""
    values = np.linspace(-2.0, 3.0, num=count, dtype=np.float32) + np.float32(salt)
    if count > 3:
        values[1] = np.nan
        values[2] = np.inf
    if dtype == F32:
        return values.astype("<f4").tobytes()
    if dtype == F16:
        return values.astype("<f2").tobytes()
    return (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # bfloat16 bits


def tensor(dtype, shape, data=None, handle=None, salt=0):
    out = uint(1, dtype) if dtype else b""
    if shape:
        out += packed(2, shape)
    if handle is not None:
        return out + blob(4, handle)
    if data is None:
        count = int(np.prod(shape)) if shape else 1
        data = sample_bytes(dtype, count, salt)
    return out + blob(3, data)


def options(variant=None, devices=(), output_dtype=0, tf32=False, keep=False):
    out = b""
    if variant is not None:
        out += blob(1, variant)
    if devices:
        out += packed(2, devices)
    if output_dtype:
        out += uint(3, output_dtype)
    if tf32:
        out += uint(4, 1)
    if keep:
        out += uint(5, 1)
    return out


def gemm(a, b, c=None, ta=False, tb=False, alpha=None, beta=0.0, opts=None):
    out = blob(1, a) + blob(2, b)
    if c is not None:
        out += blob(3, c)
    if ta:
        out += uint(4, 1)
    if tb:
        out += uint(5, 1)
    if alpha is not None:
        out += double(6, alpha)
    if beta:
        out += double(7, beta)
    if opts is not None:
        out += blob(8, opts)
    return out


def gemv(a, x, y=None, ta=False, alpha=None, beta=0.0, opts=None):
    out = blob(1, a) + blob(2, x)
    if y is not None:
        out += blob(3, y)
    if ta:
        out += uint(4, 1)
    if alpha is not None:
        out += double(5, alpha)
    if beta:
        out += double(6, beta)
    if opts is not None:
        out += blob(7, opts)
    return out


def reduce(x, op, axis=None, keepdims=False, opts=None):
    out = blob(1, x) + uint(2, op)
    if axis is not None:
        out += uint(3, 1) + uint(4, axis)
    if keepdims:
        out += uint(5, 1)
    if opts is not None:
        out += blob(6, opts)
    return out


def transpose(x, perm=(), opts=None):
    out = blob(1, x)
    if perm:
        out += packed(2, perm)
    if opts is not None:
        out += blob(3, opts)
    return out


def attention(q, k, v, causal=False, scale=0.0, lse=False, opts=None):
    out = blob(1, q) + blob(2, k) + blob(3, v)
    if causal:
        out += uint(4, 1)
    if scale:
        out += double(5, scale)
    if lse:
        out += uint(6, 1)
    if opts is not None:
        out += blob(7, opts)
    return out


def batch(op_field, op, item_id="item-1"):
    return blob(1, item_id) + blob(op_field, op)


def upload(header=None, offset=0, data=b""):
    out = b""
    if header is not None:
        out += blob(1, header)
    if offset:
        out += uint(2, offset)
    if data:
        out += blob(3, data)
    return out


def upload_header(dtype, shape, device=None, upload_id=None, parts=0, begin=0, end=0):
    out = uint(1, dtype) + (packed(2, shape) if shape else b"")
    if device is not None:
        out += uint(3, device)
    if upload_id is not None:
        out += blob(4, upload_id)
    if parts:
        out += uint(5, parts)
    if begin:
        out += uint(6, begin)
    if end:
        out += uint(7, end)
    return out


def shard_timing(device, begin, end):
    return (uint(1, device) + blob(2, "fuzz") + blob(3, "rows") + uint(4, begin) + uint(5, end) +
            double(6, 1e-3) + double(8, 1e9))


def timings(*shards):
    return double(1, 2e-3) + b"".join(blob(3, s) for s in shards)


def tensor_info(handle, dtype, shape):
    return blob(1, handle) + uint(2, dtype) + packed(3, shape) + uint(4, 24) + uint(5, 0)


# --- the seeds -----------------------------------------------------------------------------

# fuzz_request: the first byte is kind | (devices - 1) << 3 | limit << 5.
KIND = {"gemm": 0, "gemv": 1, "reduce": 2, "transpose": 3, "attention": 4, "batch": 5,
        "echo": 6, "upload": 7}
# Limit indices (kOutputLimits in fuzz_request.cc): 0 none, 1 zero bytes, 4: 4096, 5: 1 MiB.
NO_LIMIT, ZERO, KB4, MB1 = 0, 1, 4, 5


def knobs(kind, devices=1, limit=NO_LIMIT):
    return bytes([KIND[kind] | (devices - 1) << 3 | limit << 5])


def request_seeds():
    s = {}
    a23, b34 = tensor(F32, [2, 3]), tensor(F32, [3, 4], salt=1)
    s["gemm-f32"] = knobs("gemm", 2, MB1) + gemm(a23, b34)
    s["gemm-bf16-batched-transposed"] = knobs("gemm", 4) + gemm(
        tensor(BF16, [2, 3, 2]), tensor(BF16, [4, 3], salt=2), ta=True, tb=True, alpha=0.5,
        opts=options(output_dtype=F32, devices=[0, 1]))
    s["gemm-f16-beta-c"] = knobs("gemm", 3, KB4) + gemm(
        tensor(F16, [2, 3]), tensor(F16, [3, 4]), c=tensor(F16, [2, 4]), beta=1.0,
        opts=options(variant="tc_wgmma", tf32=True))
    s["gemm-resident"] = knobs("gemm", 2) + gemm(
        tensor(0, [], handle="rf2,3"), tensor(F32, [3, 5], handle="rf3,5"),
        opts=options(keep=True))
    s["gemm-resident-huge"] = knobs("gemm", 4, MB1) + gemm(
        tensor(0, [], handle="rb1073741824,0"), tensor(0, [], handle="rb0,1073741824"),
        opts=options(keep=True))
    s["gemm-inner-mismatch"] = knobs("gemm") + gemm(a23, tensor(F32, [4, 4]))
    s["gemm-over-limit"] = knobs("gemm", 1, ZERO) + gemm(a23, b34)
    s["gemv-f32"] = knobs("gemv", 2, MB1) + gemv(tensor(F32, [4, 3]), tensor(F32, [3]))
    s["gemv-bf16-columns-y"] = knobs("gemv", 3) + gemv(
        tensor(BF16, [3, 4]), tensor(BF16, [3, 2]), y=tensor(BF16, [4, 2]), ta=True, alpha=2.0,
        beta=-1.0)
    s["gemv-resident"] = knobs("gemv", 1) + gemv(
        tensor(0, [], handle="rh8,16"), tensor(F16, [16, 8]), opts=options(output_dtype=F32))
    s["reduce-sum-axis"] = knobs("reduce", 2, MB1) + reduce(
        tensor(F32, [2, 3, 4]), SUM, axis=-1, keepdims=True)
    s["reduce-max-all"] = knobs("reduce", 4) + reduce(tensor(F16, [5, 7]), MAX)
    s["reduce-mean-resident"] = knobs("reduce", 3) + reduce(
        tensor(0, [], handle="rb65536,3"), MEAN, axis=0, opts=options(keep=True))
    s["reduce-min-empty"] = knobs("reduce") + reduce(tensor(F32, [3, 0]), MIN, axis=1)
    s["transpose-perm"] = knobs("transpose", 2, MB1) + transpose(
        tensor(F32, [2, 3, 4]), perm=[2, 0, 1])
    s["transpose-default-bf16"] = knobs("transpose", 4) + transpose(
        tensor(BF16, [2, 3, 2, 2]), opts=options(output_dtype=F16))
    s["transpose-resident"] = knobs("transpose", 3) + transpose(
        tensor(0, [], handle="rh2,3,4,5"), perm=[3, -3, 0, 2])
    s["attention-f16-causal-lse"] = knobs("attention", 2, MB1) + attention(
        tensor(F16, [1, 2, 3, 32]), tensor(F16, [1, 1, 5, 32]), tensor(F16, [1, 1, 5, 32]),
        causal=True, lse=True)
    s["attention-bf16-scale"] = knobs("attention", 4) + attention(
        tensor(BF16, [2, 1, 2, 32]), tensor(BF16, [2, 1, 3, 32]), tensor(BF16, [2, 1, 3, 32]),
        scale=0.125, opts=options(output_dtype=F32))
    s["attention-resident"] = knobs("attention", 3) + attention(
        tensor(0, [], handle="rf1,8,4096,128"), tensor(0, [], handle="rf1,2,4096,128"),
        tensor(0, [], handle="rf1,2,4096,128"), causal=True, lse=True, opts=options(keep=True))
    s["batch-gemm"] = knobs("batch", 2, MB1) + batch(2, gemm(a23, b34))
    s["batch-reduce"] = knobs("batch", 1) + batch(4, reduce(tensor(F32, [6]), SUM))
    s["batch-attention"] = knobs("batch", 3) + batch(6, attention(
        tensor(F32, [1, 1, 1, 32]), tensor(F32, [1, 1, 2, 32]), tensor(F32, [1, 1, 2, 32])))
    s["echo-f16"] = knobs("echo") + blob(1, tensor(F16, [3, 2]))
    s["echo-handle"] = knobs("echo") + blob(1, tensor(0, [], handle="rf1"))
    s["upload-single"] = knobs("upload") + upload(
        upload_header(F32, [2, 2]), data=sample_bytes(F32, 4))
    s["upload-part"] = knobs("upload") + upload(
        upload_header(BF16, [64, 64], device=1, upload_id="u1", parts=2, begin=4096, end=8192),
        offset=4096, data=bytes(range(64)))
    s["upload-chunk"] = knobs("upload") + upload(offset=64, data=bytes(32))
    return s


# fuzz_wire: the first bytes are the message type (kTypes in fuzz_wire.cc), the bytes from
# which a field stays in the slices, and the slices' seed.
TYPE = {"GemmRequest": 0, "GemvRequest": 1, "ReduceRequest": 2, "TransposeRequest": 3,
        "AttentionRequest": 4, "BatchRequest": 5, "EchoRequest": 6, "UploadRequest": 7,
        "DownloadRequest": 8, "FreeRequest": 9, "GemmResponse": 10, "AttentionResponse": 11,
        "BatchResponse": 12, "EchoResponse": 13, "UploadResponse": 14, "DownloadResponse": 15}


def wire_head(message_type, min_external=8, seed=1):
    return bytes([TYPE[message_type], min_external, seed])


def wire_seeds(requests):
    s = {}
    for name, body in requests.items():
        kind = [k for k, v in KIND.items() if v == body[0] & 7][0]
        message_type = {"gemm": "GemmRequest", "gemv": "GemvRequest", "reduce": "ReduceRequest",
                        "transpose": "TransposeRequest", "attention": "AttentionRequest",
                        "batch": "BatchRequest", "echo": "EchoRequest",
                        "upload": "UploadRequest"}[kind]
        s[name] = wire_head(message_type, 8 + len(s) % 24, len(s)) + body[1:]
    c = tensor(F32, [2, 4])
    s["gemm-response"] = wire_head("GemmResponse", 16) + blob(1, c) + blob(
        2, timings(shard_timing(0, 0, 1), shard_timing(1, 1, 2)))
    s["attention-response"] = wire_head("AttentionResponse", 4) + blob(
        1, tensor(F16, [1, 1, 2, 32])) + blob(2, tensor(F32, [1, 1, 2])) + blob(3, timings())
    s["batch-response"] = wire_head("BatchResponse", 8) + blob(1, "item-7") + uint(2, 0) + blob(
        4, blob(1, c))
    s["batch-response-error"] = wire_head("BatchResponse", 0) + blob(1, "x") + uint(2, 3) + blob(
        3, "a.shape: expected rank 2")
    s["echo-response"] = wire_head("EchoResponse", 2) + blob(1, tensor(BF16, [5])) + blob(
        2, timings())
    s["upload-response"] = wire_head("UploadResponse", 8) + blob(
        1, tensor_info("t3566bf", BF16, [64, 64])) + double(2, 0.5) + double(3, 0.25)
    s["download-request"] = wire_head("DownloadRequest", 0) + blob(1, "t3566bf") + uint(
        2, 4096) + uint(3, 8192) + uint(4, 1 << 20)
    s["download-response"] = wire_head("DownloadResponse", 8, 7) + blob(
        1, tensor_info("t3566bf", F32, [4, 4])) + uint(2, 0) + blob(3, sample_bytes(F32, 16))
    s["free-request"] = wire_head("FreeRequest", 0) + blob(1, "t1") + blob(1, "t2")
    # Unknown fields, a value given twice, a group (refused by wire::Parse alone).
    s["unknown-and-repeated"] = wire_head("UploadRequest", 4, 3) + uint(99, 5) + blob(
        3, b"small") + blob(3, bytes(40)) + blob(1000, b"unknown") + uint(2, 7)
    s["group"] = wire_head("EchoRequest", 8) + tag(5, 3) + uint(1, 1) + tag(5, 4)
    return s


def npy_bytes(array, version=None):
    out = io.BytesIO()
    if version is None:
        np.save(out, array)
    else:
        np.lib.format.write_array(out, array, version=version)
    return out.getvalue()


def npy_seeds():
    rng = np.random.default_rng(15)
    s = {}
    s["f4-2x3"] = npy_bytes(rng.standard_normal((2, 3)).astype("<f4"))
    s["f2-vector"] = npy_bytes(np.array([1.0, -2.5, np.inf, 0.0], dtype="<f2"))
    bf16 = (rng.standard_normal((2, 2)).astype(np.float32).view(np.uint32) >> 16)
    s["u2-bf16-bits"] = npy_bytes(bf16.astype("<u2"))
    s["f8-scalar"] = npy_bytes(np.array(3.25, dtype="<f8"))
    s["u1-empty"] = npy_bytes(np.zeros((0, 4), dtype="|u1"))
    s["b1-bool"] = npy_bytes(np.array([True, False, True]))
    s["f4-v2"] = npy_bytes(np.arange(6, dtype="<f4").reshape(3, 2), version=(2, 0))
    s["f4-v3"] = npy_bytes(np.arange(3, dtype="<f4"), version=(3, 0))
    s["big-endian"] = npy_bytes(np.arange(4, dtype=">f4"))
    s["fortran-order"] = npy_bytes(np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
    s["f4-4d"] = npy_bytes(np.zeros((1, 2, 1, 3), dtype="<f4"))
    return s


def write(target, seeds):
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if not name.startswith("regression-"):
            os.remove(os.path.join(directory, name))
    for name, data in sorted(seeds.items()):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    total = sum(len(d) for d in seeds.values())
    print(f"{target}: {len(seeds)} seeds, {total} bytes")


def main():
    requests = request_seeds()
    write("fuzz_request", requests)
    write("fuzz_wire", wire_seeds(requests))
    write("fuzz_npy", npy_seeds())


if __name__ == "__main__":
    sys.exit(main())
