// 8-bit expert weights, AVX-512 + AVX512-BF16 instance with bf16 operands (what the avx512bf16
// and amx paths run for int8 / float8_e4m3fn weights when the activations are bf16, the run's
// default on these hosts; fp32 activations keep the fp32 kernels of stream_q8_avx512.cpp).
//
// The weight bytes are widened to bf16 in registers, exactly: an int8 value (|q| <= 128) is a
// bf16 value (sign-extend, convert to fp32, `vcvtne2ps2bf16`); an e4m3 value divided by 2^8 is a
// normal bf16 value (its bits placed into an IEEE half, widened by `vcvtph2ps`, then
// `vcvtne2ps2bf16`; subnormals included, the 2^8 folded into the scale). The products run in
// `vdpbf16ps` (bf16 x bf16 exact in fp32, fp32 accumulation) and the scales are applied to fp32
// values, never to the bf16 weights:
//
//   q8n_dot_rows:  out[t, r] = sum_c x[t, c] * W[r, c]     (forward; x bf16 words)
//       one block per row (int8 per output channel, per-channel FP8): the row's dot product,
//       then times its scale; column blocks (FP8 128 x 128): one partial accumulator per block,
//       scaled into the row's total (fma) at the block's end. A panel of 4 rows is widened once
//       into an L1 scratch (4 x L bf16 words) and read by every token tile, tiles 4 rows x 6
//       tokens (one block per row) or 2 rows x 6 tokens (partials + totals).
//   q8n_axpy_rows: out[t, c] = sum_r coef[t, r] * W[r, c]  (input gradient; coef fp32)
//       one block per row: the row's scale is folded into its coefficient before the coefficient
//       is rounded to bf16 (bf16(coef * s), one rounding as the bf16 kernel's bf16(coef));
//       column blocks: rows are taken in groups inside one row block, so every 32-column step has
//       one scale: bf16(coef) products summed over the group into a zeroed fp32 partial, then
//       out += partial * scale. Rows in pairs interleaved in registers (`vpermt2w`), 4 pairs x up
//       to 16 tokens (the out rows are the accumulators, the coefficient pairs broadcast words).
//
// Each weight byte is read from memory once per token tile (dot: once per call) and the summation
// order depends on the shapes only (deterministic). Column tails use masked loads (zeros past the
// end); column blocks must be a multiple of 32 wide or cover the row (q8n_supported).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c,avx2,bmi2")
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "stream_tiles.h"

