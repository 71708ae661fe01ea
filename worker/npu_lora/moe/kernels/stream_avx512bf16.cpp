// AVX-512 + AVX512-BF16 instance (e.g. AMD Zen 4, Intel Sapphire Rapids and later): native bf16
// dot products (`vdpbf16ps`: per fp32 lane, acc += a[2i] * b[2i] + a[2i+1] * b[2i+1], the bf16
// products exact in fp32, fp32 accumulation, denormals flushed). fp32 weights run the AVX-512
// kernels themselves (stream_core.h: ops_for), so fp32 results are bitwise that instance's.
//
// Native kernels (bf16 weights AND bf16 operands; the drivers in stream_core.h hand them the
// gathered activations and gradients rounded to bf16):
//
//   dotn_rows:   out[t, r] = sum_c x[t, c] * w[r, c]       32 bf16 columns per instruction,
//                tile 4 rows x 6 tokens (24 accumulators + 4 weights + 1 x register)
//   axpyn_rows:  out[t, c] = sum_r coef[t, r] * w[r, c]    rows taken in pairs: two weight rows
//                are interleaved in registers (`vpermt2w`) into (w[r, c], w[r+1, c]) pairs and
//                the coefficient pair (coef[t, r], coef[t, r+1]) is one broadcast 32-bit word;
//                tile 4 pairs x up to 8 tokens (8 interleaved weights, 2 accumulators, 2
//                permutation indices; the 32 coefficient words are broadcast operands). Measured
//                on a 2-core Zen 4 (experiments/2026-12-02-zen4-native-bf16.md): 4 x 8 against
//                4 x 4, 2 x 6 and 8 x 2 (spills), the dx pass at T=512 144 vs 164, 197, 418 ms.
//
// Column tails (L not a multiple of 32) use masked loads/stores (zeros past the end), an odd last
// row is paired with zeros. The summation order depends on the shapes only.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx2,bmi2")
#include <immintrin.h>

#include <algorithm>

#include "stream_avx512_v.h"
// only the tile loops (token_tiles, with_width, row_token_tiles); fp32 and widened-bf16 weights
// on this ISA run the avx512_* kernels of stream_avx512.cpp (stream_core.h: ops_for)
#include "stream_isa.h"
#include "stream_silu512.h"  // act_row, dh_row: the elementwise parts, vectorised

namespace npu_lora_stream {
long long blocked_tokens();  // stream_base.cpp: rows an expert from which axpyn_blocked runs
}

namespace {

constexpr i64 NW = 32;
template <bool B>
struct BoolC {
  static constexpr bool value = B;
};  // bf16 words per zmm register

static inline __m512bh ld16(const bf16_t* p, __mmask32 m) {
  return (__m512bh)_mm512_maskz_loadu_epi16(m, reinterpret_cast<const void*>(p));
}
static inline __mmask32 tail_mask(i64 n) {  // n in [1, 31]
  return static_cast<__mmask32>((1u << n) - 1u);
}

// ---- native dot ---------------------------------------------------------------------------------
template <int RB, int NB>
static inline void dotn_tile(const bf16_t* w, i64 ldw, i64 L, const bf16_t* x, i64 ldx,
                             float* out, i64 ldo, const bf16_t* pf) {
  __m512 acc[RB][NB];
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) acc[r][t] = _mm512_setzero_ps();
  // m: the columns of this step (all 32, or the tail); masked-off words load as zeros
  auto step = [&](i64 c, __mmask32 m) __attribute__((always_inline)) {
    __m512bh wv[RB];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) wv[r] = ld16(w + r * ldw + c, m);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      const __m512bh xv = ld16(x + t * ldx + c, m);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv[r], xv);
    }
  };
  i64 c = 0;
  for (; c + NW <= L; c += NW) {
    if (pf)  // one 64-byte line per row per step
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) __builtin_prefetch(pf + r * ldw + c, 0, 2);
    step(c, ~__mmask32(0));
  }
  if (c < L) step(c, tail_mask(L - c));
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]);
}

