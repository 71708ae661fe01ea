// npu_lora streaming MoE experts with 8-bit frozen weights (int8 or FP8 e4m3 + fp32 scales):
// the forward and input-gradient drivers and their torch bindings (registered into the
// extension's module by stream.cpp through npu_lora_q8_bind).
//
// The same structure as the fp32/bf16 drivers of stream_core.h (tokens sorted by expert, one
// (hit expert, row block) task list per phase taken by torch's intra-op threads from a shared
// counter, each hit expert's bytes read once per direction, partial sums reduced in a fixed
// order: bitwise deterministic across runs and thread counts), with the 8-bit micro-kernels of
// stream_q8_isa.h: each weight vector is loaded as bytes and dequantised in registers (never a
// wider copy of an expert in memory). Operands (hidden states, activations, gradients) and every
// accumulation are fp32: the result is "dequantise to fp32, then matmul" up to fp32 rounding.
// Except with bf16 activations on AVX512-BF16 (avx512bf16 and amx codes): the kernels of
// stream_q8_avx512bf16.cpp, bf16 operands (tokens, SiLU·up activations, dX coefficients rounded
// to bf16 as the bf16 kernel rounds them), the bytes widened to bf16, fp32 accumulation.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "stream_core.h"

std::vector<std::string> cpu_isas();  // stream.cpp

namespace npu_lora_stream {
#define NPU_LORA_Q8_DECL(isa)                                                                   \
  void isa##_q8_dot(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64, bool, \
                    const float*, i64, i64, float*, i64);                                       \
  void isa##_q8_axpy(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64, bool, \
                     const float*, i64, i64, float*, i64);
NPU_LORA_Q8_DECL(base)
NPU_LORA_Q8_DECL(avx2)
NPU_LORA_Q8_DECL(avx512)
#undef NPU_LORA_Q8_DECL
// bf16 operands (stream_q8_avx512bf16.cpp): the forward's x as bf16 words, the axpy's fp32
// coefficients rounded to bf16 inside (after the row scale is folded in, one block per row)
void avx512bf16_q8_dotn(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64, bool,
                        const unsigned short*, i64, i64, float*, i64);
void avx512bf16_q8_axpyn(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64,
                         bool, const float*, i64, i64, float*, i64);
bool avx512bf16_q8n_supported(i64 L, i64 BC);
}  // namespace npu_lora_stream

