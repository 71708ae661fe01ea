// 8-bit expert weights, AVX-512 + AVX512-BF16 instance with bf16 operands (what the avx512bf16
// and amx paths run for int8 / float8_e4m3fn weights when the activations are bf16, the run's
// default on these hosts; fp32 activations keep the fp32 kernels of stream_q8_avx512.cpp).
//
// The weight bytes are widened to bf16 in registers, exactly: an int8 value (|q| <= 128) is a
// bf16 value (sign-extend, convert to fp32, `vcvtne2ps2bf16`); an e4m3 value divided by 2^8 is a
// normal bf16 value (two 128-entry VBMI byte tables, `vpermi2b`, give its low and high bytes from
// the 7-bit magnitude, the sign is or'ed in, `vpermt2b` interleaves the bytes into words: 4
// instructions for 32 weights; subnormals included, NaN stays NaN, the 2^8 folded into the
// scale). The products run in `vdpbf16ps` (bf16 x bf16 exact in fp32, fp32 accumulation) and the
// scales are applied to fp32 values, never to the bf16 weights:
//
//   q8n_dot_rows:  out[t, r] = sum_c x[t, c] * W[r, c]     (forward; x bf16 words)
//       one block per row (int8 per output channel, per-channel FP8): the row's dot product,
//       then times its scale; column blocks (FP8 128 x 128): one partial accumulator per block,
//       scaled into the row's total (fma) at the block's end. Panels of 4 rows (2 with column
//       blocks): the first token tile widens the panel's bytes in registers, between its
//       `vdpbf16ps` (the conversions run beside the products instead of in a pass of their own),
//       and stores them into an L1 scratch that the panel's other token tiles read; tiles 4 rows
//       x up to 4 tokens (2 x 4 with partials + totals). The accumulators of a tile are summed
//       by a transposing shuffle tree (16 at a time) rather than one reduction each.
//   q8n_axpy_rows: out[t, c] = sum_r coef[t, r] * W[r, c]  (input gradient; coef fp32)
//       one block per row: the row's scale is folded into its coefficient before the coefficient
//       is rounded to bf16 (bf16(coef * s), one rounding as the bf16 kernel's bf16(coef));
//       column blocks: rows are taken in groups inside one row block, so every 32-column step has
//       one scale: bf16(coef) products summed over the group into a zeroed fp32 partial, then
//       out += partial * scale. Rows in pairs interleaved in registers (`vpermt2w`), 8 pairs x up
//       to 16 tokens (the out rows are the accumulators, the coefficient pairs broadcast words);
//       one block per row: the accumulator chains of AXPY_TG tokens interleaved pair by pair.
//
// Each weight byte is read from memory once per call (axpy: once per token tile of up to 16) and
// the summation order depends on the shapes only (deterministic). Column tails use masked loads (zeros past the end); column blocks
// must be a multiple of 32 wide or cover the row (q8n_supported). Needs AVX512-VBMI besides
// AVX512-BF16 (stream_q8.cpp checks it: Cooper Lake has BF16 without VBMI).
// Measured: experiments/2026-12-05-q8-fast.md.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,fma,f16c,avx2,bmi2")
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

static inline __m512 i8_16(const q8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
// e4m3 magnitude (7 bits) -> the bf16 bits of its value / 2^8, low and high bytes (NaN: 0x7fc0)
struct E4m3Lut {
  alignas(64) unsigned char lo[128];
  alignas(64) unsigned char hi[128];
  alignas(64) unsigned char ilv[64];  // (lo[k], hi[k]) byte pairs, k < 32: vpermt2b indices
  constexpr E4m3Lut() : lo(), hi(), ilv() {
    for (int m = 0; m < 128; ++m) {
      const int e = m >> 3, f = m & 7;
      int bits = 0;
      if (m == 0x7f) bits = 0x7fc0;
      else if (e > 0) bits = ((e + 112) << 7) | (f << 4);
      else if (f > 0) {
        const int p = f >= 4 ? 2 : f >= 2 ? 1 : 0;
        bits = ((110 + p) << 7) | ((f << (7 - p)) & 0x7f);
      }
      lo[m] = static_cast<unsigned char>(bits & 0xff);
      hi[m] = static_cast<unsigned char>(bits >> 8);
    }
    for (int k = 0; k < 32; ++k) {
      ilv[2 * k] = static_cast<unsigned char>(k);
      ilv[2 * k + 1] = static_cast<unsigned char>(64 + k);
    }
  }
};
constexpr E4m3Lut kE4m3Lut{};

// 32 e4m3 bytes (in the low half of b) -> 32 bf16 words: two 128-entry byte tables (`vpermi2b`
// ignores the index's bit 7, the sign), the sign or'ed into the high byte, bytes interleaved
// into words (`vpermt2b`): 4 instructions
static inline __m512i e4m3_lut32(__m512i b) {
  const __m512i* t = reinterpret_cast<const __m512i*>(&kE4m3Lut);
  const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(t), b, _mm512_load_si512(t + 1));
  __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(t + 2), b, _mm512_load_si512(t + 3));
  hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // hi | (b & 0x80)
  return _mm512_permutex2var_epi8(lo, _mm512_load_si512(t + 4), hi);
}

