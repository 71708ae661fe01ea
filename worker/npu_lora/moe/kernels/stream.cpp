// npu_lora streaming MoE experts kernel: torch bindings around stream_core.h.
//
// Threads come from at::parallel_for (torch's intra-op pool, `torch.set_num_threads`): one call
// per phase that starts one worker per thread, the workers take tasks from a shared counter.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stream_core.h"

namespace {
using namespace npu_lora_stream;

struct TorchPar {
  template <class F>
  void run(F&& f) const {
    const int64_t n = at::get_num_threads();
    at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) f();
    });
  }
};

Weights weights(const torch::Tensor& t) {
  TORCH_CHECK(t.dim() == 3 && t.is_contiguous(),
              "npu_lora_stream: weights must be contiguous [E, R, C]");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              "npu_lora_stream: weights must be float32 or bfloat16, got ", t.scalar_type());
  return {t.data_ptr(), t.scalar_type() == at::kBFloat16, t.size(1), t.size(2)};
}

bool activations_bf16(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), "npu_lora_stream: ", what,
              " must be a contiguous [T, H] tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              "npu_lora_stream: ", what, " must be float32 or bfloat16, got ", t.scalar_type());
  return t.scalar_type() == at::kBFloat16;
}

std::vector<i64> offsets_vec(const torch::Tensor& offsets) {
  auto o = offsets.contiguous().to(at::kLong);
  return std::vector<i64>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
}

// The routing and weight arguments both directions take, checked against each other.
void set_routed(RoutedArgs& a, const torch::Tensor& w_gu, const torch::Tensor& w_down, i64 H,
                const torch::Tensor& token_idx, const torch::Tensor& wr,
                const torch::Tensor& offsets, const torch::Tensor& inv, i64 T, i64 K) {
  a.gu = weights(w_gu);
  a.dn = weights(w_down);
  TORCH_CHECK(a.gu.C == H && a.dn.R == H && a.dn.C == a.gu.R / 2 && a.gu.R % 2 == 0,
              "npu_lora_stream: weight shapes do not match the hidden size");
  TORCH_CHECK(a.gu.bf16 == a.dn.bf16, "npu_lora_stream: gate_up_proj and down_proj dtypes differ");
  TORCH_CHECK(token_idx.scalar_type() == at::kLong && token_idx.is_contiguous() &&
                  token_idx.numel() == T * K,
              "npu_lora_stream: token_idx must be contiguous int64 [T*K]");
  TORCH_CHECK(inv.scalar_type() == at::kLong && inv.is_contiguous() && inv.numel() == T * K,
              "npu_lora_stream: inv_perm must be contiguous int64 [T*K]");
  TORCH_CHECK(wr.scalar_type() == at::kFloat && wr.is_contiguous() && wr.numel() == T * K,
              "npu_lora_stream: routing weights must be contiguous float32 [T*K]");
  a.token_idx = token_idx.data_ptr<int64_t>();
  a.wr = wr.data_ptr<float>();
  a.off = offsets_vec(offsets);
  a.inv = inv.data_ptr<int64_t>();
  a.T = T;
  a.K = K;
}

}  // namespace
std::vector<std::string> cpu_isas();
namespace {

// The instruction set of a call, checked against what this CPU runs (an instance for another
// ISA would die on an illegal instruction; AMX tiles also need the process to be granted the
// tile state, which cpu_isas() requests).
Ops checked_ops(int64_t isa) {
  static const char* const names[] = {"base", "avx2", "avx512", "avx512bf16", "amx"};
  TORCH_CHECK(isa >= kBase && isa <= kAmx, "npu_lora_stream: unknown ISA code ", isa);
  static const std::vector<std::string> runs = cpu_isas();
  TORCH_CHECK(std::find(runs.begin(), runs.end(), names[isa]) != runs.end(),
              "npu_lora_stream: ISA ", names[isa], " requested, this CPU runs ", runs.size(),
              " paths up to ", runs.back());
  return ops_for(static_cast<int>(isa));
}

// An uninitialised fp32 tensor whose memory comes from the block cache (stream_core.h: Pool) and
// goes back to it when the tensor is freed, on whatever thread that happens.
torch::Tensor pooled(std::vector<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  const std::size_t bytes = block_bytes(static_cast<std::size_t>(n > 0 ? n : 1) * sizeof(float));
  void* p = pool().get(bytes);
  return torch::from_blob(
      p, sizes, [bytes](void* q) { pool().put(q, bytes); },
      torch::TensorOptions().dtype(at::kFloat));
}

}  // namespace

// Forward. hidden [T, H] (fp32 or bf16), token_idx [S] (expert order -> token), wr [S] fp32
// routing weights (expert order), offsets [E+1] group starts. Returns (out [T, H] f32,
// h [S, 2I] f32 gate/up pre-activations).
std::vector<torch::Tensor> stream_forward(torch::Tensor hidden, torch::Tensor token_idx, torch::Tensor wr,
                                   torch::Tensor offsets, torch::Tensor w_gu,
                                   torch::Tensor w_down, torch::Tensor inv_perm, int64_t T,
                                   int64_t K, int64_t isa, int64_t gu_block, int64_t down_block) {
  ForwardArgs a;
  a.hs_bf16 = activations_bf16(hidden, "hidden_states");
  const i64 H = hidden.size(1);
  TORCH_CHECK(hidden.size(0) == T, "npu_lora_stream: hidden_states rows != T");
  set_routed(a, w_gu, w_down, H, token_idx, wr, offsets, inv_perm, T, K);
  const i64 I = a.gu.R / 2;
  a.hs = hidden.data_ptr();
  a.gu_block = gu_block;
  a.down_block = down_block;
  auto out = pooled({T, H});
  auto h = pooled({T * K, 2 * I});
  a.out = out.data_ptr<float>();
  a.h = h.data_ptr<float>();
  npu_lora_stream::forward(TorchPar{}, checked_ops(isa), a);
  return {out, h};
}