namespace {
using namespace npu_lora_stream;
typedef void (*Q8Kernel)(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64,
                         bool, const float*, i64, i64, float*, i64);
typedef void (*Q8KernelN)(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64,
                          bool, const unsigned short*, i64, i64, float*, i64);

struct Q8Ops {
  Q8Kernel dot, axpy;
  const char* name;
  // bf16 operands (nullptr: the fp32 kernels above run every call)
  Q8KernelN dotn = nullptr;
  Q8Kernel axpyn = nullptr;
  // vectorised elementwise rows of the bf16-operand path, the bf16 kernel's own (stream_core.h;
  // dh_row's bf16 copy not wanted: the 8-bit axpy rounds its coefficients itself) (nullptr: the
  // scalar loops)
  void (*act_row)(const float*, i64, i64, i64, bf16_t*) = nullptr;
  float (*dh_row)(const float*, const float*, i64, i64, i64, float, float*, bf16_t*) = nullptr;
};

// the instance for an ISA code of ISA_CODES: amx and avx512bf16 run the AVX-512 instance for
// fp32 activations and the AVX512-BF16 kernels (bf16 operands) for bf16 activations
Q8Ops q8_ops(int64_t isa) {
  static const char* const names[] = {"base", "avx2", "avx512", "avx512bf16", "amx"};
  TORCH_CHECK(isa >= kBase && isa <= kAmx, "npu_lora_stream q8: unknown ISA code ", isa);
  static const std::vector<std::string> runs = cpu_isas();
  TORCH_CHECK(std::find(runs.begin(), runs.end(), names[isa]) != runs.end(),
              "npu_lora_stream q8: ISA ", names[isa], " requested, this CPU runs up to ",
              runs.back());
  // the bf16-operand kernels widen e4m3 with VBMI byte tables (`vpermi2b`): AVX512-BF16 CPUs
  // without VBMI (Cooper Lake) run the AVX-512 instance
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  if (isa >= kAvx512Bf16 && vbmi)
    return {avx512_q8_dot,       avx512_q8_axpy,        "avx512bf16",        avx512bf16_q8_dotn,
            avx512bf16_q8_axpyn, avx512bf16_act_row,    avx512bf16_dh_row};
  if (isa >= kAvx512) return {avx512_q8_dot, avx512_q8_axpy, "avx512"};
  if (isa == kAvx2) return {avx2_q8_dot, avx2_q8_axpy, "avx2"};
  return {base_q8_dot, base_q8_axpy, "base"};
}

// One 8-bit weight tensor [E, R, C] with scales [E, SR, SC], blocks of BR x BC elements.
struct QW {
  const signed char* q;
  const float* s;
  bool fp8;
  i64 R, C, BR, BC, SR, SC;
  const signed char* row(i64 e, i64 r) const { return q + (e * R + r) * C; }
  const float* scales(i64 e) const { return s + e * SR * SC; }
};

QW qweights(const torch::Tensor& q, const torch::Tensor& s, int64_t br, int64_t bc,
            const char* what) {
  TORCH_CHECK(q.dim() == 3 && q.is_contiguous(), "npu_lora_stream q8: ", what,
              " must be contiguous [E, R, C]");
  const bool fp8 = q.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(fp8 || q.scalar_type() == at::kChar, "npu_lora_stream q8: ", what,
              " must be int8 or float8_e4m3fn, got ", q.scalar_type());
  QW w{static_cast<const signed char*>(q.data_ptr()), nullptr, fp8, q.size(1), q.size(2), 0, 0,
       0, 0};
  w.BR = br > 0 ? br : 1;
  w.BC = bc > 0 ? bc : w.C;
  w.SR = (w.R + w.BR - 1) / w.BR;
  w.SC = (w.C + w.BC - 1) / w.BC;
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.dim() == 3 &&
                  s.size(0) == q.size(0) && s.size(1) == w.SR && s.size(2) == w.SC,
              "npu_lora_stream q8: ", what, " scales must be contiguous float32 [E, ", w.SR, ", ",
              w.SC, "], got ", s.sizes());
  w.s = s.data_ptr<float>();
  return w;
}

struct Routed {
  QW gu, dn;
  const int64_t* token_idx;
  const float* wr;
  std::vector<i64> off;
  const int64_t* inv;
  i64 T, K;
};

Routed routed(const torch::Tensor& q_gu, const torch::Tensor& s_gu, const torch::Tensor& q_dn,
              const torch::Tensor& s_dn, int64_t br, int64_t bc, i64 H,
              const torch::Tensor& token_idx, const torch::Tensor& wr,
              const torch::Tensor& offsets, const torch::Tensor& inv, i64 T, i64 K) {
  Routed a{qweights(q_gu, s_gu, br, bc, "gate_up_proj"), qweights(q_dn, s_dn, br, bc, "down_proj"),
           nullptr, nullptr, {}, nullptr, T, K};
  TORCH_CHECK(a.gu.C == H && a.dn.R == H && a.dn.C == a.gu.R / 2 && a.gu.R % 2 == 0,
              "npu_lora_stream q8: weight shapes do not match the hidden size");
  TORCH_CHECK(a.gu.fp8 == a.dn.fp8, "npu_lora_stream q8: gate_up_proj and down_proj dtypes differ");
  TORCH_CHECK(token_idx.scalar_type() == at::kLong && token_idx.is_contiguous() &&
                  token_idx.numel() == T * K,
              "npu_lora_stream q8: token_idx must be contiguous int64 [T*K]");
  TORCH_CHECK(inv.scalar_type() == at::kLong && inv.is_contiguous() && inv.numel() == T * K,
              "npu_lora_stream q8: inv_perm must be contiguous int64 [T*K]");
  TORCH_CHECK(wr.scalar_type() == at::kFloat && wr.is_contiguous() && wr.numel() == T * K,
              "npu_lora_stream q8: routing weights must be contiguous float32 [T*K]");
  auto o = offsets.contiguous().to(at::kLong);
  a.off.assign(o.data_ptr<int64_t>(), o.data_ptr<int64_t>() + o.numel());
  TORCH_CHECK(static_cast<i64>(a.off.size()) == q_gu.size(0) + 1,
              "npu_lora_stream q8: offsets must be [E+1]");
  a.token_idx = token_idx.data_ptr<int64_t>();
  a.wr = wr.data_ptr<float>();
  a.inv = inv.data_ptr<int64_t>();
  return a;
}