namespace {

using i64 = long long;
typedef signed char q8_t;
typedef unsigned short bf16_t;
constexpr i64 NW = 32;  // bf16 words per zmm register
constexpr float kE4m3Mul = 256.f;  // the e4m3 widening returns value / 2^8

static inline __mmask32 tail_mask(i64 n) { return static_cast<__mmask32>((1ull << n) - 1u); }

static inline __m512 e4m3_16(const q8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
  h = _mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0xBF80)));
  return _mm512_cvtph_ps(h);
}
static inline __m512 i8_16(const q8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
// 32 bytes -> 32 bf16 words (exact); the low half of the register = columns 0..15
template <bool FP8>
static inline __m512i widen32(const q8_t* p) {
  const __m512 a = FP8 ? e4m3_16(p) : i8_16(p);
  const __m512 b = FP8 ? e4m3_16(p + 16) : i8_16(p + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}
// the first n (< 32) bytes, zeros past them
template <bool FP8>
static inline __m512i widen_tail(const q8_t* p, i64 n) {
  alignas(64) q8_t buf[NW] = {};
  std::memcpy(buf, p, static_cast<std::size_t>(n));
  return widen32<FP8>(buf);
}

static inline float scale_mul(bool fp8) { return fp8 ? kE4m3Mul : 1.f; }

// ---- forward (dot) -----------------------------------------------------------------------------

// rows of q widened into ws (rows LP words apart, zero padded to LP); the bytes of the next panel
// (pf, same row stride) are prefetched meanwhile
template <bool FP8>
static void widen_panel(const q8_t* q, i64 ldq, i64 L, i64 rows, bf16_t* ws, i64 LP,
                        const q8_t* pf) {
  for (i64 r = 0; r < rows; ++r) {
    const q8_t* src = q + r * ldq;
    bf16_t* d = ws + r * LP;
    i64 c = 0;
    for (; c + NW <= L; c += NW) {
      if (pf && (c & 63) == 0) __builtin_prefetch(pf + r * ldq + c, 0, 2);
      _mm512_storeu_si512(d + c, widen32<FP8>(src + c));
    }
    if (c < L) _mm512_storeu_si512(d + c, widen_tail<FP8>(src + c, L - c));
    for (c = (L + NW - 1) / NW * NW; c < LP; c += NW) _mm512_storeu_si512(d + c, _mm512_setzero_si512());
  }
}

// RB rows (ws, LP apart) x NB tokens. MB: column blocks of BC, a partial per block scaled into the
// totals; else one block, scaled after the sum. sc(r, cb): row r's scale for column block cb.
template <int RB, int NB, bool MB, class SC>
static inline void dot_tile(const bf16_t* ws, i64 LP, i64 L, i64 BC, const bf16_t* x, i64 ldx,
                            float* out, i64 ldo, SC sc) {
  __m512 acc[RB][NB], tot[RB][NB];
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) tot[r][t] = _mm512_setzero_ps();
  auto step = [&](i64 c, __mmask32 m) __attribute__((always_inline)) {
    __m512bh wv[RB];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(ws + r * LP + c);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + t * ldx + c);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  };
  const i64 BCe = MB ? BC : L;
  for (i64 b0 = 0; b0 < L; b0 += BCe) {
    const i64 b1 = std::min(L, b0 + BCe);
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
      for (int t = 0; t < NB; ++t) acc[r][t] = _mm512_setzero_ps();
    i64 c = b0;
    for (; c + NW <= b1; c += NW) step(c, ~__mmask32(0));
    if (c < b1) step(c, tail_mask(b1 - c));
    if constexpr (MB) {
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        const __m512 sv = _mm512_set1_ps(sc(r, b0 / BC));
#pragma GCC unroll 16
        for (int t = 0; t < NB; ++t) tot[r][t] = _mm512_fmadd_ps(acc[r][t], sv, tot[r][t]);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
    const float s = MB ? 1.f : sc(r, 0);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t)
      out[t * ldo + r] = MB ? _mm512_reduce_add_ps(tot[r][t]) : _mm512_reduce_add_ps(acc[r][t]) * s;
  }
}

template <bool FP8, bool MB>
static void q8n_dot_rows(const q8_t* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s, i64 lds,
                         i64 BR, i64 BC, const bf16_t* x, i64 ldx, i64 n, float* out, i64 ldo) {
  constexpr int PR = 4, RB = MB ? 2 : 4, NBM = 6;
  const i64 LP = (L + NW - 1) / NW * NW;
  static thread_local std::vector<bf16_t> scratch;
  if (static_cast<i64>(scratch.size()) < PR * LP) scratch.resize(PR * LP);
  bf16_t* ws = scratch.data();
  const float mul = FP8 ? kE4m3Mul : 1.f;
  for (i64 p = 0; p < R; p += PR) {
    const i64 rows = std::min<i64>(PR, R - p);
    const q8_t* pf = p + 2 * PR <= R ? q + (p + PR) * ldq : nullptr;
    widen_panel<FP8>(q + p * ldq, ldq, L, rows, ws, LP, pf);
    token_tiles<NBM>(n, [&](i64, i64 t0, i64 m) {
      with_width<NBM>(m, [&](auto nb) {
        constexpr int NB = decltype(nb)::value;
        auto tile = [&](auto rb, i64 rr) {
          const i64 ra = r0 + p + rr;  // absolute row of the tile's first row
          dot_tile<decltype(rb)::value, NB, MB>(
              ws + rr * LP, LP, L, BC, x + t0 * ldx, ldx, out + t0 * ldo + p + rr, ldo,
              [&](int r, i64 cb) { return s[(ra + r) / BR * lds + cb] * mul; });
        };
        i64 rr = 0;
        for (; rr + RB <= rows; rr += RB) tile(IntC<RB>{}, rr);
        for (; rr < rows; ++rr) tile(IntC<1>{}, rr);
      });
    });
  }
}

// ---- input gradient (axpy) ----------------------------------------------------------------------

