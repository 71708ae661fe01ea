// 8-bit expert weights (int8 or FP8 e4m3 bytes + fp32 scales): single-threaded micro-kernels,
// compiled once per instruction set (stream_q8_<isa>.cpp).
//
// Included after `#pragma GCC target(...)` and the definition of the traits `Q` (register type,
// width W, tiles, loads, fma, and the two dequantising loads `i8` / `e4m3`). Like stream_isa.h:
// no standard-library header and internal linkage only, so code compiled for one ISA can never be
// picked by the linker for another.
//
// Weights: q [rows, ldq] bytes; the scale of element (r, c) is s[r / BR * lds + c / BC] (int8
// per output channel: BR = 1, BC = the row length; fine-grained FP8: BR = BC = 128; per-channel
// FP8: BR = 1, BC = the row length). Dequantised in registers only: a weight vector is loaded as
// bytes, widened to fp32 (int8: sign-extend + convert; e4m3: the sign/exponent/mantissa bits
// placed into an IEEE half and widened by the hardware's half->single conversion, exact for every
// e4m3 value including subnormals, whatever MXCSR's DAZ says, times 2^8 folded into the scale)
// and multiplied by its block's scale. Accumulation is fp32 in an order fixed by the shapes.
//
//   q8_dot_rows:  out[t, r] = sum_c x[t, c] * W[r, c]      (forward direction)
//   q8_axpy_rows: out[t, c] = sum_r coef[t, r] * W[r, c]   (input-gradient direction; the rows
//                                                           are added in row order)
//
// BC must be a multiple of W (it is: 128, or the whole row); columns past the last whole vector
// of a block run a scalar tail with the same dequantisation.

#include "stream_tiles.h"

namespace {

using i64 = long long;
typedef signed char q8_t;

// e4m3 (bias 7) -> fp32 / 2^8, scalar (tails and the baseline instance): the bits as an IEEE half
// (bias 15), widened exactly
static inline float e4m3_scalar(unsigned char b) {
  const unsigned int sign = (b & 0x80u) << 24, em = b & 0x7fu;
  const unsigned int exp = em >> 3, man = em & 7u;
  float f;
  if (exp == 0) {
    f = static_cast<float>(man) * (1.f / 512.f) / 256.f;  // man/8 * 2^-6, / 2^8
  } else {
    const unsigned int u = ((exp + 120u - 8u) << 23) | (man << 20);  // 2^(exp-7) / 2^8
    __builtin_memcpy(&f, &u, 4);
  }
  unsigned int u;
  __builtin_memcpy(&u, &f, 4);
  u |= sign;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
static inline float deq_scalar(q8_t v, bool fp8) {
  return fp8 ? e4m3_scalar(static_cast<unsigned char>(v)) : static_cast<float>(v);
}
// what the fp8 scales are multiplied by (the e4m3 loads return the value / 2^8)
static constexpr float kE4m3Mul = 256.f;

static inline i64 q8_min(i64 a, i64 b) { return a < b ? a : b; }

// one tile: RB weight rows x NB tokens of accumulators, over the column blocks of the rows
template <bool FP8, int RB, int NB>
static inline void q8_dot_tile(const q8_t* q, i64 ldq, i64 L, const float* s, i64 lds, i64 BR,
                               i64 r0, i64 BC, const float* x, i64 ldx, float* out, i64 ldo,
                               const q8_t* pf) {
  typename Q::reg acc[RB][NB];
  float tail[RB][NB];
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      acc[r][t] = Q::zero();
      tail[r][t] = 0.f;
    }
  const float mul = FP8 ? kE4m3Mul : 1.f;
  for (i64 b0 = 0; b0 < L; b0 += BC) {
    const i64 b1 = q8_min(L, b0 + BC), cb = b0 / BC;
    typename Q::reg sv[RB];
    float ss[RB];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      ss[r] = s[(r0 + r) / BR * lds + cb] * mul;
      sv[r] = Q::set1(ss[r]);
    }
    i64 c = b0;
    for (; c + Q::W <= b1; c += Q::W) {
      if (pf && (c & 63) == 0)
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r) __builtin_prefetch(pf + r * ldq + c, 0, 2);
      typename Q::reg wv[RB];
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r)
        wv[r] = Q::mul(FP8 ? Q::e4m3(q + r * ldq + c) : Q::i8(q + r * ldq + c), sv[r]);
#pragma GCC unroll 16
      for (int t = 0; t < NB; ++t) {
        const typename Q::reg xv = Q::load(x + t * ldx + c);
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r) acc[r][t] = Q::fma(wv[r], xv, acc[r][t]);
      }
    }
    for (; c < b1; ++c)
      for (int r = 0; r < RB; ++r) {
        const float w = deq_scalar(q[r * ldq + c], FP8) * ss[r];
        for (int t = 0; t < NB; ++t) tail[r][t] += w * x[t * ldx + c];
      }
  }
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) out[t * ldo + r] = Q::hsum(acc[r][t]) + tail[r][t];
}

// rows [r0, r0 + R) of one expert (q points at row r0; the scales' row index is absolute)
template <bool FP8>
static void q8_dot_rows(const q8_t* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s, i64 lds,
                        i64 BR, i64 BC, const float* x, i64 ldx, i64 n, float* out, i64 ldo) {
  constexpr int RB = Q::DOT_RB, NBM = Q::DOT_NB;
  auto rows = [&](auto rb, i64 r) {
    constexpr int RBv = decltype(rb)::value;
    const q8_t* pf = r + 2 * RB + RBv <= R ? q + (r + 2 * RB) * ldq : nullptr;
    token_tiles<NBM>(n, [&](i64, i64 t0, i64 m) {
      with_width<NBM>(m, [&](auto nb) {
        q8_dot_tile<FP8, RBv, decltype(nb)::value>(q + r * ldq, ldq, L, s, lds, BR, r0 + r, BC,
                                                  x + t0 * ldx, ldx, out + t0 * ldo + r, ldo,
                                                  t0 == 0 ? pf : nullptr);
      });
    });
  };
  i64 r = 0;
  for (; r + RB <= R; r += RB) rows(IntC<RB>{}, r);
  for (; r < R; ++r) rows(IntC<1>{}, r);
}