struct Par {
  template <class F>
  void run(F&& f) const {
    const int64_t n = at::get_num_threads();
    at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) f();
    });
  }
};

torch::Tensor pooled_f32(std::vector<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  const std::size_t bytes = block_bytes(static_cast<std::size_t>(n > 0 ? n : 1) * sizeof(float));
  void* p = pool().get(bytes);
  return torch::from_blob(
      p, sizes, [bytes](void* q) { pool().put(q, bytes); },
      torch::TensorOptions().dtype(at::kFloat));
}

torch::Tensor activations(const torch::Tensor& t, i64 T, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == T, "npu_lora_stream q8: ", what, " must be [T, H]");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
              "npu_lora_stream q8: ", what, " must be float32 or bfloat16");
  return t.contiguous();
}

// dst[s, :] = src[token_idx[s], :] widened to fp32, for the valid rows s
void gather_f32(const Routed& a, const torch::Tensor& src, i64 H, float* dst, i64 ld) {
  const bool b16 = src.scalar_type() == at::kBFloat16;
  const void* base = src.data_ptr();
  for_range(Par{}, a.off.back(), 16, [&](i64 s) {
    float* d = dst + s * ld;
    const i64 t = a.token_idx[s];
    if (b16) {
      const bf16_t* x = static_cast<const bf16_t*>(base) + t * H;
      for (i64 c = 0; c < H; ++c) d[c] = bf16_to_f32(x[c]);
    } else {
      std::memcpy(d, static_cast<const float*>(base) + t * H, H * sizeof(float));
    }
  });
}

// out[t, :] = sum_k sum_p part[p][inv[t*K + k], :] (invalid rows skipped), fixed order
void combine_f32(const Routed& a, const float* part, i64 P, i64 pstride, i64 ld, i64 D,
                 float* out) {
  const i64 valid = a.off.back();
  for_range(Par{}, a.T, 8, [&](i64 t) {
    float* o = out + t * D;
    for (i64 d = 0; d < D; ++d) o[d] = 0.f;
    for (i64 k = 0; k < a.K; ++k) {
      const i64 s = a.inv[t * a.K + k];
      if (s >= valid) continue;
      for (i64 p = 0; p < P; ++p) {
        const float* src = part + p * pstride + s * ld;
        for (i64 d = 0; d < D; ++d) o[d] += src[d];
      }
    }
  });
}

// the bf16-operand kernels run: an ISA that has them, bf16 activations, block layouts they take
bool native(const Q8Ops& o, const Routed& a, const torch::Tensor& act) {
  return o.dotn && act.scalar_type() == at::kBFloat16 &&
         avx512bf16_q8n_supported(a.gu.C, a.gu.BC) && avx512bf16_q8n_supported(a.dn.C, a.dn.BC);
}

void q8_dot(const Q8Ops& o, const QW& w, i64 e, i64 r0, i64 rows, const float* x, i64 ldx, i64 n,
            float* out, i64 ldo) {
  o.dot(w.row(e, r0), w.C, w.C, r0, rows, w.scales(e), w.SC, w.BR, w.BC, w.fp8, x, ldx, n, out,
        ldo);
}
void q8_dotn(const Q8Ops& o, const QW& w, i64 e, i64 r0, i64 rows, const bf16_t* x, i64 ldx,
             i64 n, float* out, i64 ldo) {
  o.dotn(w.row(e, r0), w.C, w.C, r0, rows, w.scales(e), w.SC, w.BR, w.BC, w.fp8, x, ldx, n, out,
         ldo);
}
void q8_axpy(const Q8Ops& o, const QW& w, i64 e, i64 r0, i64 rows, const float* c, i64 ldc, i64 n,
             float* out, i64 ldo, bool nat = false) {
  (nat ? o.axpyn : o.axpy)(w.row(e, r0), w.C, w.C, r0, rows, w.scales(e), w.SC, w.BR, w.BC, w.fp8, c, ldc, n, out,
         ldo);
}

}  // namespace

