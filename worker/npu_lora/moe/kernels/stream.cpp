// npu_lora streaming MoE experts kernel: torch bindings, task lists and the parallel loops.
//
// Legend: S sorted (token, slot) rows (expert order), T tokens, K slots, E experts, H hidden,
// I intermediate. Weights as transformers stores them: Wgu [E, 2I, H] (gate rows, then up rows),
// Wd [E, H, I]; fp32 or bf16 (read as raw 16-bit words and widened in registers).
//
// Each phase is one at::parallel_for over a task list that depends on the shapes and the routing
// only (never on the thread count); every output element is written by one task, partial sums
// are reduced in a fixed order: results are bitwise identical across runs and thread counts.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstdint>
#include <vector>

using i64 = long long;

namespace npu_lora_stream {
#define DECL(isa)                                                                           \
  void isa##_dot_f32(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);     \
  void isa##_dot_bf16(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, \
                      i64);                                                                 \
  void isa##_axpy_f32(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);    \
  void isa##_axpy_bf16(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, \
                       i64);                                                                \
  int isa##_pair();
DECL(base)
DECL(avx2)
DECL(avx512)
}  // namespace npu_lora_stream

namespace {
using namespace npu_lora_stream;

struct Ops {
  void (*dot_f32)(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);
  void (*dot_bf16)(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
  void (*axpy_f32)(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);
  void (*axpy_bf16)(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
  int pair;  // bf16 dot operand order: blocks of `pair` elements, evens then odds (1: natural)
};

// 0 base, 1 avx2, 2 avx512
Ops ops_for(int64_t isa) {
  if (isa == 2)
    return {avx512_dot_f32, avx512_dot_bf16, avx512_axpy_f32, avx512_axpy_bf16, avx512_pair()};
  if (isa == 1) return {avx2_dot_f32, avx2_dot_bf16, avx2_axpy_f32, avx2_axpy_bf16, avx2_pair()};
  return {base_dot_f32, base_dot_bf16, base_axpy_f32, base_axpy_bf16, base_pair()};
}

struct W {  // one weight tensor [E, R, C], fp32 or bf16
  const void* p;
  bool bf16;
  i64 R, C;
  const float* f(i64 e, i64 r) const { return static_cast<const float*>(p) + (e * R + r) * C; }
  const unsigned short* h(i64 e, i64 r) const {
    return static_cast<const unsigned short*>(p) + (e * R + r) * C;
  }
};

W weight(const torch::Tensor& t) {
  TORCH_CHECK(t.dim() == 3 && t.is_contiguous(), "npu_lora_stream: weights must be contiguous [E, R, C]");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              "npu_lora_stream: weights must be float32 or bfloat16, got ", t.scalar_type());
  return {t.data_ptr(), t.scalar_type() == at::kBFloat16, t.size(1), t.size(2)};
}

// out[t, r] = x[t, :] · w[e, r0 + r, :]
void dot(const Ops& o, const W& w, i64 e, i64 r0, i64 rows, const float* x, i64 ldx, i64 n,
         float* out, i64 ldo) {
  if (w.bf16) o.dot_bf16(w.h(e, r0), w.C, w.C, rows, x, ldx, n, out, ldo);
  else o.dot_f32(w.f(e, r0), w.C, w.C, rows, x, ldx, n, out, ldo);
}
// out[t, :] = sum_r coef[t, r] * w[e, r0 + r, :]
void axpy(const Ops& o, const W& w, i64 e, i64 r0, i64 rows, const float* c, i64 ldc, i64 n,
          float* out, i64 ldo) {
  if (w.bf16) o.axpy_bf16(w.h(e, r0), w.C, w.C, rows, c, ldc, n, out, ldo);
  else o.axpy_f32(w.f(e, r0), w.C, w.C, rows, c, ldc, n, out, ldo);
}

struct Task {
  i64 e, s0, n, r0, r1, part;
};

// (expert, row block) tasks over the hit experts; `block` rows per task.
std::vector<Task> tasks(const std::vector<i64>& off, i64 rows, i64 block) {
  std::vector<Task> out;
  const i64 E = static_cast<i64>(off.size()) - 1;
  for (i64 e = 0; e < E; ++e) {
    const i64 n = off[e + 1] - off[e];
    if (!n) continue;
    i64 p = 0;
    for (i64 r0 = 0; r0 < rows; r0 += block, ++p)
      out.push_back({e, off[e], n, r0, std::min(rows, r0 + block), p});
  }
  return out;
}

std::vector<i64> offsets_vec(const torch::Tensor& offsets) {
  auto o = offsets.contiguous().to(at::kLong);
  return std::vector<i64>(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
}

template <class F>
void run(const std::vector<Task>& ts, F f) {
  at::parallel_for(0, static_cast<int64_t>(ts.size()), 1, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) f(ts[i]);
  });
}

// out[t, :] = sum_k sum_p part[p][inv[t*K + k], :]  (rows >= valid are skipped), fixed order.
void combine(const float* part, i64 P, i64 S, i64 D, const int64_t* inv, i64 T, i64 K, i64 valid,
             float* out) {
  at::parallel_for(0, T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* o = out + t * D;
      for (i64 d = 0; d < D; ++d) o[d] = 0.f;
      for (i64 k = 0; k < K; ++k) {
        const i64 s = inv[t * K + k];
        if (s >= valid) continue;
        for (i64 p = 0; p < P; ++p) {
          const float* src = part + (p * S + s) * D;
          for (i64 d = 0; d < D; ++d) o[d] += src[d];
        }
      }
    }
  });
}