// Backward of the frozen experts. g [T, H] = dL/d(out) (fp32 or bf16). Returns (dx [T, H] f32,
// dw [S] f32 routing-weight gradient (expert order), dh [S, 2I] f32).
std::vector<torch::Tensor> stream_backward(torch::Tensor g, torch::Tensor token_idx, torch::Tensor h,
                                    torch::Tensor wr, torch::Tensor offsets, torch::Tensor w_gu,
                                    torch::Tensor w_down, torch::Tensor inv_perm, int64_t T,
                                    int64_t K, int64_t isa, int64_t down_split,
                                    int64_t gu_split) {
  BackwardArgs a;
  a.g_bf16 = activations_bf16(g, "grad_out");
  const i64 H = g.size(1);
  TORCH_CHECK(g.size(0) == T, "npu_lora_stream: grad_out rows != T");
  set_routed(a, w_gu, w_down, H, token_idx, wr, offsets, inv_perm, T, K);
  const i64 I = a.gu.R / 2;
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.is_contiguous() && h.size(0) == T * K &&
                  h.size(1) == 2 * I,
              "npu_lora_stream: h must be contiguous float32 [T*K, 2I]");
  a.g = g.data_ptr();
  a.h = h.data_ptr<float>();
  a.down_split = down_split;
  a.gu_split = gu_split;
  auto dx = pooled({T, H});
  auto dw = pooled({T * K});
  auto dh = pooled({T * K, 2 * I});
  a.dx = dx.data_ptr<float>();
  a.dw = dw.data_ptr<float>();
  a.dh = dh.data_ptr<float>();
  npu_lora_stream::backward(TorchPar{}, checked_ops(isa), a);
  return {dx, dw, dh};
}

// The arguments of both dense directions: a frozen weight w [R, C] (fp32 or bf16), rows x [N, K]
// (fp32 or bf16; K = C forward, R backward), `block` rows of W per task / partial.
DenseArgs dense_args(const torch::Tensor& x, const char* what, const torch::Tensor& w,
                     bool backward, int64_t block) {
  TORCH_CHECK(w.dim() == 2, "npu_lora_stream: dense weight must be [R, C]");
  DenseArgs a;
  a.w = weights(w.unsqueeze(0));
  a.x_bf16 = activations_bf16(x, what);
  TORCH_CHECK(x.size(1) == (backward ? a.w.R : a.w.C), "npu_lora_stream: ", what,
              backward ? " columns != weight rows" : " columns != weight columns");
  TORCH_CHECK(block > 0, "npu_lora_stream: block must be positive");
  a.x = x.data_ptr();
  a.N = x.size(0);
  a.block = block;
  return a;
}

// Dense forward: y [N, R] f32 = x W^T, rows of W in tasks of `block`.
torch::Tensor stream_dense_forward(torch::Tensor x, torch::Tensor w, int64_t isa, int64_t block) {
  DenseArgs a = dense_args(x, "x", w, false, block);
  auto y = torch::empty({a.N, a.w.R}, torch::TensorOptions().dtype(at::kFloat));
  a.out = y.data_ptr<float>();
  npu_lora_stream::dense_forward(TorchPar{}, checked_ops(isa), a);
  return y;
}

// Its backward: dx [N, C] f32 = g [N, R] . W, one partial per `block` rows of W, summed in order.
torch::Tensor stream_dense_backward(torch::Tensor g, torch::Tensor w, int64_t isa, int64_t block) {
  DenseArgs a = dense_args(g, "grad_out", w, true, block);
  auto dx = torch::empty({a.N, a.w.C}, torch::TensorOptions().dtype(at::kFloat));
  a.out = dx.data_ptr<float>();
  npu_lora_stream::dense_backward(TorchPar{}, checked_ops(isa), a);
  return dx;
}

// How many distinct threads one parallel phase runs on (torch's intra-op thread count, unless
// the extension was built without OpenMP, where at::parallel_for silently runs serially).
int64_t parallel_threads() {
  std::mutex mu;
  std::set<std::thread::id> ids;
  TorchPar{}.run([&] {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  return static_cast<int64_t>(ids.size());
}

// Which ISAs this CPU runs, slowest first (all are compiled); "amx" also needs the process to
// be granted the tile state, which this requests.
std::vector<std::string> cpu_isas() {
  std::vector<std::string> out{"base"};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    out.push_back("avx512");
  if (out.back() == "avx512" && __builtin_cpu_supports("avx512bf16")) out.push_back("avx512bf16");
  if (out.back() == "avx512bf16" && amx_request()) out.push_back("amx");
#endif
  return out;
}

void npu_lora_q8_bind(pybind11::module_& m);  // stream_q8.cpp (8-bit expert weights)

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  npu_lora_q8_bind(m);
  m.def("forward", &stream_forward, "streaming experts forward");
  m.def("backward", &stream_backward, "streaming experts backward (dX, routing-weight grad, dh)");
  m.def("dense_forward", &stream_dense_forward, "one frozen weight on a few rows: y = x W^T");
  m.def("dense_backward", &stream_dense_backward, "its backward: dx = g W (partials summed in order)");
  m.def("cpu_isas", &cpu_isas, "instruction-set paths this CPU can run");
  m.def("parallel_threads", &parallel_threads, "threads one parallel phase runs on");
  m.def("workspace_bytes", [] { return static_cast<int64_t>(npu_lora_stream::pool().cached()); },
        "bytes of scratch blocks cached for reuse between calls");
  m.def("trim_workspace", [] { npu_lora_stream::pool().trim(); }, "free the cached scratch blocks");
}