// Forward with 8-bit weights: hidden [T, H] (fp32 or bf16), routing as stream_forward, q_gu
// [E, 2I, H] / q_dn [E, H, I] int8 or float8_e4m3fn, scales [E, SR, SC] fp32 for blocks of
// block_r x block_c (<= 0: a whole row; int8 per channel: 1 x 0). Returns (out [T, H] f32,
// h [S, 2I] f32).
std::vector<torch::Tensor> q8_forward(torch::Tensor hidden, torch::Tensor token_idx,
                                      torch::Tensor wr, torch::Tensor offsets, torch::Tensor q_gu,
                                      torch::Tensor s_gu, torch::Tensor q_dn, torch::Tensor s_dn,
                                      torch::Tensor inv_perm, int64_t T, int64_t K,
                                      int64_t block_r, int64_t block_c, int64_t isa,
                                      int64_t gu_block, int64_t down_block) {
  const Q8Ops o = q8_ops(isa);
  hidden = activations(hidden, T, "hidden_states");
  const i64 H = hidden.size(1);
  const Routed a = routed(q_gu, s_gu, q_dn, s_dn, block_r, block_c, H, token_idx, wr, offsets,
                          inv_perm, T, K);
  TORCH_CHECK(gu_block > 0 && down_block > 0, "npu_lora_stream q8: blocks must be positive");
  const i64 I = a.gu.R / 2, S = T * K, valid = a.off.back();
  auto out = pooled_f32({T, H});
  auto hten = pooled_f32({S, 2 * I});
  float* h = hten.data_ptr<float>();
  // bf16 activations on an AVX512-BF16 ISA: the tokens and the SiLU·up activations as bf16 words
  // (rounded, as the bf16 kernel holds them), the bf16-operand kernels
  const bool N16 = native(o, a, hidden);
  const i64 LX = padded_ld(H, 4), LI = padded_ld(I, 4), LY = padded_ld(H, 4);
  const i64 LXn = padded_ld(H, 2), LIn = padded_ld(I, 2);
  Buf<float> xf(N16 ? 0 : S * LX), af(N16 ? 0 : S * LI), y(S * LY);
  Buf<bf16_t> xn(N16 ? S * LXn : 0), an(N16 ? S * LIn : 0);
  if (N16) {
    const bf16_t* src = static_cast<const bf16_t*>(hidden.data_ptr());
    for_range(Par{}, valid, 16, [&](i64 s) {
      std::memcpy(xn.get() + s * LXn, src + a.token_idx[s] * H, H * sizeof(bf16_t));
    });
  } else {
    gather_f32(a, hidden, H, xf.get(), LX);
  }
  if (valid < S) std::memset(h + valid * 2 * I, 0, (S - valid) * 2 * I * sizeof(float));
  {
    for_tasks(Par{}, make_tasks(a.off, I, gu_block), [&](const Task& t) {
      const i64 rows = t.r1 - t.r0;
      float* ht = h + t.s0 * 2 * I;
      if (N16) {
        const bf16_t* x = xn.get() + t.s0 * LXn;
        q8_dotn(o, a.gu, t.e, t.r0, rows, x, LXn, t.n, ht + t.r0, 2 * I);
        q8_dotn(o, a.gu, t.e, I + t.r0, rows, x, LXn, t.n, ht + I + t.r0, 2 * I);
      } else {
        const float* x = xf.get() + t.s0 * LX;
        q8_dot(o, a.gu, t.e, t.r0, rows, x, LX, t.n, ht + t.r0, 2 * I);
        q8_dot(o, a.gu, t.e, I + t.r0, rows, x, LX, t.n, ht + I + t.r0, 2 * I);
      }
      if (N16 && o.act_row) {
        for (i64 s = 0; s < t.n; ++s)
          o.act_row(ht + s * 2 * I, I, t.r0, t.r1, an.get() + (t.s0 + s) * LIn);
        return;
      }
      for (i64 s = 0; s < t.n; ++s)
        for (i64 j = t.r0; j < t.r1; ++j) {
          const float g = ht[s * 2 * I + j];
          const float v = g * sigmoid(g) * ht[s * 2 * I + I + j];
          if (N16) an.get()[(t.s0 + s) * LIn + j] = f32_to_bf16(v);
          else af.get()[(t.s0 + s) * LI + j] = v;
        }
    });
    for_tasks(Par{}, make_tasks(a.off, H, down_block), [&](const Task& t) {
      float* yt = y.get() + t.s0 * LY;
      if (N16)
        q8_dotn(o, a.dn, t.e, t.r0, t.r1 - t.r0, an.get() + t.s0 * LIn, LIn, t.n, yt + t.r0, LY);
      else
        q8_dot(o, a.dn, t.e, t.r0, t.r1 - t.r0, af.get() + t.s0 * LI, LI, t.n, yt + t.r0, LY);
      for (i64 s = 0; s < t.n; ++s)
        for (i64 d = t.r0; d < t.r1; ++d) yt[s * LY + d] *= a.wr[t.s0 + s];
    });
    combine_f32(a, y.get(), 1, 0, LY, H, out.data_ptr<float>());
  }
  return {out, hten};
}

