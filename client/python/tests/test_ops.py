"""Every operation in every dtype, checked against float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest

import gpucompute
from conftest import DTYPES, assert_close, f64, random


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm(client, dtype):
    rng = np.random.default_rng(1)
    a = random((70, 33), dtype, rng)
    b = random((33, 45), dtype, rng)
    c = client.gemm(a, b)
    assert c.dtype == a.dtype and c.shape == (70, 45)
    assert_close(c, f64(a) @ f64(b), dtype, 33, np.abs(f64(a)) @ np.abs(f64(b)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_transposes_alpha_beta_and_batch(client, dtype):
    rng = np.random.default_rng(2)
    a = random((3, 20, 17), dtype, rng)       # [batch, K, M] with transpose_a
    b = random((9, 20), dtype, rng)           # [N, K] with transpose_b
    c0 = random((3, 17, 9), dtype, rng)
    out = client.gemm(a, b, c0, transpose_a=True, transpose_b=True, alpha=0.5, beta=-2.0)
    terms = np.abs(0.5 * np.swapaxes(f64(a), 1, 2) @ f64(b).T)
    ref = 0.5 * np.swapaxes(f64(a), 1, 2) @ f64(b).T - 2.0 * f64(c0)
    assert_close(out, ref, dtype, 21, 0.5 * np.abs(np.swapaxes(f64(a), 1, 2)) @ np.abs(f64(b).T)
                 + 2 * np.abs(f64(c0)) + terms)


def test_gemm_output_dtype_float32_from_half(client):
    rng = np.random.default_rng(3)
    a = random((16, 64), "float16", rng)
    b = random((64, 8), "float16", rng)
    out = client.gemm(a, b, output_dtype="float32")
    assert out.dtype == np.float32
    assert_close(out, f64(a) @ f64(b), "float32", 64, np.abs(f64(a)) @ np.abs(f64(b)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("columns", [0, 3])
def test_gemv(client, dtype, columns):
    rng = np.random.default_rng(4)
    a = random((50, 40), dtype, rng)
    x = random((40,) if columns == 0 else (40, columns), dtype, rng)
    y = client.gemv(a, x)
    assert y.shape == ((50,) if columns == 0 else (50, columns))
    assert_close(y, f64(a) @ f64(x), dtype, 40, np.abs(f64(a)) @ np.abs(f64(x)))
    # transpose_a, alpha and beta
    y0 = random(y.shape, dtype, rng)
    at = random((40, 50), dtype, rng)
    y2 = client.gemv(at, x, y0, transpose_a=True, alpha=2.0, beta=0.5)
    ref = 2.0 * f64(at).T @ f64(x) + 0.5 * f64(y0)
    assert_close(y2, ref, dtype, 41, 2 * np.abs(f64(at).T) @ np.abs(f64(x)) + np.abs(f64(y0)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduce(client, dtype, op):
    rng = np.random.default_rng(5)
    x = random((6, 7, 300), dtype, rng)
    fn = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}[op]
    whole = client.reduce(x, op)
    assert whole.shape == ()
    axis = client.reduce(x, op, axis=-1, keepdims=True)
    assert axis.shape == (6, 7, 1)
    middle = client.reduce(x, op, axis=1)
    assert middle.shape == (6, 300)
    for out, ref_axis, keep in ((whole, None, False), (axis, -1, True), (middle, 1, False)):
        ref = fn(f64(x), axis=ref_axis, keepdims=keep)
        n = x.size if ref_axis is None else x.shape[ref_axis]
        mag = fn(np.abs(f64(x)), axis=ref_axis, keepdims=keep) if op in ("sum", "mean") else None
        assert_close(out, np.asarray(ref), dtype, n, mag)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(client, dtype):
    rng = np.random.default_rng(6)
    x = random((2, 3, 4, 5), dtype, rng)
    out = client.transpose(x, (3, 1, 0, 2))
    np.testing.assert_array_equal(out, np.transpose(x, (3, 1, 0, 2)))  # exact: bits move
    np.testing.assert_array_equal(client.transpose(x[0, 0]), x[0, 0].T)


def reference_attention(q, k, v, causal, scale):
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    group = hq // hkv
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    logits = scale * np.einsum("bhqd,bhkd->bhqk", q, kk)
    if causal:
        i = np.arange(sq)[:, None]
        j = np.arange(skv)[None, :]
        logits = np.where(j <= i + skv - sq, logits, -np.inf)
    m = logits.max(axis=-1, keepdims=True)
    p = np.exp(logits - m)
    s = p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p / s, vv), (np.log(s) + m)[..., 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention(client, dtype, causal):
    rng = np.random.default_rng(7)
    q = random((2, 4, 9, 32), dtype, rng)
    k = random((2, 2, 13, 32), dtype, rng)
    v = random((2, 2, 13, 32), dtype, rng)
    o, lse = client.attention(q, k, v, causal=causal, return_lse=True)
    ref_o, ref_lse = reference_attention(f64(q), f64(k), f64(v), causal, 1 / np.sqrt(32))
    assert lse.dtype == np.float32 and lse.shape == (2, 4, 9)
    # Each output is a convex combination of V's rows: bound the error by max|V|.
    vmax = np.abs(f64(v)).max()
    assert_close(o, ref_o, dtype, 13 + 32, np.full(ref_o.shape, vmax))
    assert_close(lse, ref_lse, "float32", 32, np.abs(ref_lse) + 1)
    o_only = client.attention(q, k, v, causal=causal, scale=0.3)
    ref_o2, _ = reference_attention(f64(q), f64(k), f64(v), causal, 0.3)
    assert isinstance(o_only, np.ndarray)
    assert_close(o_only, ref_o2, dtype, 13 + 32, np.full(ref_o2.shape, vmax))


def test_attention_allow_tf32_travels_in_the_options():
    q = np.zeros((1, 1, 2, 8), np.float32)
    assert gpucompute.ops.attention(q, q, q, allow_tf32=True).message.options.allow_tf32
    assert not gpucompute.ops.attention(q, q, q).message.options.allow_tf32


@pytest.mark.parametrize("dtype", DTYPES)
def test_echo_is_exact(client, dtype):
    rng = np.random.default_rng(8)
    x = random((123, 77), dtype, rng)
    out = client.echo(x)
    assert out.dtype == x.dtype and out.shape == x.shape
    np.testing.assert_array_equal(out, x)
    assert not out.flags.writeable  # a view of the received message: no copy


def test_empty_and_scalar_tensors(client):
    empty = np.zeros((0, 5), np.float32)
    assert client.echo(empty).shape == (0, 5)
    assert client.echo(np.float32(2.5).reshape(())) == np.float32(2.5)
    assert client.reduce(np.arange(10, dtype=np.float32), "sum") == 45


def test_timings_and_info(client):
    a = np.ones((8, 8), np.float32)
    c, timings = client.gemm(a, a, timings=True)
    np.testing.assert_array_equal(c, np.full((8, 8), 8, np.float32))
    assert timings.server_seconds > 0
    assert len(timings.shards) >= 1 and timings.shards[0].variant
    info = client.info()
    assert info.backend == "cpu" and len(info.devices) >= 1
    assert info.max_message_bytes == 1 << 30
    assert {o.operation for o in info.operations} >= {"gemm", "gemv", "reduce", "transpose",
                                                      "attention"}
    variant = next(o.variants[0] for o in info.operations if o.operation == "gemm")
    _, t = client.gemm(a, a, variant=variant, devices=[0], timings=True)
    assert {s.variant for s in t.shards} == {variant} and {s.device for s in t.shards} == {0}
    assert client.health() == "SERVING"
    assert client.health("gpucompute.v1.Compute") == "SERVING"


def test_bfloat16_results_as_bits_or_ml_dtypes(server):
    bits = gpucompute.float32_to_bfloat16(np.array([[1.5, -2.0], [0.25, 3.0]], np.float32))
    with gpucompute.Client(server.address, bfloat16="bits") as c:
        out = c.echo(bits)
        assert out.dtype == np.uint16
        np.testing.assert_array_equal(out, bits)
    try:
        import ml_dtypes
    except ImportError:
        with gpucompute.Client(server.address) as c:  # auto: the bits without ml_dtypes
            assert c.echo(bits).dtype == np.uint16
        with pytest.raises(ImportError):
            gpucompute.Client(server.address, bfloat16="ml_dtypes").echo(bits)
        return
    with gpucompute.Client(server.address) as c:
        x = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
        out = c.echo(x)
        assert out.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(out.astype(np.float32), [1.5, -2.0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_tensors_travel_beside_the_message(client, dtype):
    # Over ops.INLINE_BYTES each way: requests splice the arrays in, responses are cut out of
    # the received message (client.STRIP_BYTES).
    from gpucompute import ops
    from gpucompute.client import STRIP_BYTES

    rng = np.random.default_rng(9)
    a = random((400, 300), dtype, rng)
    b = random((300, 500), dtype, rng)
    request = ops.gemm(a, b)
    assert [f for f, _ in request.tensors] == [1, 2]
    assert 400 * 500 * a.itemsize >= STRIP_BYTES
    c = client.gemm(a, b)
    assert_close(c, f64(a) @ f64(b), dtype, 300, np.abs(f64(a)) @ np.abs(f64(b)))
    x = random((512, 1024), dtype, rng)
    np.testing.assert_array_equal(client.echo(x), x)
    np.testing.assert_array_equal(client.transpose(x), x.T)
