// Single-threaded streaming micro-kernels, compiled once per instruction set.
//
// Included by stream_<isa>.cpp after `#pragma GCC target(...)` and the definition of the vector
// traits `V` (register type, width W, register count, tile shapes, loads that widen bf16 to fp32,
// fma, horizontal sum). No standard-library header is included here and every function has
// internal linkage (anonymous namespace), so code compiled for one ISA can never be picked by the
// linker for another.
//
// Weights `w` are row-major [rows, ldw] in `WT` (float, or bf16_t holding bf16 bits). Accumulation
// is fp32 in an order fixed by the shapes alone (never by the thread count).
//
//   dot_rows:    out[t, r] = sum_c x[t, c] * w[r, c]     fp32 or bf16 weights, fp32 x (forward)
//   axpy_rows:   out[t, c] = sum_r coef[t, r] * w[r, c]  fp32 or bf16 weights   (backward direction)
//                (bf16 weights on AVX2: out columns stored in unpack order, see axpy_tile_u16)
//
// Why these shapes (measured on a 2-core AMD EPYC, AVX2, experiments/2026-12-02-stream-kernel-v2.md):
// a skinny expert GEMM (~8 tokens per expert at T=128) is bound by loads per FMA and by how well
// the weight stream is prefetched, not by FMA width. So:
// - every kernel keeps an RB x NB (or NB x CV) block of accumulators in registers and loads each
//   weight vector once per token tile and each activation vector once per row tile (about 0.5
//   loads per FMA on 16 registers);
// - dot kernels walk whole weight rows (long sequential streams the hardware prefetcher follows)
//   and prefetch the row tile PF_TILES tiles ahead;
// - bf16 weights are widened in registers in natural order (zero-extend + shift) and run the
//   fp32 tiles; the activations are bf16-rounded values held as fp32. An even/odd variant with
//   bf16 activations too (one 2W-word load widened to two vectors per operand, tile 2 x 5) was
//   even at T=128 and ~8 % slower at T=512 (compute-bound) in interleaved runs;
// - axpy (a weight row scales into every output row) walks RR whole weight rows at a time too,
//   keeping the RR x NB coefficients in registers (AVX2: in an L1 stack block read by the FMAs,
//   so that the tile can be 4 x 5) and updating the out rows in cache; a packed row-group
//   variant (weights copied block by block into an L1 buffer) was 1.1-1.3x slower in interleaved
//   runs (experiments/2026-12-02-stream-kernel-v2.md).

#include "stream_tiles.h"