// native dot tile: 4 rows x 6 tokens (24 accumulators + 4 weights + 1 x). Measured (Zen 4, T=128,
// gate/up pass, two alternations): 4 x 6 36-38 ms, 3 x 8 36-39, 2 x 8 42, 4 x 4 44-47.
constexpr int DOTN_RB = 4, DOTN_NB = 6;
static void dotn_rows(const bf16_t* w, i64 ldw, i64 L, i64 R, const bf16_t* x, i64 ldx, i64 n,
                      float* out, i64 ldo) {
  // the prefetch of the rows ahead by the first token tile only (pc0 == 0), whole rows: spreading
  // it over the token tiles as the fp32 tiles do was even at T=512 and 0-5 % slower at T=128 here
  // (Xeon with AMX, experiments/2026-12-02-stream-head.md); it is the default path on Zen 4,
  // where it was tuned
  row_token_tiles<DOTN_RB, DOTN_NB>(w, ldw, L, R, n, [&](auto rb, auto nb, i64 r0, i64 t0,
                                                             const bf16_t* pf, i64 pc0, i64) {
    dotn_tile<decltype(rb)::value, decltype(nb)::value>(w + r0 * ldw, ldw, L, x + t0 * ldx, ldx,
                                                        out + t0 * ldo + r0, ldo,
                                                        pc0 == 0 ? pf : nullptr);
  });
}

// ---- native axpy ----------------------------------------------------------------------------------
// P row pairs x NB tokens; ODD: the last pair has no second row (zeros, coefficient 0).
template <int P, int NB, bool ODD>
static inline void axpyn_tile(const bf16_t* w, i64 ldw, i64 L, const bf16_t* coef, i64 ldc,
                              float* out, i64 ldo, bool first, const bf16_t* pf) {
  // (a[0], b[0], a[1], b[1], ...): columns 0-15 of the pair, then columns 16-31
  const __m512i idx_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(16));
  __m512bh cf[NB][P];
#pragma GCC unroll 16
  for (int t = 0; t < NB; ++t)
#pragma GCC unroll 16
    for (int j = 0; j < P; ++j) {
      unsigned int pair;
      if (ODD && j == P - 1) pair = coef[t * ldc + 2 * j];  // (coef[r], 0)
      else __builtin_memcpy(&pair, coef + t * ldc + 2 * j, 4);
      cf[t][j] = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
    }
  auto step = [&](i64 c, __mmask32 m) __attribute__((always_inline)) {
    __m512bh lo[P], hi[P];
#pragma GCC unroll 16
    for (int j = 0; j < P; ++j) {
      const bf16_t* a = w + 2 * j * ldw + c;
      const __m512i va = (__m512i)ld16(a, m);
      const __m512i vb = (ODD && j == P - 1) ? _mm512_setzero_si512() : (__m512i)ld16(a + ldw, m);
      lo[j] = (__m512bh)_mm512_permutex2var_epi16(va, idx_lo, vb);
      hi[j] = (__m512bh)_mm512_permutex2var_epi16(va, idx_hi, vb);
    }
    const __mmask16 mlo = static_cast<__mmask16>(m & 0xffffu);
    const __mmask16 mhi = static_cast<__mmask16>(m >> 16);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      float* o = out + t * ldo + c;
      __m512 a0 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mlo, o);
      __m512 a1 = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mhi, o + 16);
#pragma GCC unroll 16
      for (int j = 0; j < P; ++j) {
        a0 = _mm512_dpbf16_ps(a0, lo[j], cf[t][j]);
        a1 = _mm512_dpbf16_ps(a1, hi[j], cf[t][j]);
      }
      _mm512_mask_storeu_ps(o, mlo, a0);
      _mm512_mask_storeu_ps(o + 16, mhi, a1);
    }
  };
  i64 c = 0;
  for (; c + NW <= L; c += NW) {
    if (pf)
#pragma GCC unroll 16
      for (int j = 0; j < 2 * P; ++j) __builtin_prefetch(pf + j * ldw + c, 0, 2);
    step(c, ~__mmask32(0));
  }
  if (c < L) step(c, tail_mask(L - c));
}