// Backward of the frozen 8-bit experts: g [T, H] = dL/d(out). Returns (dx [T, H] f32, dw [S] f32
// routing-weight gradient (expert order), dh [S, 2I] f32).
std::vector<torch::Tensor> q8_backward(torch::Tensor g, torch::Tensor token_idx, torch::Tensor h,
                                       torch::Tensor wr, torch::Tensor offsets,
                                       torch::Tensor q_gu, torch::Tensor s_gu, torch::Tensor q_dn,
                                       torch::Tensor s_dn, torch::Tensor inv_perm, int64_t T,
                                       int64_t K, int64_t block_r, int64_t block_c, int64_t isa,
                                       int64_t down_split, int64_t gu_split) {
  const Q8Ops o = q8_ops(isa);
  g = activations(g, T, "grad_out");
  const i64 H = g.size(1);
  const Routed a = routed(q_gu, s_gu, q_dn, s_dn, block_r, block_c, H, token_idx, wr, offsets,
                          inv_perm, T, K);
  const i64 I = a.gu.R / 2, S = T * K, valid = a.off.back();
  TORCH_CHECK(h.scalar_type() == at::kFloat && h.is_contiguous() && h.size(0) == S &&
                  h.size(1) == 2 * I,
              "npu_lora_stream q8: h must be contiguous float32 [T*K, 2I]");
  TORCH_CHECK(down_split > 0 && gu_split > 0, "npu_lora_stream q8: splits must be positive");
  const float* hp = h.data_ptr<float>();
  auto dxt = pooled_f32({T, H});
  auto dwt = pooled_f32({S});
  auto dht = pooled_f32({S, 2 * I});
  float *dw = dwt.data_ptr<float>(), *dh = dht.data_ptr<float>();
  const i64 LG = padded_ld(H, 4), LZ = padded_ld(I, 4), LX = padded_ld(H, 4);
  const i64 P1 = (H + down_split - 1) / down_split, P2 = (2 * I + gu_split - 1) / gu_split;
  // bf16 gradients on an AVX512-BF16 ISA: the bf16-operand kernels (the coefficients g and dh
  // rounded to bf16 inside them, after the row scale is folded in for one block per row)
  const bool N16 = native(o, a, g);
  Buf<float> gg(S * LG), zpart(P1 * S * LZ), dxpart(P2 * S * LX);
  gather_f32(a, g, H, gg.get(), LG);
  // z = g . Wd_e (one partial per row block of Wd)
  for_tasks(Par{}, make_tasks(a.off, H, down_split), [&](const Task& t) {
    float* z = zpart.get() + (t.part * S + t.s0) * LZ;
    q8_axpy(o, a.dn, t.e, t.r0, t.r1 - t.r0, gg.get() + t.s0 * LG + t.r0, LG, t.n, z, LZ, N16);
  });
  if (valid < S) {
    std::memset(dh + valid * 2 * I, 0, (S - valid) * 2 * I * sizeof(float));
    std::memset(dw + valid, 0, (S - valid) * sizeof(float));
  }
  // dw = <act, z>; dh = [w z u SiLU'(gate), w z SiLU(gate)]
  for_range(Par{}, valid, 16, [&](i64 s) {
    const float* hs = hp + s * 2 * I;
    float* ds = dh + s * 2 * I;
    if (N16 && o.dh_row) {
      dw[s] = o.dh_row(hs, zpart.get() + s * LZ, S * LZ, P1, I, a.wr[s], ds, nullptr);
      return;
    }
    float acc = 0.f;
    for (i64 i = 0; i < I; ++i) {
      float z = 0.f;
      for (i64 p = 0; p < P1; ++p) z += zpart.get()[(p * S + s) * LZ + i];
      const float gt = hs[i], u = hs[I + i], sg = sigmoid(gt), silu = gt * sg;
      acc += silu * u * z;
      const float da = z * a.wr[s];
      ds[i] = da * u * (sg * (1.f + gt * (1.f - sg)));
      ds[I + i] = da * silu;
    }
    dw[s] = acc;
  });
  // dx = dh . Wgu_e (one partial per row block of Wgu)
  for_tasks(Par{}, make_tasks(a.off, 2 * I, gu_split), [&](const Task& t) {
    float* dx = dxpart.get() + (t.part * S + t.s0) * LX;
    q8_axpy(o, a.gu, t.e, t.r0, t.r1 - t.r0, dh + t.s0 * 2 * I + t.r0, 2 * I, t.n, dx, LX, N16);
  });
  combine_f32(a, dxpart.get(), P2, S * LX, LX, H, dxt.data_ptr<float>());
  return {dxt, dwt, dht};
}