namespace {

using i64 = long long;
typedef unsigned short bf16_t;

static inline float widen(float v) { return v; }
static inline float widen(bf16_t v) {
  unsigned int u = static_cast<unsigned int>(v) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
template <class WT>
struct IsBf16 {
  static constexpr bool value = false;
};
template <>
struct IsBf16<bf16_t> {
  static constexpr bool value = true;
};

// ---- dot, fp32 weights and activations ----------------------------------------------------------
// RB weight rows x NB tokens of accumulators; x loaded once per step and used for RB rows.
// `pf`: rows to prefetch (same ldw), one line per row per 64 bytes consumed (nullptr: none).
template <class WT, int RB, int NB>
static inline void dot_tile(const WT* w, i64 ldw, i64 L, const float* x, i64 ldx, float* out,
                            i64 ldo, const WT* pf, i64 pc0, i64 pc1) {
  constexpr i64 LINE = 64 / sizeof(WT);
  typename V::reg acc[RB][NB];
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) acc[r][t] = V::zero();
  i64 c = 0;
  for (; c + V::W <= L; c += V::W) {
    if (pf && (c & (LINE - 1)) == 0 && c >= pc0 && c < pc1)
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) __builtin_prefetch(pf + r * ldw + c, 0, 2);
    typename V::reg wv[RB];
#pragma GCC unroll 16
    for (int r = 0; r < RB; ++r) wv[r] = V::load(w + r * ldw + c);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      const typename V::reg xv = V::load(x + t * ldx + c);
#pragma GCC unroll 16
      for (int r = 0; r < RB; ++r) acc[r][t] = V::fma(wv[r], xv, acc[r][t]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      float s = V::hsum(acc[r][t]);
      for (i64 cc = c; cc < L; ++cc) s += widen(w[r * ldw + cc]) * x[t * ldx + cc];
      out[t * ldo + r] = s;
    }
}

// The loop both kernels share: rows [0, R) of w in row tiles of RB (the remainder one row at a
// time), and for each row tile the balanced token tiles of at most NBM tokens:
// tile(IntC<rows>, IntC<tokens>, r0, t0, pf, pc0, pc1). The weights of a row tile are streamed
// from memory by its first token tile and re-read from cache by the others; the row tile PF_TILES
// ahead is prefetched (`pf`, else nullptr) spread over all its token tiles, token tile k of m
// taking the columns [pc0, pc1) = the k-th m-th of L (in whole cache lines), so that the memory
// stream keeps going while the later token tiles compute from cache. Measured against prefetching
// in the first token tile only (core benchmark, 2-core Xeon with AMX, two alternations): T=512
// fp32 avx512 fwd 254/266 -> 231/250 ms, bwd 301/307 -> 273/287; avx2 335/336 -> 313/316,
// 407/409 -> 378/389; T=128 even (experiments/2026-12-02-stream-head.md).
template <int RB, int NBM, class WT, class F>
static inline void row_token_tiles(const WT* w, i64 ldw, i64 L, i64 R, i64 n, F tile) {
  constexpr i64 LINE = 64 / sizeof(WT);
  const i64 PD = V::PF_TILES * RB;
  const i64 tiles = (n + NBM - 1) / NBM, lines = (L + LINE - 1) / LINE;
  auto row_tile = [&](auto rb, i64 r0, const WT* pf) {
    token_tiles<NBM>(n, [&](i64 k, i64 t0, i64 m) {
      const i64 pc0 = lines * k / tiles * LINE, pc1 = lines * (k + 1) / tiles * LINE;
      with_width<NBM>(m, [&](auto nb) { tile(rb, nb, r0, t0, pf, pc0, pc1); });
    });
  };
  i64 r = 0;
  for (; r + RB <= R; r += RB) row_tile(IntC<RB>{}, r, r + PD < R ? w + (r + PD) * ldw : nullptr);
  for (; r < R; ++r) row_tile(IntC<1>{}, r, nullptr);
}

// out[t, r] for rows [0, R) of w, whole rows (length L).
template <class WT>
static void dot_rows(const WT* w, i64 ldw, i64 L, i64 R, const float* x, i64 ldx, i64 n,
                     float* out, i64 ldo) {
  row_token_tiles<V::DOT_RB, V::DOT_NB>(w, ldw, L, R, n, [&](auto rb, auto nb, i64 r0, i64 t0,
                                                             const WT* pf, i64 pc0, i64 pc1) {
    dot_tile<WT, decltype(rb)::value, decltype(nb)::value>(
        w + r0 * ldw, ldw, L, x + t0 * ldx, ldx, out + t0 * ldo + r0, ldo, pf, pc0, pc1);
  });
}

// The RR x NB coefficients of an axpy tile, each broadcast to a vector: in registers, or (V::
// AXPY_CF_MEM) in an aligned stack block that every FMA reads as its memory operand, which frees
// the registers for a taller tile (AVX2: 4 x 5 instead of 3 x 4; 16 registers cannot hold 20
// coefficients). Measured on a 2-core AMD EPYC (Zen 3, AVX2), experiments/2026-12-03-axpy-tile.md:
// backward 0.92x the 3 x 4 register tile's time at T=512 fp32, 0.91x at T=128 fp32, 0.97x at
// T=128 bf16, 1.00x at T=512 bf16 (a 3 x 4 tile from memory alone gains nothing: the taller tile
// does).
template <int RR, int NB, bool MEM = V::AXPY_CF_MEM>
struct AxpyCoefs {
  typename V::reg r[NB][RR];
  AxpyCoefs(const float* coef, i64 ldc) {
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t)
#pragma GCC unroll 16
      for (int j = 0; j < RR; ++j) r[t][j] = V::set1(coef[t * ldc + j]);
  }
  typename V::reg operator()(int t, int j) const { return r[t][j]; }
};
template <int RR, int NB>
struct AxpyCoefs<RR, NB, true> {
  alignas(64) float m[NB][RR][V::W];
  AxpyCoefs(const float* coef, i64 ldc) {
    for (int t = 0; t < NB; ++t)
      for (int j = 0; j < RR; ++j) V::store(m[t][j], V::set1(coef[t * ldc + j]));
  }
  typename V::reg operator()(int t, int j) const { return V::load(m[t][j]); }
};