static void axpyn_block(const bf16_t* w, i64 ldw, i64 L, i64 R, const bf16_t* coef, i64 ldc,
                        i64 n, float* out, i64 ldo) {
  constexpr int P = 4, NBM = 8;
  const i64 PD = V::PF_TILES * 2 * P;
  auto rows = [&](auto p, auto odd, i64 r0, const bf16_t* pf) {
    token_tiles<NBM>(n, [&](i64 k, i64 t0, i64 m) {
      with_width<NBM>(m, [&](auto nb) {
        axpyn_tile<decltype(p)::value, decltype(nb)::value, decltype(odd)::value>(
            w + r0 * ldw, ldw, L, coef + t0 * ldc + r0, ldc, out + t0 * ldo, ldo, r0 == 0,
            k == 0 ? pf : nullptr);
      });
    });
  };
  i64 r = 0;
  for (; r + 2 * P <= R; r += 2 * P)
    rows(IntC<P>{}, BoolC<false>{}, r, r + PD < R ? w + (r + PD) * ldw : nullptr);
  for (; r + 2 <= R; r += 2) rows(IntC<1>{}, BoolC<false>{}, r, nullptr);
  if (r < R) rows(IntC<1>{}, BoolC<true>{}, r, nullptr);
}

// Column blocks: with n >= AXPYN_BLOCK_TOKENS tokens the out rows of a token tile (8 x L fp32:
// 64 KiB at L = 2048) no longer stay in L1 between row tiles; in blocks of AXPYN_COLS columns
// they do (8 KiB). Each out element still adds the rows in row order, one pair per `vdpbf16ps`,
// so the results are bitwise the unblocked ones. Measured (2-core Zen 5, stand-alone core bench,
// Qwen3 widths, bf16, 5 alternating rounds against the unblocked code; experiments/
// 2026-12-04-union-floor.md §3): backward at T=256 (~16 tokens an expert) 0.91x (0.86-0.99 per
// round), T=512 0.98x, T=128 1.00x (below the threshold); blocking every expert was 0-9 % slower
// at T=128 in a first trial, hence the threshold.
constexpr i64 AXPYN_COLS = 256, AXPYN_BLOCK_TOKENS = 12;

// ---- blocked native axpy (many rows an expert: compute-bound) -----------------------------------
// From npu_lora_stream::blocked_tokens() rows an expert (stream_base.cpp; default 10) the weights
// are packed, panel by panel, into an L1 buffer: KC row pairs x NC columns as interleaved pair
// words (w[2k, c], w[2k+1, c]) (the permutation the streaming tile repeats for every token tile is
// done once), and the out tile of MR tokens x NC columns stays in registers (20 accumulators) for
// the KC pairs of the panel, the coefficient pair of each token a broadcast 32-bit word: per pair
// 4 panel loads from L1, 5 broadcasts, 20 `vdpbf16ps`. The panel is reused by every token tile of
// the call; while its tiles run, each tile prefetches its share of the next panel's rows into L2
// (panels in the order column block, then row pairs), so the packing reads L2, not DRAM. Each out
// element still adds the pairs in row order, one `vdpbf16ps` each (accumulators go through `out`
// between panels, exact in fp32), so the results are bitwise those of the streaming kernel above.
// Columns past the last whole panel run the streaming kernel.
// Measured (2-core Zen 4, Qwen3 widths, CPU time of the two passes, paired in one process;
// experiments/2026-12-05-bwd-tune.md): without the prefetch the passes ran at 158-166 GFLOP/s a
// core at 64 rows an expert (T=1,024) and 185-190 at 128, with it 190-196 and 201-206 (0.83-0.88x
// and 0.91-0.94x the time); packing nothing (timing only) 213-216, a `vdpbf16ps` loop alone 234.
// Prefetch into L1 (t0) was 0.88x, into L2 (t1, t2) 0.83-0.87x; MR 5 x 4 was 0.98x the time of
// 6 x 4 (24 accumulators); panels of 32 or 128 pairs were 0.99-1.04x, packing the next panel
// into a second buffer a tile's share at a time (the L1 then holds two panels) 1.03-1.09x. The
// same panel scheme for the fp32 tiles (AVX-512 FMA) was 1.03-1.08x slower at T=1,024 (experiments/
// 2026-12-05-long-kernel.md) and is not used.
constexpr int AXB_MR = 5, AXB_NV = 4;
constexpr i64 AXB_NC = 16 * AXB_NV, AXB_KC = 64;  // panel: 64 pairs x 64 columns = 16 KiB