// Position of element j of a length-L row in the paired order (blocks of P: evens, then odds).
// P is 1 or a power of two (2 * vector width).
inline i64 paired(i64 j, i64 L, i64 P) {
  if (P <= 1 || j >= (L & ~(P - 1))) return j;
  const i64 q = j & (P - 1);
  return (j - q) + (q & 1) * (P >> 1) + (q >> 1);
}

inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

}  // namespace

// Forward. x_g [S, H] f32 (expert order), wr [S] f32 routing weights, offsets [E+1] group starts.
// Returns (out [T, H] f32, h [S, 2I] f32 gate/up pre-activations).
std::vector<torch::Tensor> forward(torch::Tensor x_g, torch::Tensor wr, torch::Tensor offsets,
                                   torch::Tensor w_gu, torch::Tensor w_down,
                                   torch::Tensor inv_perm, int64_t T, int64_t K, int64_t isa,
                                   int64_t gu_block, int64_t down_block) {
  TORCH_CHECK(x_g.scalar_type() == at::kFloat && x_g.is_contiguous());
  const W gu = weight(w_gu), dn = weight(w_down);
  const i64 S = x_g.size(0), H = x_g.size(1), I = gu.R / 2;
  TORCH_CHECK(gu.C == H && dn.R == H && dn.C == I, "npu_lora_stream: weight shapes do not match");
  const auto off = offsets_vec(offsets);
  const i64 valid = off.back();
  const Ops o = ops_for(isa);
  auto fopt = x_g.options();
  auto h = torch::empty({S, 2 * I}, fopt);
  auto a = torch::empty({S, I}, fopt);  // in the paired order when Wd is bf16
  auto y = torch::empty({S, H}, fopt);
  const float* xp = x_g.data_ptr<float>();
  const float* wp = wr.contiguous().data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* ap = a.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (valid < S) h.narrow(0, valid, S - valid).zero_();
  const i64 pg = gu.bf16 ? o.pair : 1, pd = dn.bf16 ? o.pair : 1;
  torch::Tensor xq = x_g;
  if (pg > 1) {  // x in the paired order of the bf16 dot kernel
    xq = torch::empty_like(x_g);
    float* q = xq.data_ptr<float>();
    at::parallel_for(0, S, 1, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s)
        for (i64 c = 0; c < H; ++c) q[s * H + paired(c, H, pg)] = xp[s * H + c];
    });
    xp = q;
  }
  // gate/up: gate rows [r0, r1) and up rows [I + r0, I + r1), then a = SiLU(gate) * up
  run(tasks(off, I, gu_block), [&](const Task& t) {
    const i64 rows = t.r1 - t.r0;
    float* ht = hp + t.s0 * 2 * I;
    dot(o, gu, t.e, t.r0, rows, xp + t.s0 * H, H, t.n, ht + t.r0, 2 * I);
    dot(o, gu, t.e, I + t.r0, rows, xp + t.s0 * H, H, t.n, ht + I + t.r0, 2 * I);
    for (i64 s = 0; s < t.n; ++s)
      for (i64 j = t.r0; j < t.r1; ++j) {
        const float g = ht[s * 2 * I + j];
        ap[(t.s0 + s) * I + paired(j, I, pd)] = g * sigmoid(g) * ht[s * 2 * I + I + j];
      }
  });
  // down: y[s, d] = wr[s] * a[s, :] · Wd[e, d, :]
  run(tasks(off, H, down_block), [&](const Task& t) {
    float* yt = yp + t.s0 * H;
    dot(o, dn, t.e, t.r0, t.r1 - t.r0, ap + t.s0 * I, I, t.n, yt + t.r0, H);
    for (i64 s = 0; s < t.n; ++s)
      for (i64 d = t.r0; d < t.r1; ++d) yt[s * H + d] *= wp[t.s0 + s];
  });
  auto out = torch::empty({T, H}, fopt);
  combine(yp, 1, S, H, inv_perm.data_ptr<int64_t>(), T, K, valid, out.data_ptr<float>());
  return {out, h};
}