// ---- axpy: out[t, c] = sum_r coef[t, r] * w[r, c] ------------------------------------------------
// Row tiles of RR weight rows (RR sequential streams, as in dot); for each token tile the RR x NB
// coefficients are broadcast once (AxpyCoefs) and the accumulators are the out rows themselves
// (L1/L2): per W columns RR weight loads, NB accumulator loads and stores, RR x NB FMAs. The rows
// of a tile are added in row order, so every out element is summed over r = 0, 1, 2, ... as a
// plain loop would.
// bf16 weights are widened in natural order (zero-extend + shift).
template <class WT, int RR, int NB>
static inline void axpy_tile(const WT* w, i64 ldw, i64 L, const float* coef, i64 ldc, float* out,
                             i64 ldo, bool first, const WT* pf, i64 pc0, i64 pc1) {
  constexpr i64 LINE = 64 / sizeof(WT);
  const AxpyCoefs<RR, NB> cf(coef, ldc);
  i64 c = 0;
  for (; c + V::W <= L; c += V::W) {
    if (pf && (c & (LINE - 1)) == 0 && c >= pc0 && c < pc1)
#pragma GCC unroll 16
      for (int j = 0; j < RR; ++j) __builtin_prefetch(pf + j * ldw + c, 0, 2);
    typename V::reg wv[RR];
#pragma GCC unroll 16
    for (int j = 0; j < RR; ++j) wv[j] = V::load(w + j * ldw + c);
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      typename V::reg acc = first ? V::zero() : V::load(out + t * ldo + c);
#pragma GCC unroll 16
      for (int j = 0; j < RR; ++j) acc = V::fma(cf(t, j), wv[j], acc);
      V::store(out + t * ldo + c, acc);
    }
  }
  for (int t = 0; t < NB; ++t)
    for (i64 cc = c; cc < L; ++cc) {
      float s = first ? 0.f : out[t * ldo + cc];
      for (int j = 0; j < RR; ++j) s += coef[t * ldc + j] * widen(w[j * ldw + cc]);
      out[t * ldo + cc] = s;
    }
}