// axpy tile: RR weight rows x NB tokens; the out rows (L1) are the accumulators, the RR x NB
// coefficients are read as broadcasts
template <bool FP8, int RR, int NB>
static inline void q8_axpy_tile(const q8_t* q, i64 ldq, i64 L, const float* s, i64 lds, i64 BR,
                                i64 r0, i64 BC, const float* coef, i64 ldc, float* out, i64 ldo,
                                bool first, const q8_t* pf) {
  const float mul = FP8 ? kE4m3Mul : 1.f;
  typename Q::reg cf[NB][RR];
#pragma GCC unroll 16
  for (int t = 0; t < NB; ++t)
#pragma GCC unroll 16
    for (int j = 0; j < RR; ++j) cf[t][j] = Q::set1(coef[t * ldc + j]);
  for (i64 b0 = 0; b0 < L; b0 += BC) {
    const i64 b1 = q8_min(L, b0 + BC), cb = b0 / BC;
    typename Q::reg sv[RR];
    float ss[RR];
#pragma GCC unroll 16
    for (int j = 0; j < RR; ++j) {
      ss[j] = s[(r0 + j) / BR * lds + cb] * mul;
      sv[j] = Q::set1(ss[j]);
    }
    i64 c = b0;
    for (; c + Q::W <= b1; c += Q::W) {
      if (pf && (c & 63) == 0)
#pragma GCC unroll 16
        for (int j = 0; j < RR; ++j) __builtin_prefetch(pf + j * ldq + c, 0, 2);
      typename Q::reg wv[RR];
#pragma GCC unroll 16
      for (int j = 0; j < RR; ++j)
        wv[j] = Q::mul(FP8 ? Q::e4m3(q + j * ldq + c) : Q::i8(q + j * ldq + c), sv[j]);
#pragma GCC unroll 16
      for (int t = 0; t < NB; ++t) {
        typename Q::reg acc = first ? Q::zero() : Q::load(out + t * ldo + c);
#pragma GCC unroll 16
        for (int j = 0; j < RR; ++j) acc = Q::fma(cf[t][j], wv[j], acc);
        Q::store(out + t * ldo + c, acc);
      }
    }
    for (; c < b1; ++c) {
      float w[RR];
      for (int j = 0; j < RR; ++j) w[j] = deq_scalar(q[j * ldq + c], FP8) * ss[j];
      for (int t = 0; t < NB; ++t) {
        float a = first ? 0.f : out[t * ldo + c];
        for (int j = 0; j < RR; ++j) a += coef[t * ldc + j] * w[j];
        out[t * ldo + c] = a;
      }
    }
  }
}

// out[t, c] (t < n, c < L) = sum over rows [r0, r0 + R) of coef[t, r - r0] * W[r, c]
template <bool FP8>
static void q8_axpy_rows(const q8_t* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s, i64 lds,
                         i64 BR, i64 BC, const float* coef, i64 ldc, i64 n, float* out,
                         i64 ldo) {
  constexpr int RR = Q::AXPY_RR, NBM = Q::AXPY_NB;
  auto rows = [&](auto rr, i64 r) {
    constexpr int RRv = decltype(rr)::value;
    const q8_t* pf = r + 2 * RR + RRv <= R ? q + (r + 2 * RR) * ldq : nullptr;
    token_tiles<NBM>(n, [&](i64, i64 t0, i64 m) {
      with_width<NBM>(m, [&](auto nb) {
        q8_axpy_tile<FP8, RRv, decltype(nb)::value>(q + r * ldq, ldq, L, s, lds, BR, r0 + r, BC,
                                                   coef + t0 * ldc + r, ldc, out + t0 * ldo, ldo,
                                                   r == 0, t0 == 0 ? pf : nullptr);
      });
    });
  };
  i64 r = 0;
  for (; r + RR <= R; r += RR) rows(IntC<RR>{}, r);
  for (; r < R; ++r) rows(IntC<1>{}, r);
}

}  // namespace

// The exported entry points of one instance: q points at the expert's row r0.
#define NPU_LORA_Q8_EXPORT(isa)                                                                  \
  namespace npu_lora_stream {                                                                    \
  void isa##_q8_dot(const signed char* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s,        \
                    i64 lds, i64 BR, i64 BC, bool fp8, const float* x, i64 ldx, i64 n,          \
                    float* out, i64 ldo) {                                                       \
    if (fp8) q8_dot_rows<true>(q, ldq, L, r0, R, s, lds, BR, BC, x, ldx, n, out, ldo);           \
    else q8_dot_rows<false>(q, ldq, L, r0, R, s, lds, BR, BC, x, ldx, n, out, ldo);              \
  }                                                                                              \
  void isa##_q8_axpy(const signed char* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s,       \
                     i64 lds, i64 BR, i64 BC, bool fp8, const float* c, i64 ldc, i64 n,         \
                     float* out, i64 ldo) {                                                      \
    if (fp8) q8_axpy_rows<true>(q, ldq, L, r0, R, s, lds, BR, BC, c, ldc, n, out, ldo);          \
    else q8_axpy_rows<false>(q, ldq, L, r0, R, s, lds, BR, BC, c, ldc, n, out, ldo);             \
  }                                                                                              \
  }