// 32 bytes -> 32 bf16 words (exact); the low half of the register = columns 0..15. int8:
// sign-extend, convert to fp32, `vcvtne2ps2bf16` (the table route needs |q| <= 127 and a sign
// fix-up; selecting the fp32 high words with `vpermt2w` instead measured the same)
template <bool FP8>
static inline __m512i widen32(const q8_t* p) {
  if constexpr (FP8) {
    return e4m3_lut32(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  } else {
    return (__m512i)_mm512_cvtne2ps_pbh(i8_16(p + 16), i8_16(p));
  }
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

// the first n (<= 32) bytes at p widened (masked loads: zeros past them)
template <bool FP8>
static inline __m512i widen_m(const q8_t* p, i64 n) {
  const __mmask16 m0 = static_cast<__mmask16>(n >= 16 ? 0xffffu : (1u << n) - 1u);
  const __mmask16 m1 = static_cast<__mmask16>(n >= 32 ? 0xffffu : n <= 16 ? 0u : (1u << (n - 16)) - 1u);
  alignas(64) q8_t buf[NW];
  _mm_store_si128(reinterpret_cast<__m128i*>(buf), _mm_maskz_loadu_epi8(m0, p));
  _mm_store_si128(reinterpret_cast<__m128i*>(buf + 16), _mm_maskz_loadu_epi8(m1, p + 16));
  return widen32<FP8>(buf);
}

// res[i] = the sum of v[i]'s lanes, i < N (16 at a time): a transposing tree (45 shuffles/adds for 16
// vectors against 16 x 8 for one reduction each); the order depends on N only
template <int N>
static inline void lane_sums(const __m512* v, float* res) {
  if constexpr (N > 16) {
    lane_sums<16>(v, res);
    lane_sums<N - 16>(v + 16, res + 16);
  } else if constexpr (N < 6) {
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) res[i] = _mm512_reduce_add_ps(v[i]);
  } else {
    __m512 a[16], t[8], u[4], w[2];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) a[i] = i < N ? v[i] : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)
      t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
      u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
      w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88),
                                   _mm512_shuffle_ps(w[0], w[1], 0xDD));
    alignas(64) float tmp[16];
    _mm512_store_ps(tmp, r);  // lane 4k + m: the sum of v[4m + k]
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i) res[i] = tmp[4 * (i % 4) + i / 4];
  }
}