// PP row pairs (rows 2j, 2j+1 of q; ODD: the last pair's second row is zeros) x NB tokens over
// columns [c0, c1). cw[t * 4 + j]: the bf16 coefficient pair of token t, pair j. MB: one scale
// per 32-column step (sc(c)), applied to a zeroed partial; else accumulated straight into out.
template <bool FP8, int PP, int NB, bool ODD, bool MB, class SC>
static inline void axpy_tile(const q8_t* q, i64 ldq, i64 c0, i64 c1, const unsigned int* cw,
                             float* out, i64 ldo, bool first, const q8_t* pf, SC sc) {
  const __m512i idx_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(16));
  auto step = [&](i64 c, i64 cn) __attribute__((always_inline)) {
    __m512bh lo[PP], hi[PP];
#pragma GCC unroll 16
    for (int j = 0; j < PP; ++j) {
      const q8_t* a = q + 2 * j * ldq + c;
      const bool last_odd = ODD && j == PP - 1;
      const __m512i va = cn == NW ? widen32<FP8>(a) : widen_tail<FP8>(a, cn);
      const __m512i vb = last_odd      ? _mm512_setzero_si512()
                         : cn == NW    ? widen32<FP8>(a + ldq)
                                       : widen_tail<FP8>(a + ldq, cn);
      lo[j] = (__m512bh)_mm512_permutex2var_epi16(va, idx_lo, vb);
      hi[j] = (__m512bh)_mm512_permutex2var_epi16(va, idx_hi, vb);
    }
    const __mmask32 m = cn == NW ? ~__mmask32(0) : tail_mask(cn);
    const __mmask16 mlo = static_cast<__mmask16>(m & 0xffffu);
    const __mmask16 mhi = static_cast<__mmask16>(m >> 16);
    __m512 sv = _mm512_setzero_ps();
    if constexpr (MB) sv = _mm512_set1_ps(sc(c));
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      float* o = out + t * ldo + c;
      __m512 a0 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mlo, o);
      __m512 a1 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mhi, o + 16);
      __m512 p0 = MB ? _mm512_setzero_ps() : a0, p1 = MB ? _mm512_setzero_ps() : a1;
#pragma GCC unroll 16
      for (int j = 0; j < PP; ++j) {
        const __m512bh cf = (__m512bh)_mm512_set1_epi32(static_cast<int>(cw[t * 4 + j]));
        p0 = _mm512_dpbf16_ps(p0, lo[j], cf);
        p1 = _mm512_dpbf16_ps(p1, hi[j], cf);
      }
      if constexpr (MB) {
        p0 = _mm512_fmadd_ps(p0, sv, a0);
        p1 = _mm512_fmadd_ps(p1, sv, a1);
      }
      _mm512_mask_storeu_ps(o, mlo, p0);
      _mm512_mask_storeu_ps(o + 16, mhi, p1);
    }
  };
  i64 c = c0;
  for (; c + NW <= c1; c += NW) {
    if (pf)
#pragma GCC unroll 16
      for (int j = 0; j < 2 * PP; ++j) __builtin_prefetch(pf + j * ldq + c, 0, 2);
    step(c, NW);
  }
  if (c < c1) step(c, c1 - c);
}

static inline unsigned int bf16_bits(float f) {  // round to nearest even (finite inputs)
  unsigned int u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x00400000u) >> 16;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// Column chunks: with n >= 12 tokens the out rows of the chunk (n x 256 fp32) stay in L1 while
// every row group adds to them (as the bf16 kernel's AXPYN_COLS); fewer tokens: whole rows.
constexpr i64 AXPY_COLS = 256, AXPY_BLOCK_TOKENS = 12;