// Backward of the frozen experts. g_g [S, H] f32 = dL/d(out) gathered to expert order.
// Returns (dx [T, H] f32, dw [S] f32 routing-weight gradient (expert order), dh [S, 2I] f32).
std::vector<torch::Tensor> backward(torch::Tensor g_g, torch::Tensor h, torch::Tensor wr,
                                    torch::Tensor offsets, torch::Tensor w_gu,
                                    torch::Tensor w_down, torch::Tensor inv_perm, int64_t T,
                                    int64_t K, int64_t isa, int64_t down_split,
                                    int64_t gu_split) {
  TORCH_CHECK(g_g.scalar_type() == at::kFloat && g_g.is_contiguous() && h.is_contiguous());
  const W gu = weight(w_gu), dn = weight(w_down);
  const i64 S = g_g.size(0), H = g_g.size(1), I = gu.R / 2;
  const auto off = offsets_vec(offsets);
  const i64 valid = off.back();
  const Ops o = ops_for(isa);
  auto fopt = g_g.options();
  const float* gp = g_g.data_ptr<float>();
  const float* hp = h.data_ptr<float>();
  const float* wp = wr.contiguous().data_ptr<float>();
  // z = g · Wd_e  (partials over row blocks of Wd, summed in block order)
  const auto t1 = tasks(off, H, down_split);
  const i64 P1 = (H + down_split - 1) / down_split;
  auto zpart = torch::empty({P1, S, I}, fopt);
  float* zp = zpart.data_ptr<float>();
  run(t1, [&](const Task& t) {
    axpy(o, dn, t.e, t.r0, t.r1 - t.r0, gp + t.s0 * H + t.r0, H, t.n,
         zp + (t.part * S + t.s0) * I, I);
  });
  auto dh = torch::zeros({S, 2 * I}, fopt);
  auto dw = torch::zeros({S}, fopt);
  float* dhp = dh.data_ptr<float>();
  float* dwp = dw.data_ptr<float>();
  at::parallel_for(0, valid, 1, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      const float* hs = hp + s * 2 * I;
      float* ds = dhp + s * 2 * I;
      float acc = 0.f;
      for (i64 i = 0; i < I; ++i) {
        float z = 0.f;
        for (i64 p = 0; p < P1; ++p) z += zp[(p * S + s) * I + i];
        const float g = hs[i], u = hs[I + i], sg = sigmoid(g), silu = g * sg;
        acc += silu * u * z;
        const float da = z * wp[s];
        ds[i] = da * u * (sg * (1.f + g * (1.f - sg)));
        ds[I + i] = da * silu;
      }
      dwp[s] = acc;
    }
  });
  // dx = dh · Wgu_e  (partials over row blocks of Wgu)
  const auto t2 = tasks(off, 2 * I, gu_split);
  const i64 P2 = (2 * I + gu_split - 1) / gu_split;
  auto dxpart = torch::empty({P2, S, H}, fopt);
  float* dxp = dxpart.data_ptr<float>();
  // experts split into fewer blocks than P2 never happen (same rows for every expert)
  run(t2, [&](const Task& t) {
    axpy(o, gu, t.e, t.r0, t.r1 - t.r0, dhp + t.s0 * 2 * I + t.r0, 2 * I, t.n,
         dxp + (t.part * S + t.s0) * H, H);
  });
  auto dx = torch::empty({T, H}, fopt);
  combine(dxp, P2, S, H, inv_perm.data_ptr<int64_t>(), T, K, valid, dx.data_ptr<float>());
  return {dx, dw, dh};
}

// Which ISAs this CPU runs (compiled ones are all three).
std::vector<std::string> cpu_isas() {
  std::vector<std::string> out{"base"};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back("avx2");
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    out.push_back("avx512");
#endif
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "streaming experts forward");
  m.def("backward", &backward, "streaming experts backward (dX, routing-weight grad, dh)");
  m.def("cpu_isas", &cpu_isas, "instruction-set paths this CPU can run");
}