// RB rows x NB tokens over the whole row. WIDEN: the rows' bytes (q, ldq) are widened here, in
// registers, interleaved with the products, and stored into ws (rows LP apart) for the token
// tiles after this one; else the widened rows are read from ws. MB: column blocks of BC, a
// partial per block scaled into the totals; else one block, scaled after the sum. sc(r, cb):
// row r's scale for column block cb. pf: bytes to prefetch (same row stride), a line every other
// step.
// (an out-of-line function with everything inside it inlined: left to the inliner's budget, the
// int8 tiles were once inlined into the token loop and ran 1.5x slower)
template <bool FP8, int RB, int NB, bool MB, bool WIDEN, class SC>
__attribute__((noinline, flatten)) static void dot_tile(const q8_t* q, i64 ldq, bf16_t* ws, i64 LP, i64 L, i64 BC,
                            const bf16_t* x, i64 ldx, float* out, i64 ldo, const q8_t* pf,
                            SC sc) {
  __m512 acc[RB * NB], tot[MB ? RB * NB : 1];
  if constexpr (MB) {
#pragma GCC unroll 16
    for (int i = 0; i < RB * NB; ++i) tot[i] = _mm512_setzero_ps();
  }
  auto step = [&](i64 c, i64 cn) __attribute__((always_inline)) {
    const __mmask32 m = cn == NW ? ~__mmask32(0) : tail_mask(cn);
    __m512bh wv[RB];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) {
      if constexpr (WIDEN) {
        const __m512i v = cn == NW ? widen32<FP8>(q + r * ldq + c) : widen_m<FP8>(q + r * ldq + c, cn);
        _mm512_storeu_si512(ws + r * LP + c, v);
        wv[r] = (__m512bh)v;
      } else {
        wv[r] = (__m512bh)_mm512_loadu_si512(ws + r * LP + c);
      }
    }
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + t * ldx + c);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) acc[r * NB + t] = _mm512_dpbf16_ps(acc[r * NB + t], wv[r], xv);
    }
  };
  const i64 BCe = MB ? BC : L;
  for (i64 b0 = 0; b0 < L; b0 += BCe) {
    const i64 b1 = std::min(L, b0 + BCe);
#pragma GCC unroll 16
    for (int i = 0; i < RB * NB; ++i) acc[i] = _mm512_setzero_ps();
    i64 c = b0;
    for (; c + NW <= b1; c += NW) {
      if (WIDEN && pf && (c & 63) == 0)
#pragma GCC unroll 16
        for (int r = 0; r < RB; ++r) __builtin_prefetch(pf + r * ldq + c, 0, 2);
      step(c, NW);
    }
    if (c < b1) step(c, b1 - c);
    if constexpr (MB) {
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) {
        const __m512 sv = _mm512_set1_ps(sc(r, b0 / BC));
#pragma GCC unroll 16
        for (int t = 0; t < NB; ++t) tot[r * NB + t] = _mm512_fmadd_ps(acc[r * NB + t], sv, tot[r * NB + t]);
      }
    }
  }
  float res[RB * NB];
  lane_sums<RB * NB>(MB ? tot : acc, res);
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r) {
    const float s = MB ? 1.f : sc(r, 0);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) out[t * ldo + r] = MB ? res[r * NB + t] : res[r * NB + t] * s;
  }
}

// Tiles (rows x tokens), measured with experiments/q8/q8n_micro.cpp (128 experts x 8 tokens,
// Qwen3 widths, 2 threads, load 2-4, forward ms): one block per row 4 x 6 (token tiles of 4 at 8
// tokens) 35-37, 2 x 8 47-80 (8 tokens' x rows, 32 KiB, leave L1), 3 x 8 68-71; column blocks
// (partials + totals) 2 x 4 47-50, 4 x 4 49-50, 4 x 6 50, 2 x 6 55-57, 1 x 8 73. With more
// tokens an expert, tiles of up to 4 tokens keep a tile's x rows and the scratch in L1 (int8
// forward, 12 tokens: 32 ms against 66 with up to 6; 16 tokens: 31 against 47).
constexpr int DOT_RB = 4, DOT_NB = 4, DOT_RB_MB = 2, DOT_NB_MB = 4;

// Panels of RB rows: the first token tile widens the panel (in registers, interleaved with its
// products: the conversions run beside the `vdpbf16ps`) and leaves it in an L1 scratch that the
// other token tiles of the call read; the next panel's bytes are prefetched meanwhile.
template <bool FP8, bool MB>
static void q8n_dot_rows(const q8_t* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s, i64 lds,
                         i64 BR, i64 BC, const bf16_t* x, i64 ldx, i64 n, float* out, i64 ldo) {
  constexpr int RB = MB ? DOT_RB_MB : DOT_RB, NBM = MB ? DOT_NB_MB : DOT_NB;
  const i64 LP = (L + NW - 1) / NW * NW;
  static thread_local std::vector<bf16_t> scratch;
  if (static_cast<i64>(scratch.size()) < RB * LP) scratch.resize(RB * LP);
  bf16_t* ws = scratch.data();
  const float mul = FP8 ? kE4m3Mul : 1.f;
  auto panel = [&](auto rb, i64 p, const q8_t* pf) {
    constexpr int PRB = decltype(rb)::value;
    const i64 ra = r0 + p;  // absolute row of the panel's first row
    auto sc = [&](int r, i64 cb) { return s[(ra + r) / BR * lds + cb] * mul; };
    token_tiles<NBM>(n, [&](i64 k, i64 t0, i64 m) {
      with_width<NBM>(m, [&](auto nb) {
        constexpr int NB = decltype(nb)::value;
        if (k == 0)
          dot_tile<FP8, PRB, NB, MB, true>(q + p * ldq, ldq, ws, LP, L, BC, x + t0 * ldx, ldx,
                                           out + t0 * ldo + p, ldo, pf, sc);
        else
          dot_tile<FP8, PRB, NB, MB, false>(q + p * ldq, ldq, ws, LP, L, BC, x + t0 * ldx, ldx,
                                            out + t0 * ldo + p, ldo, nullptr, sc);
      });
    });
  };
  i64 p = 0;
  for (; p + RB <= R; p += RB) panel(IntC<RB>{}, p, p + 2 * RB <= R ? q + (p + RB) * ldq : nullptr);
  for (; p < R; ++p) panel(IntC<1>{}, p, nullptr);
}