// Dequantise experts [E, R, C] (8-bit + scales) to fp32 or bf16 in one pass: the reference of
// the tests, the hot experts' copy to the device and export (one expert at a time by slicing).
torch::Tensor q8_dequantize(torch::Tensor q, torch::Tensor s, int64_t block_r, int64_t block_c,
                            bool to_bf16) {
  q = q.contiguous();
  s = s.contiguous();
  const QW w = qweights(q, s, block_r, block_c, "weights");
  const i64 E = q.size(0);
  auto out = torch::empty({E, w.R, w.C},
                          torch::TensorOptions().dtype(to_bf16 ? at::kBFloat16 : at::kFloat));
  const signed char* qp = w.q;
  at::BFloat16* ob = to_bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
  float* of = to_bf16 ? nullptr : out.data_ptr<float>();
  for_range(Par{}, E * w.R, 16, [&](i64 er) {
    const i64 e = er / w.R, r = er % w.R;
    const float* sr = w.scales(e) + r / w.BR * w.SC;
    const signed char* src = qp + er * w.C;
    for (i64 c = 0; c < w.C; ++c) {
      float v;
      if (w.fp8) {
        const float f = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(src[c]),
                                                              c10::Float8_e4m3fn::from_bits()));
        v = f * sr[c / w.BC];
      } else {
        v = static_cast<float>(src[c]) * sr[c / w.BC];
      }
      if (ob) ob[er * w.C + c] = at::BFloat16(v);
      else of[er * w.C + c] = v;
    }
  });
  return out;
}

void npu_lora_q8_bind(pybind11::module_& m) {
  m.def("q8_forward", &q8_forward, "streaming experts forward, 8-bit weights");
  m.def("q8_backward", &q8_backward, "streaming experts backward (dX, dw, dh), 8-bit weights");
  m.def("q8_dequantize", &q8_dequantize, "8-bit experts + scales to fp32 / bf16");
  m.def("q8_instance", [](int64_t isa) { return std::string(q8_ops(isa).name); },
        "the 8-bit kernel instance an ISA code runs (avx512bf16: bf16-operand kernels for bf16 "
        "activations, the avx512 ones for fp32)");
}