#ifdef NPU_LORA_AXPY_U16
// bf16 axpy in unpack order (AVX2): per block of 16 columns one 32-byte load of each weight row
// gives two fp32 vectors by one unpack each (V::lo16: columns 0-3 and 8-11, V::hi16: 4-7 and
// 12-15) instead of two zero-extends and two shifts, and the out rows hold each block in that
// order (u16_pos); columns past the last whole block stay in natural order. The rows are still
// added in row order, so every out element is the natural-order kernel's value, only stored
// elsewhere. Measured on an AVX2 EPYC (experiments/2026-12-02-avx2-epyc.md): backward 0.91-0.94x
// the natural-order tile's time (T=128 and 512), in cache 1.06-1.29x its throughput.
template <int RR, int NB>
static inline void axpy_tile_u16(const bf16_t* w, i64 ldw, i64 L, const float* coef, i64 ldc,
                                 float* out, i64 ldo, bool first, const bf16_t* pf, i64 pc0,
                                 i64 pc1) {
  constexpr i64 LINE = 32;
  const AxpyCoefs<RR, NB> cf(coef, ldc);
  auto half = [&](const typename V::reg* wv, float* o) {
#pragma GCC unroll 16
    for (int t = 0; t < NB; ++t) {
      typename V::reg acc = first ? V::zero() : V::load(o + t * ldo);
#pragma GCC unroll 16
      for (int j = 0; j < RR; ++j) acc = V::fma(cf(t, j), wv[j], acc);
      V::store(o + t * ldo, acc);
    }
  };
  i64 c = 0;
  for (; c + 16 <= L; c += 16) {
    if (pf && (c & (LINE - 1)) == 0 && c >= pc0 && c < pc1)
#pragma GCC unroll 16
      for (int j = 0; j < RR; ++j) __builtin_prefetch(pf + j * ldw + c, 0, 2);
    typename V::reg wv[RR];
#pragma GCC unroll 16
    for (int j = 0; j < RR; ++j) wv[j] = V::lo16(w + j * ldw + c);
    half(wv, out + c);
#pragma GCC unroll 16
    for (int j = 0; j < RR; ++j) wv[j] = V::hi16(w + j * ldw + c);
    half(wv, out + c + 8);
  }
  for (int t = 0; t < NB; ++t)
    for (i64 cc = c; cc < L; ++cc) {
      float s = first ? 0.f : out[t * ldo + cc];
      for (int j = 0; j < RR; ++j) s += coef[t * ldc + j] * widen(w[j * ldw + cc]);
      out[t * ldo + cc] = s;
    }
}
#endif

template <class WT>
static void axpy_rows(const WT* w, i64 ldw, i64 L, i64 R, const float* coef, i64 ldc, i64 n,
                      float* out, i64 ldo) {
  row_token_tiles<V::AXPY_RR, V::AXPY_NB>(w, ldw, L, R, n, [&](auto rr, auto nb, i64 r0, i64 t0,
                                                               const WT* pf, i64 pc0, i64 pc1) {
#ifdef NPU_LORA_AXPY_U16
    if constexpr (IsBf16<WT>::value) {
      axpy_tile_u16<decltype(rr)::value, decltype(nb)::value>(
          w + r0 * ldw, ldw, L, coef + t0 * ldc + r0, ldc, out + t0 * ldo, ldo, r0 == 0, pf, pc0,
          pc1);
      return;
    }
#endif
    axpy_tile<WT, decltype(rr)::value, decltype(nb)::value>(
        w + r0 * ldw, ldw, L, coef + t0 * ldc + r0, ldc, out + t0 * ldo, ldo, r0 == 0, pf, pc0,
        pc1);
  });
}


}  // namespace

#define NPU_LORA_EXPORT(isa)                                                                    \
  namespace npu_lora_stream {                                                                   \
  void isa##_dot_f32(const float* w, i64 ldw, i64 L, i64 rows, const float* x, i64 ldx, i64 n, \
                     float* out, i64 ldo) {                                                     \
    dot_rows<float>(w, ldw, L, rows, x, ldx, n, out, ldo);                                      \
  }                                                                                             \
  void isa##_dot_bf16f(const unsigned short* w, i64 ldw, i64 L, i64 rows, const float* x,      \
                       i64 ldx, i64 n, float* out, i64 ldo) {                                   \
    dot_rows<bf16_t>(w, ldw, L, rows, x, ldx, n, out, ldo);                                     \
  }                                                                                             \
  void isa##_axpy_f32(const float* w, i64 ldw, i64 L, i64 rows, const float* c, i64 ldc,       \
                      i64 n, float* out, i64 ldo) {                                             \
    axpy_rows<float>(w, ldw, L, rows, c, ldc, n, out, ldo);                                     \
  }                                                                                             \
  void isa##_axpy_bf16(const unsigned short* w, i64 ldw, i64 L, i64 rows, const float* c,     \
                       i64 ldc, i64 n, float* out, i64 ldo) {                                   \
    axpy_rows<bf16_t>(w, ldw, L, rows, c, ldc, n, out, ldo);                                    \
  }                                                                                             \
  }
