// C entry points of the kernels library, for callers that load
// libgc_kernels_capi.so dynamically (the Python benchmark harness through
// ctypes). Plain C types only; every function is safe to call without a GPU
// (it then reports an error instead of launching).
//
// ABI of GcAttentionArgs (natural alignment, x86-64):
//   q, k, v, o: device pointers; lse: device float pointer or NULL;
//   batch, heads_q, heads_kv, seq_q, seq_kv, head_dim: int64;
//   dtype: 0 fp32, 1 fp16, 2 bf16; causal: 0 / 1; scale: float (<= 0: 1/sqrt(d)).
// Tensors are dense [B, H, S, D]; see gpucompute/kernels/attention.h.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "gpucompute/kernels/attention.h"

namespace {

struct GcAttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int64_t batch;
  int64_t heads_q;
  int64_t heads_kv;
  int64_t seq_q;
  int64_t seq_kv;
  int64_t head_dim;
  int32_t dtype;
  int32_t causal;
  float scale;
};

gpucompute::kernels::AttentionArgs ToArgs(const GcAttentionArgs& c) {
  gpucompute::kernels::AttentionArgs a;
  a.q = c.q;
  a.k = c.k;
  a.v = c.v;
  a.o = c.o;
  a.lse = c.lse;
  a.batch = c.batch;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.seq_q = c.seq_q;
  a.seq_kv = c.seq_kv;
  a.head_dim = c.head_dim;
  a.dtype = static_cast<gpucompute::kernels::DType>(c.dtype);
  a.causal = c.causal != 0;
  a.scale = c.scale;
  return a;
}

bool ValidDType(int32_t d) { return d >= 0 && d <= 2; }

// Copies `s` into buf (NUL-terminated, truncated to len); returns s's length.
size_t CopyOut(const std::string& s, char* buf, size_t len) {
  if (buf && len > 0) {
    const size_t n = s.size() < len - 1 ? s.size() : len - 1;
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}

}  // namespace

extern "C" {

// Writes the attention version names, comma-separated, into buf; returns the
// full length (call again with a larger buffer when it exceeds len - 1).
size_t gc_attention_variants(char* buf, size_t len) {
  std::string all;
  for (const std::string& v : gpucompute::kernels::AttentionVariants()) {
    if (!all.empty()) all += ",";
    all += v;
  }
  return CopyOut(all, buf, len);
}

// 1 when `variant` ("" = fastest) can run these arguments, else 0 with the
// reason in buf.
int gc_attention_can_implement(const GcAttentionArgs* args, const char* variant, char* reason,
                               size_t len) {
  if (!args || !ValidDType(args->dtype)) {
    CopyOut("null arguments or unknown dtype", reason, len);
    return 0;
  }
  gpucompute::kernels::Support s =
      gpucompute::kernels::CanImplementAttention(ToArgs(*args), variant ? variant : "");
  CopyOut(s.reason, reason, len);
  return s.ok ? 1 : 0;
}

// Scratch bytes the version needs (0 when none or when refused).
size_t gc_attention_workspace_bytes(const GcAttentionArgs* args, const char* variant) {
  if (!args || !ValidDType(args->dtype)) return 0;
  return gpucompute::kernels::AttentionWorkspaceBytes(ToArgs(*args), variant ? variant : "");
}

// Launches on `stream` (a cudaStream_t, NULL for the legacy default stream);
// returns the cudaError_t value (0 on success).
int gc_attention_launch(const GcAttentionArgs* args, const char* variant, void* workspace,
                        void* stream) {
  if (!args || !ValidDType(args->dtype)) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(gpucompute::kernels::LaunchAttention(
      ToArgs(*args), variant ? variant : "", workspace, static_cast<cudaStream_t>(stream)));
}

// cudaGetErrorString of a value returned above.
const char* gc_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

}  // extern "C"