// panel[k * NC + c] = (w[2k, c], w[2k + 1, c]) for k < kp, c < NC; rows >= `rows` are zeros
static inline void pack_pairs(const bf16_t* w, i64 ldw, i64 rows, i64 kp, unsigned* panel) {
  const __m512i idx_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(16));
  for (i64 k = 0; k < kp; ++k) {
    const bf16_t* a = w + 2 * k * ldw;
    const bool hasb = 2 * k + 1 < rows;
#pragma GCC unroll 2
    for (i64 c = 0; c < AXB_NC; c += 32) {
      const __m512i va = _mm512_loadu_si512(a + c);
      const __m512i vb = hasb ? _mm512_loadu_si512(a + ldw + c) : _mm512_setzero_si512();
      _mm512_store_si512(panel + k * AXB_NC + c, _mm512_permutex2var_epi16(va, idx_lo, vb));
      _mm512_store_si512(panel + k * AXB_NC + c + 16, _mm512_permutex2var_epi16(va, idx_hi, vb));
    }
  }
}

// out[t, 0:NC] (+)= sum_k coef-pair[t, k] . panel[k] for t < MR; `odd`: the last pair has no
// second row (its coefficient word is (coef[2k], 0))
template <int MR>
static inline void axb_tile(const unsigned* panel, i64 kp, const bf16_t* coef, i64 ldc, bool odd,
                            float* out, i64 ldo, bool first, const bf16_t* pf, i64 ldw, i64 npf) {
  __m512 acc[MR][AXB_NV];
#pragma GCC unroll 8
  for (int t = 0; t < MR; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < AXB_NV; ++v)
      acc[t][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + t * ldo + 16 * v);
  // row pair k of the next panel (2 x 128 bytes), into L2
  auto prefetch_pair = [&](i64 k) __attribute__((always_inline)) {
    const bf16_t* q = pf + 2 * k * ldw;
    __builtin_prefetch(q, 0, 2);
    __builtin_prefetch(q + 32, 0, 2);
    __builtin_prefetch(q + ldw, 0, 2);
    __builtin_prefetch(q + ldw + 32, 0, 2);
  };
  auto step = [&](i64 k, bool half) __attribute__((always_inline)) {
    if (k < npf) prefetch_pair(k);
    __m512bh b[AXB_NV];
#pragma GCC unroll 4
    for (int v = 0; v < AXB_NV; ++v)
      b[v] = (__m512bh)_mm512_load_si512(panel + k * AXB_NC + 16 * v);
#pragma GCC unroll 8
    for (int t = 0; t < MR; ++t) {
      unsigned pair;
      if (half) pair = coef[t * ldc + 2 * k];
      else __builtin_memcpy(&pair, coef + t * ldc + 2 * k, 4);
      const __m512bh cb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 4
      for (int v = 0; v < AXB_NV; ++v) acc[t][v] = _mm512_dpbf16_ps(acc[t][v], b[v], cb);
    }
  };
  const i64 kf = odd ? kp - 1 : kp;
  for (i64 k = 0; k < kf; ++k) step(k, false);
  if (odd) step(kf, true);
  for (i64 k = kp; k < npf; ++k) prefetch_pair(k);  // rows left over (a short panel)
#pragma GCC unroll 8
  for (int t = 0; t < MR; ++t)
#pragma GCC unroll 4
    for (int v = 0; v < AXB_NV; ++v) _mm512_storeu_ps(out + t * ldo + 16 * v, acc[t][v]);
}