template <bool FP8, bool MB>
static void q8n_axpy_rows(const q8_t* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s, i64 lds,
                          i64 BR, i64 BC, const float* coef, i64 ldc, i64 n, float* out,
                          i64 ldo) {
  constexpr int P = 4, NBM = 16;
  const float mul = FP8 ? kE4m3Mul : 1.f;
  // row groups of up to 2P rows; with column blocks inside one row block (one scale a step)
  std::vector<i64> g0;
  for (i64 r = 0; r < R;) {
    i64 g = std::min<i64>(2 * P, R - r);
    if (MB) g = std::min<i64>(g, BR - (r0 + r) % BR);
    g0.push_back(r);
    r += g;
  }
  g0.push_back(R);
  const i64 G = static_cast<i64>(g0.size()) - 1;
  // the coefficient words of every group: cw[(k * n + t) * 4 + j]
  static thread_local std::vector<unsigned int> words;
  if (static_cast<i64>(words.size()) < G * n * 4) words.resize(G * n * 4);
  unsigned int* cw = words.data();
  for (i64 k = 0; k < G; ++k)
    for (i64 t = 0; t < n; ++t)
      for (int j = 0; j < P; ++j) {
        unsigned int pair = 0;
        for (int h = 0; h < 2; ++h) {
          const i64 r = g0[k] + 2 * j + h;
          if (r >= g0[k + 1]) continue;
          float v = coef[t * ldc + r];
          if (!MB) v *= s[(r0 + r) / BR * lds] * mul;
          pair |= bf16_bits(v) << (16 * h);
        }
        cw[(k * n + t) * 4 + j] = pair;
      }
  const i64 CW = n >= AXPY_BLOCK_TOKENS && L > AXPY_COLS ? AXPY_COLS : L;
  for (i64 c0 = 0; c0 < L; c0 += CW) {
    const i64 c1 = std::min(L, c0 + CW);
    for (i64 k = 0; k < G; ++k) {
      const i64 r = g0[k], g = g0[k + 1] - r;
      const q8_t* qr = q + r * ldq;
      const q8_t* pf = k + 2 < G ? q + g0[k + 2] * ldq : nullptr;
      const i64 rb = (r0 + r) / BR;
      auto sc = [&](i64 c) { return s[rb * lds + c / BC] * mul; };
      token_tiles<NBM>(n, [&](i64, i64 t0, i64 m) {
        with_width<NBM>(m, [&](auto nb) {
          constexpr int NB = decltype(nb)::value;
          auto run = [&](auto pp, auto odd) {
            axpy_tile<FP8, decltype(pp)::value, NB, decltype(odd)::value, MB>(
                qr, ldq, c0, c1, cw + (k * n + t0) * 4, out + t0 * ldo, ldo, k == 0,
                t0 == 0 ? pf : nullptr, sc);
          };
          switch (g) {
            case 1: run(IntC<1>{}, std::true_type{}); break;
            case 2: run(IntC<1>{}, std::false_type{}); break;
            case 3: run(IntC<2>{}, std::true_type{}); break;
            case 4: run(IntC<2>{}, std::false_type{}); break;
            case 5: run(IntC<3>{}, std::true_type{}); break;
            case 6: run(IntC<3>{}, std::false_type{}); break;
            case 7: run(IntC<4>{}, std::true_type{}); break;
            default: run(IntC<4>{}, std::false_type{}); break;
          }
        });
      });
    }
  }
}

}  // namespace

namespace npu_lora_stream {
// whether the bf16-operand kernels take this block layout: column blocks a multiple of 32 wide,
// or one block per row
bool avx512bf16_q8n_supported(i64 L, i64 BC) { return BC >= L || BC % NW == 0; }

void avx512bf16_q8_dotn(const signed char* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s,
                        i64 lds, i64 BR, i64 BC, bool fp8, const unsigned short* x, i64 ldx,
                        i64 n, float* out, i64 ldo) {
  const bool mb = BC < L;
  if (fp8 && mb) q8n_dot_rows<true, true>(q, ldq, L, r0, R, s, lds, BR, BC, x, ldx, n, out, ldo);
  else if (fp8) q8n_dot_rows<true, false>(q, ldq, L, r0, R, s, lds, BR, BC, x, ldx, n, out, ldo);
  else if (mb) q8n_dot_rows<false, true>(q, ldq, L, r0, R, s, lds, BR, BC, x, ldx, n, out, ldo);
  else q8n_dot_rows<false, false>(q, ldq, L, r0, R, s, lds, BR, BC, x, ldx, n, out, ldo);
}

void avx512bf16_q8_axpyn(const signed char* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s,
                         i64 lds, i64 BR, i64 BC, bool fp8, const float* c, i64 ldc, i64 n,
                         float* out, i64 ldo) {
  const bool mb = BC < L;
  if (fp8 && mb) q8n_axpy_rows<true, true>(q, ldq, L, r0, R, s, lds, BR, BC, c, ldc, n, out, ldo);
  else if (fp8) q8n_axpy_rows<true, false>(q, ldq, L, r0, R, s, lds, BR, BC, c, ldc, n, out, ldo);
  else if (mb) q8n_axpy_rows<false, true>(q, ldq, L, r0, R, s, lds, BR, BC, c, ldc, n, out, ldo);
  else q8n_axpy_rows<false, false>(q, ldq, L, r0, R, s, lds, BR, BC, c, ldc, n, out, ldo);
}
}  // namespace npu_lora_stream
