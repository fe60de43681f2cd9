// Transposes on the CPU: the permutation padded to rank 4; where the input's
// contiguous axis is not the output's, 64x64 tiles go through a small buffer
// (reads and writes both move whole cache lines, even at power-of-two
// strides); otherwise rows are copied (contiguous or gathered reads,
// contiguous writes). Converts the dtype on the way. Each task moves its
// part in pieces of about kStopElements (whole tiles), with a stop check
// before each.
#include "server/device/cpu/elements.h"
#include "server/device/cpu/kernels.h"

namespace gpucompute::cpu {
namespace {

constexpr int64_t kTransposeTile = 64;
// Elements a task moves between two stop checks (16 MiB of fp32: a few
// milliseconds).
constexpr int64_t kStopElements = int64_t{1} << 22;

// The transpose padded to rank 4: output dims and, per output axis, the
// input stride of the axis it comes from.
struct TransposeGeometry {
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t in_stride[4] = {0, 0, 0, 0};
  int64_t rows() const { return dims[0] * dims[1] * dims[2]; }
  // Output rows between consecutive indices of row axis a (0-2).
  int64_t row_stride(int a) const { return a == 0 ? dims[1] * dims[2] : a == 1 ? dims[2] : 1; }
  // The output row axis fed by the input's contiguous axis, when that is
  // not the last output axis: the axis the tiles run along. -1: none (rows
  // are copied).
  int tiled_axis() const {
    int q = -1;
    if (in_stride[3] != 1 && dims[3] > 1) {
      for (int a = 0; a < 3; ++a) {
        if (in_stride[a] == 1 && dims[a] > 1) q = a;
      }
    }
    return q;
  }
};

TransposeGeometry MakeGeometry(const TransposeSpec& spec) {
  TransposeGeometry g;
  int64_t strides[4];
  int64_t s = 1;
  for (int i = spec.rank - 1; i >= 0; --i) {
    strides[i] = s;
    s *= spec.in_shape[i];
  }
  const int pad = 4 - spec.rank;
  for (int i = 0; i < spec.rank; ++i) {
    g.dims[pad + i] = spec.in_shape[spec.perm[i]];
    g.in_stride[pad + i] = strides[spec.perm[i]];
  }
  return g;
}

// Output rows [r0, r1) (rows of the last output axis), columns [c0, c1).
template <DType In, DType Out>
void TransposeBlock(const TransposeGeometry& g, const Storage<In>* in, Storage<Out>* out,
                    int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  auto cast = [](Storage<In> v) -> Storage<Out> {
    if constexpr (In == Out) {
      return v;
    } else {
      return StoreF<Out>(LoadF<In>(v));
    }
  };
  const int64_t d3 = g.dims[3], is3 = g.in_stride[3];
  const int64_t row_stride[3] = {g.row_stride(0), g.row_stride(1), g.row_stride(2)};
  const int q = g.tiled_axis();
  if (q < 0) {
    // Row by row: contiguous or gathered reads, contiguous writes.
    int64_t x[3] = {r0 / row_stride[0], (r0 / row_stride[1]) % g.dims[1], r0 % g.dims[2]};
    for (int64_t r = r0; r < r1; ++r) {
      const Storage<In>* src =
          in + x[0] * g.in_stride[0] + x[1] * g.in_stride[1] + x[2] * g.in_stride[2];
      Storage<Out>* dst = out + r * d3;
      if (is3 == 1) {
        for (int64_t c = c0; c < c1; ++c) dst[c] = cast(src[c]);
      } else {
        for (int64_t c = c0; c < c1; ++c) dst[c] = cast(src[c * is3]);
      }
      if (++x[2] == g.dims[2]) {
        x[2] = 0;
        if (++x[1] == g.dims[1]) {
          x[1] = 0;
          ++x[0];
        }
      }
    }
    return;
  }
  // Tiles over (axis q, last axis): reads contiguous along q, writes along the
  // last axis. The two other row axes u < v are walked where their rows can
  // meet [r0, r1) (a block may be a small part of the output); for each of
  // their values the rows in [r0, r1) are a contiguous interval of x_q.
  int u = -1, v = -1;
  for (int a = 0; a < 3; ++a) {
    if (a == q) continue;
    (u < 0 ? u : v) = a;
  }
  const int64_t rs_q = row_stride[q];
  const int64_t u_begin = u == 0 ? r0 / row_stride[0] : 0;
  const int64_t u_end = u == 0 ? (r1 - 1) / row_stride[0] + 1 : g.dims[u];
  for (int64_t xu = u_begin; xu < u_end; ++xu) {
    int64_t v_begin = 0, v_end = g.dims[v];
    if (v == 1) {  // u == 0, q == 2
      v_begin = std::max<int64_t>(0, (r0 - xu * row_stride[0]) / row_stride[1]);
      v_end = std::min<int64_t>(g.dims[1], (r1 - 1 - xu * row_stride[0]) / row_stride[1] + 1);
    }
    for (int64_t xv = v_begin; xv < v_end; ++xv) {
      const int64_t base_row = xu * row_stride[u] + xv * row_stride[v];
      if (r1 <= base_row) continue;
      const int64_t lo = r0 <= base_row ? 0 : CeilDiv(r0 - base_row, rs_q);
      const int64_t hi = std::min<int64_t>(g.dims[q], CeilDiv(r1 - base_row, rs_q));
      if (lo >= hi) continue;
      const Storage<In>* src = in + xu * g.in_stride[u] + xv * g.in_stride[v];
      Storage<Out>* dst = out + base_row * d3;
      // Each tile goes through a small buffer: read along the input's
      // contiguous axis (q), written along the output's (the last), so both
      // sides move whole cache lines even at power-of-two strides.
      Storage<Out> tile[kTransposeTile][kTransposeTile + 1];
      for (int64_t i0 = lo; i0 < hi; i0 += kTransposeTile) {
        const int64_t ni = std::min(hi - i0, kTransposeTile);
        for (int64_t j0 = c0; j0 < c1; j0 += kTransposeTile) {
          const int64_t nj = std::min(c1 - j0, kTransposeTile);
          for (int64_t j = 0; j < nj; ++j) {
            const Storage<In>* srow = src + (j0 + j) * is3 + i0;
            for (int64_t i = 0; i < ni; ++i) tile[i][j] = cast(srow[i]);
          }
          for (int64_t i = 0; i < ni; ++i) {
            Storage<Out>* drow = dst + (i0 + i) * rs_q * d3 + j0;
            for (int64_t j = 0; j < nj; ++j) drow[j] = tile[i][j];
          }
        }
      }
    }
  }
}

}  // namespace

void TransposePrefix(ThreadPool& pool, const TransposeSpec& spec, int prefix_axes, Range prefix,
                     void* out, ShardStop& stop) {
  const TransposeGeometry g = MakeGeometry(spec);
  // Output rows (of the last axis) per index of the flattened prefix.
  int64_t rows_per_prefix = 1;
  for (int a = prefix_axes; a < spec.rank - 1; ++a) rows_per_prefix *= spec.out_shape[a];
  const int64_t r0 = prefix.begin * rows_per_prefix, r1 = prefix.end * rows_per_prefix;
  const int64_t cols = g.dims[3];
  const DType in_dtype = spec.input.dtype, out_dtype = spec.options.output_dtype;
  if (r1 <= r0 || cols <= 0) return;
  const int64_t rows = r1 - r0;
  const int64_t pieces = PiecesFor(rows * cols, pool.size() * 4);
  // Enough rows: split rows; otherwise split columns as well.
  const int64_t row_pieces = std::min(rows, pieces);
  const int64_t col_pieces = std::min(cols, CeilDiv(pieces, row_pieces));
  const int64_t row_step = CeilDiv(rows, row_pieces), col_step = CeilDiv(cols, col_pieces);
  const int64_t row_tasks = CeilDiv(rows, row_step), col_tasks = CeilDiv(cols, col_step);
  // A task's pieces: where tiles go through the buffer, whole tiles (64
  // values of the tiled axis for every row, 64 columns), so that no piece
  // cuts one short; rows first, then columns.
  const int q = g.tiled_axis();
  const int64_t row_unit = q < 0 ? 1 : kTransposeTile * g.row_stride(q);
  const int64_t col_unit = q < 0 ? 1 : kTransposeTile;
  const int64_t piece_rows =
      std::max<int64_t>(1, kStopElements / std::max<int64_t>(1, col_step * row_unit)) * row_unit;
  const int64_t piece_cols =
      piece_rows * col_step <= kStopElements
          ? col_step
          : std::max<int64_t>(1, kStopElements / (piece_rows * col_unit)) * col_unit;
  DispatchDType(in_dtype, [&](auto in_tag) {
    DispatchDType(out_dtype, [&](auto out_tag) {
      constexpr DType In = decltype(in_tag)::value;
      constexpr DType Out = decltype(out_tag)::value;
      pool.ParallelFor(row_tasks * col_tasks, [&](int64_t task) {
        const int64_t rb = r0 + (task / col_tasks) * row_step;
        const int64_t re = std::min(r1, rb + row_step);
        const int64_t cb = (task % col_tasks) * col_step;
        const int64_t ce = std::min(cols, cb + col_step);
        for (int64_t pr = rb; pr < re; pr += piece_rows) {
          for (int64_t pc = cb; pc < ce; pc += piece_cols) {
            if (stop.Stop()) return;
            TransposeBlock<In, Out>(g, static_cast<const Storage<In>*>(spec.input.data),
                                    static_cast<Storage<Out>*>(out), pr,
                                    std::min(re, pr + piece_rows), pc,
                                    std::min(ce, pc + piece_cols));
          }
        }
      });
    });
  });
}

}  // namespace gpucompute::cpu