// ---- input gradient (axpy) ----------------------------------------------------------------------

// tokens whose accumulator chains an axpy step interleaves (one scale a row)
constexpr int AXPY_TG = 4;

// PP row pairs (rows 2j, 2j+1 of q; ODD: the last pair's second row is zeros) x NB tokens over
// columns [c0, c1). cw[t * CP + j]: the bf16 coefficient pair of token t, pair j. MB: one scale
// per 32-column step (sc(c)), applied to a zeroed partial; else accumulated straight into out.
template <bool FP8, int PP, int CP, int NB, bool ODD, bool MB, class SC>
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
    // tokens in groups of TG, each group's 2 x TG accumulator chains interleaved pair by pair
    // (one scale a row: TG = 4, the gate/up input gradient at 8 tokens 0.82x the time of one
    // token's chains after another; column blocks keep TG = 1, interleaving measured slower
    // there). Each accumulator still sums its pairs in order: the results are the same bits.
    constexpr int TG = MB ? 1 : (AXPY_TG < NB ? AXPY_TG : NB);
#pragma GCC unroll 16
    for (int t0 = 0; t0 < NB; t0 += TG) {
      __m512 a0[TG], a1[TG], p0[TG], p1[TG];
#pragma GCC unroll 16
      for (int u = 0; u < TG; ++u) {
        if (t0 + u >= NB) continue;
        float* o = out + (t0 + u) * ldo + c;
        a0[u] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mlo, o);
        a1[u] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mhi, o + 16);
        p0[u] = MB ? _mm512_setzero_ps() : a0[u];
        p1[u] = MB ? _mm512_setzero_ps() : a1[u];
      }
#pragma GCC unroll 16
      for (int j = 0; j < PP; ++j) {
#pragma GCC unroll 16
        for (int u = 0; u < TG; ++u) {
          if (t0 + u >= NB) continue;
          const __m512bh cf = (__m512bh)_mm512_set1_epi32(static_cast<int>(cw[(t0 + u) * CP + j]));
          p0[u] = _mm512_dpbf16_ps(p0[u], lo[j], cf);
          p1[u] = _mm512_dpbf16_ps(p1[u], hi[j], cf);
        }
      }
#pragma GCC unroll 16
      for (int u = 0; u < TG; ++u) {
        if (t0 + u >= NB) continue;
        float* o = out + (t0 + u) * ldo + c;
        if constexpr (MB) {
          p0[u] = _mm512_fmadd_ps(p0[u], sv, a0[u]);
          p1[u] = _mm512_fmadd_ps(p1[u], sv, a1[u]);
        }
        _mm512_mask_storeu_ps(o, mlo, p0[u]);
        _mm512_mask_storeu_ps(o + 16, mhi, p1[u]);
      }
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
// Row groups of 2 x AXPY_P rows: 8 pairs a tile measured 44-50 ms against 47-52 (6 pairs) and
// 53-59 (4 pairs) for the backward (q8n_micro, 128 experts x 8 tokens): each out element is
// loaded and stored once per 16 rows instead of 8.
constexpr int AXPY_P = 8, AXPY_NB = 16;

template <bool FP8, bool MB>
static void q8n_axpy_rows(const q8_t* q, i64 ldq, i64 L, i64 r0, i64 R, const float* s, i64 lds,
                          i64 BR, i64 BC, const float* coef, i64 ldc, i64 n, float* out,
                          i64 ldo) {
  constexpr int P = AXPY_P, NBM = AXPY_NB;
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
  // the coefficient words of every group: cw[(k * n + t) * P + j]
  static thread_local std::vector<unsigned int> words;
  if (static_cast<i64>(words.size()) < G * n * P) words.resize(G * n * P);
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
        cw[(k * n + t) * P + j] = pair;
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
            axpy_tile<FP8, decltype(pp)::value, P, NB, decltype(odd)::value, MB>(
                qr, ldq, c0, c1, cw + (k * n + t0) * P, out + t0 * ldo, ldo, k == 0,
                t0 == 0 ? pf : nullptr, sc);
          };
          with_width<P>((g + 1) / 2, [&](auto pp) {
            if (g % 2) run(pp, std::true_type{});
            else run(pp, std::false_type{});
          });
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