static void axpyn_blocked(const bf16_t* w, i64 ldw, i64 L, i64 R, const bf16_t* coef, i64 ldc,
                          i64 n, float* out, i64 ldo) {
  alignas(64) unsigned panel[AXB_KC * AXB_NC];
  const i64 RP = (R + 1) / 2, whole = L / AXB_NC * AXB_NC;
  for (i64 c0 = 0; c0 < whole; c0 += AXB_NC)
    for (i64 k0 = 0; k0 < RP; k0 += AXB_KC) {
      const i64 kp = std::min(AXB_KC, RP - k0);
      pack_pairs(w + 2 * k0 * ldw + c0, ldw, R - 2 * k0, kp, panel);
      const bool odd = (R & 1) && k0 + kp == RP;
      // the next panel's rows, prefetched while this one runs (row pairs spread over the tiles;
      // a row past the last one is only prefetched, which never faults)
      i64 nk0 = k0 + AXB_KC, nc0 = c0;
      if (nk0 >= RP) nk0 = 0, nc0 = c0 + AXB_NC;
      const i64 npairs = nc0 < whole ? std::min(AXB_KC, RP - nk0) : 0;
      const bf16_t* nw = w + 2 * nk0 * ldw + nc0;
      const i64 tiles = (n + AXB_MR - 1) / AXB_MR;
      token_tiles<AXB_MR>(n, [&](i64 k, i64 t0, i64 m) {
        const i64 p0 = npairs * k / tiles, p1 = npairs * (k + 1) / tiles;
        with_width<AXB_MR>(m, [&](auto mr) {
          axb_tile<decltype(mr)::value>(panel, kp, coef + t0 * ldc + 2 * k0, ldc, odd,
                                        out + t0 * ldo + c0, ldo, k0 == 0, nw + 2 * p0 * ldw, ldw,
                                        p1 - p0);
        });
      });
    }
  if (whole < L) axpyn_block(w + whole, ldw, L - whole, R, coef, ldc, n, out + whole, ldo);
}

static void axpyn_rows(const bf16_t* w, i64 ldw, i64 L, i64 R, const bf16_t* coef, i64 ldc,
                       i64 n, float* out, i64 ldo) {
  const i64 bt = npu_lora_stream::blocked_tokens();
  if (bt && n >= bt && L >= AXB_NC) return axpyn_blocked(w, ldw, L, R, coef, ldc, n, out, ldo);
  if (n < AXPYN_BLOCK_TOKENS || L <= AXPYN_COLS)
    return axpyn_block(w, ldw, L, R, coef, ldc, n, out, ldo);
  for (i64 c0 = 0; c0 < L; c0 += AXPYN_COLS)
    axpyn_block(w + c0, ldw, std::min<i64>(AXPYN_COLS, L - c0), R, coef, ldc, n, out + c0, ldo);
}

}  // namespace

namespace npu_lora_stream {
void avx512bf16_dot_bf16n(const unsigned short* w, i64 ldw, i64 L, i64 rows,
                          const unsigned short* x, i64 ldx, i64 n, float* out, i64 ldo) {
  dotn_rows(w, ldw, L, rows, x, ldx, n, out, ldo);
}
void avx512bf16_axpy_bf16n(const unsigned short* w, i64 ldw, i64 L, i64 rows,
                           const unsigned short* c, i64 ldc, i64 n, float* out, i64 ldo) {
  axpyn_rows(w, ldw, L, rows, c, ldc, n, out, ldo);
}
void avx512bf16_act_row(const float* h, i64 I, i64 r0, i64 r1, unsigned short* dst) {
  act_row(h, I, r0, r1, dst);
}
float avx512bf16_dh_row(const float* h, const float* zp, i64 pstride, i64 P, i64 I, float wr,
                        float* ds, unsigned short* dhn) {
  return dh_row(h, zp, pstride, P, I, wr, ds, dhn);
}
}  // namespace npu_lora_stream
