// Benchmarks of the attention ladder: every version on the issue's
// configurations (bf16; 32k tokens, heads * head_dim = 2048; a GQA case and a
// decode case). FLOPs = 4 * B * Hq * Sq * Skv * D, halved when causal. The
// vendor comparison (PyTorch SDPA with its FlashAttention-2 and cuDNN
// backends) runs in kernels/bench/attention_sdpa.py on the same inputs; here
// the versions are checked against each other (and the reference where it
// runs) and timed side by side.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gpucompute/kernels/attention.h"
#include "kernels/bench/harness.h"

namespace gpucompute::bench {
namespace {

using kernels::AttentionArgs;
using kernels::DType;

struct AttnCase {
  int64_t b, hq, hkv, sq, skv, d;
  bool causal;
};

std::string CaseName(const AttnCase& c) {
  return "B" + std::to_string(c.b) + "_H" + std::to_string(c.hq) +
         (c.hkv != c.hq ? "x" + std::to_string(c.hkv) : "") + "_Sq" + std::to_string(c.sq) +
         "_Skv" + std::to_string(c.skv) + "_D" + std::to_string(c.d) + (c.causal ? "_causal" : "");
}

void BenchAttention(Context& ctx) {
  std::vector<AttnCase> cases;
  for (int64_t d : {64, 128})
    for (int64_t s : {1024, 4096, 16384})
      for (bool causal : {false, true})
        cases.push_back({32768 / s, 2048 / d, 2048 / d, s, s, d, causal});
  cases.push_back({8, 32, 8, 4096, 4096, 128, false});  // GQA 4
  cases.push_back({8, 32, 8, 4096, 4096, 128, true});
  cases.push_back({8, 32, 8, 1, 32768, 128, false});    // decode
  cases.push_back({8, 32, 8, 16, 32768, 128, false});

  const DType dt = DType::kBF16;
  for (const AttnCase& c : cases) {
    const size_t nq = c.b * c.hq * c.sq * c.d, nkv = c.b * c.hkv * c.skv * c.d;
    DeviceBuffer q(nq * 2), k(nkv * 2), v(nkv * 2), lse(c.b * c.hq * c.sq * sizeof(float));
    ctx.FillRandom(q.get(), nq, dt);
    ctx.FillRandom(k.get(), nkv, dt);
    ctx.FillRandom(v.get(), nkv, dt);
    AttentionArgs a;
    a.q = q.get();
    a.k = k.get();
    a.v = v.get();
    a.lse = lse.get<float>();
    a.batch = c.b;
    a.heads_q = c.hq;
    a.heads_kv = c.hkv;
    a.seq_q = c.sq;
    a.seq_kv = c.skv;
    a.head_dim = c.d;
    a.dtype = dt;
    a.causal = c.causal;
    const double flops = 4.0 * c.b * c.hq * c.sq * c.skv * c.d * (c.causal ? 0.5 : 1.0);
    const double bytes = 2.0 * (2 * nq + 2 * nkv);

    std::vector<std::unique_ptr<DeviceBuffer>> outs;
    std::vector<std::string> names;
    for (const std::string& variant : kernels::AttentionVariants()) {
      if (!ctx.Wants("attention/" + variant)) continue;
      // The materialised reference only at the smallest size (its S scratch
      // is B * H * S^2 floats and it is ~100x slower).
      if (variant == "reference" && !(c.sq == 1024 && c.skv == 1024 && c.d == 64)) continue;
      auto out = std::make_unique<DeviceBuffer>(nq * 2);
      a.o = out->get();
      if (!kernels::CanImplementAttention(a, variant)) continue;
      ctx.Poison(out->get(), nq * 2);
      const size_t ws_bytes = kernels::AttentionWorkspaceBytes(a, variant);
      DeviceBuffer ws(ws_bytes);
      const bool slow = variant == "reference";
      const double ms = ctx.Time(
          [&](cudaStream_t s) {
            GC_CUDA_CHECK(kernels::LaunchAttention(a, variant, ws.get(), s));
          },
          slow ? 1 : 5, slow ? 3 : 30);
      Row row;
      row.op = "attention";
      row.case_name = CaseName(c);
      row.dtype = "bf16";
      row.variant = variant;
      row.ms = ms;
      row.bytes = bytes;
      row.flops = flops;
      // Cross-check against the first version that ran (reference when it did).
      if (!outs.empty()) {
        double worst = 0;
        row.correct = DeviceAllClose(out->get(), outs.front()->get(), nq, dt, 2e-2, 2e-2,
                                     ctx.stream(), &worst);
        row.note = "vs " + names.front() + " err/tol " + std::to_string(worst).substr(0, 5);
      }
      ctx.Record(row);
      outs.push_back(std::move(out));
      names.push_back(variant);
    }
  }
}

GC_REGISTER_BENCH("attention", BenchAttention);

}  // namespace
}  // namespace gpucompute::bench
