// Single-threaded streaming micro-kernels, compiled once per instruction set.
//
// Included by stream_<isa>.cpp after `#pragma GCC target(...)` and the definition of the vector
// traits `V` (register type, width, loads that widen bf16 to fp32, fma, horizontal sum). No
// standard-library header is included here: every function has internal linkage (anonymous
// namespace), so code compiled for one ISA can never be picked by the linker for another.
//
// Weights `w` are row-major [rows, ld_w] in `WT` (float, or uint16_t holding bf16 bits); every
// activation is fp32. Accumulation is fp32 in a fixed order (determined by the shapes only).
//
//   dot_rows:  out[t, r] = sum_c x[t, c] * w[r, c]        (x · Wᵀ: forward direction)
//   axpy_rows: out[t, c] = sum_r coef[t, r] * w[r, c]     (coef · W: backward direction)
//
//   bf16 weights on AVX2/AVX-512: dot16_rows / axpy16_rows (even/odd split, below).
//
// Both read each weight row once from memory (token chunks after the first re-read it from L1).

namespace {

using i64 = long long;

static inline float widen(float v) { return v; }
static inline float widen(unsigned short v) {
  unsigned int u = static_cast<unsigned int>(v) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// RB weight rows x NB tokens, accumulators in registers, full-length rows.
template <class WT, int RB, int NB>
static inline void dot_tile(const WT* w, i64 ldw, i64 L, const float* x, i64 ldx, float* out,
                            i64 ldo) {
  typename V::reg acc[RB][NB];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) acc[r][t] = V::zero();
  i64 c = 0;
  for (; c + V::W <= L; c += V::W) {
    typename V::reg wv[RB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) wv[r] = V::load(w + r * ldw + c);
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) {
      typename V::reg xv = V::load(x + t * ldx + c);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) acc[r][t] = V::fma(wv[r], xv, acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NB; ++t) {
      float s = V::hsum(acc[r][t]);
      for (i64 cc = c; cc < L; ++cc) s += widen(w[r * ldw + cc]) * x[t * ldx + cc];
      out[t * ldo + r] = s;
    }
}

template <class WT, int RB, int NB>
static inline void dot_rows_rb(const WT* w, i64 ldw, i64 L, const float* x, i64 ldx, i64 n,
                               float* out, i64 ldo) {
  i64 t = 0;
  for (; t + NB <= n; t += NB) dot_tile<WT, RB, NB>(w, ldw, L, x + t * ldx, ldx, out + t * ldo, ldo);
  const float* xt = x + t * ldx;
  float* ot = out + t * ldo;
  switch (n - t) {
    case 0: break;
    case 1: dot_tile<WT, RB, 1>(w, ldw, L, xt, ldx, ot, ldo); break;
    case 2: dot_tile<WT, RB, 2>(w, ldw, L, xt, ldx, ot, ldo); break;
    case 3: dot_tile<WT, RB, 3>(w, ldw, L, xt, ldx, ot, ldo); break;
    case 4: dot_tile<WT, RB, 4>(w, ldw, L, xt, ldx, ot, ldo); break;
    case 5: dot_tile<WT, RB, 5>(w, ldw, L, xt, ldx, ot, ldo); break;
    case 6: dot_tile<WT, RB, 6>(w, ldw, L, xt, ldx, ot, ldo); break;
    default: dot_rows_rb<WT, RB, 1>(w, ldw, L, xt, ldx, n - t, ot, ldo); break;
  }
}

template <class WT>
static void dot_rows(const WT* w, i64 ldw, i64 L, i64 rows, const float* x, i64 ldx, i64 n,
                     float* out, i64 ldo) {
  i64 r = 0;
  for (; r + V::DOT_RB <= rows; r += V::DOT_RB)
    dot_rows_rb<WT, V::DOT_RB, V::DOT_NB>(w + r * ldw, ldw, L, x, ldx, n, out + r, ldo);
  for (; r < rows; ++r) dot_rows_rb<WT, 1, V::DOT_NB>(w + r * ldw, ldw, L, x, ldx, n, out + r, ldo);
}

// NB tokens x CV vectors of columns, over the rows [r0, r1); acc loaded from / stored to out.
template <class WT, int CV, int NB>
static inline void axpy_tile(const WT* w, i64 ldw, i64 r0, i64 r1, i64 c0, const float* coef,
                             i64 ldc, float* out, i64 ldo, bool first) {
  typename V::reg acc[NB][CV];
#pragma GCC unroll 8
  for (int t = 0; t < NB; ++t)
#pragma GCC unroll 8
    for (int v = 0; v < CV; ++v)
      acc[t][v] = first ? V::zero() : V::loadf(out + t * ldo + c0 + v * V::W);
  for (i64 r = r0; r < r1; ++r) {
    typename V::reg wv[CV];
#pragma GCC unroll 8
    for (int v = 0; v < CV; ++v) wv[v] = V::load(w + r * ldw + c0 + v * V::W);
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) {
      typename V::reg b = V::set1(coef[t * ldc + r]);
#pragma GCC unroll 8
      for (int v = 0; v < CV; ++v) acc[t][v] = V::fma(b, wv[v], acc[t][v]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NB; ++t)
#pragma GCC unroll 8
    for (int v = 0; v < CV; ++v) V::store(out + t * ldo + c0 + v * V::W, acc[t][v]);
}

template <class WT, int CV, int NB>
static inline void axpy_cols(const WT* w, i64 ldw, i64 r0, i64 r1, i64 c0, const float* coef,
                             i64 ldc, i64 n, float* out, i64 ldo, bool first) {
  i64 t = 0;
  for (; t + NB <= n; t += NB)
    axpy_tile<WT, CV, NB>(w, ldw, r0, r1, c0, coef + t * ldc, ldc, out + t * ldo, ldo, first);
  for (; t < n; ++t)
    axpy_tile<WT, CV, 1>(w, ldw, r0, r1, c0, coef + t * ldc, ldc, out + t * ldo, ldo, first);
}

template <class WT>
static void axpy_rows(const WT* w, i64 ldw, i64 L, i64 rows, const float* coef, i64 ldc, i64 n,
                      float* out, i64 ldo) {
  const i64 RG = 16;  // rows per group: 16 sequential weight streams, acc reloaded per group
  const i64 CW = V::AXPY_CV * V::W;
  const i64 Lv = (L / V::W) * V::W;
  for (i64 r0 = 0; r0 < rows; r0 += RG) {
    const i64 r1 = r0 + RG < rows ? r0 + RG : rows;
    const bool first = r0 == 0;
    i64 c = 0;
    for (; c + CW <= L; c += CW)
      axpy_cols<WT, V::AXPY_CV, V::AXPY_NB>(w, ldw, r0, r1, c, coef, ldc, n, out, ldo, first);
    for (; c < Lv; c += V::W)
      axpy_cols<WT, 1, V::AXPY_NB>(w, ldw, r0, r1, c, coef, ldc, n, out, ldo, first);
    for (i64 t = 0; t < n; ++t)
      for (i64 cc = Lv; cc < L; ++cc) {
        float s = first ? 0.f : out[t * ldo + cc];
        for (i64 r = r0; r < r1; ++r) s += coef[t * ldc + r] * widen(w[r * ldw + cc]);
        out[t * ldo + cc] = s;
      }
  }
}


// ---- bf16 weights, even/odd split (AVX2 / AVX-512 only: V::PAIRED) ---------------------------
// One load of 2W bf16 words gives two fp32 vectors with one uop each: the even elements
// (word << 16) and the odd ones (word & 0xffff0000). The matching fp32 operand is kept in the
// same "paired" order: per block of 2W elements, the W even ones then the W odd ones (the tail
// past the last full block stays in natural order). dot: x is paired; axpy: out is written
// paired and put back in natural order at the end.

template <int RB, int NB>
static inline void dot16_tile(const unsigned short* w, i64 ldw, i64 L, const float* x, i64 ldx,
                              float* out, i64 ldo) {
  typename V::reg acc[RB][NB];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) acc[r][t] = V::zero();
  i64 c = 0;
  for (; c + 2 * V::W <= L; c += 2 * V::W) {
    typename V::reg we[RB], wo[RB];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) V::load2(w + r * ldw + c, we[r], wo[r]);
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) {
      typename V::reg xe = V::loadf(x + t * ldx + c), xo = V::loadf(x + t * ldx + c + V::W);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) acc[r][t] = V::fma(wo[r], xo, V::fma(we[r], xe, acc[r][t]));
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < NB; ++t) {
      float s = V::hsum(acc[r][t]);
      for (i64 cc = c; cc < L; ++cc) s += widen(w[r * ldw + cc]) * x[t * ldx + cc];
      out[t * ldo + r] = s;
    }
}

template <int RB, int NB>
static inline void dot16_rows_rb(const unsigned short* w, i64 ldw, i64 L, const float* x,
                                 i64 ldx, i64 n, float* out, i64 ldo) {
  i64 t = 0;
  for (; t + NB <= n; t += NB) dot16_tile<RB, NB>(w, ldw, L, x + t * ldx, ldx, out + t * ldo, ldo);
  for (; t < n; ++t) dot16_tile<RB, 1>(w, ldw, L, x + t * ldx, ldx, out + t * ldo, ldo);
}

static void dot16_rows(const unsigned short* w, i64 ldw, i64 L, i64 rows, const float* x,
                       i64 ldx, i64 n, float* out, i64 ldo) {
  i64 r = 0;
  for (; r + V::DOT16_RB <= rows; r += V::DOT16_RB)
    dot16_rows_rb<V::DOT16_RB, V::DOT16_NB>(w + r * ldw, ldw, L, x, ldx, n, out + r, ldo);
  for (; r < rows; ++r) dot16_rows_rb<1, V::DOT16_NB>(w + r * ldw, ldw, L, x, ldx, n, out + r, ldo);
}

template <int NB>
static inline void axpy16_tile(const unsigned short* w, i64 ldw, i64 r0, i64 r1, i64 c0,
                               const float* coef, i64 ldc, float* out, i64 ldo, bool first) {
  typename V::reg ae[NB], ao[NB];
#pragma GCC unroll 8
  for (int t = 0; t < NB; ++t) {
    ae[t] = first ? V::zero() : V::loadf(out + t * ldo + c0);
    ao[t] = first ? V::zero() : V::loadf(out + t * ldo + c0 + V::W);
  }
  for (i64 r = r0; r < r1; ++r) {
    typename V::reg we, wo;
    V::load2(w + r * ldw + c0, we, wo);
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) {
      typename V::reg b = V::set1(coef[t * ldc + r]);
      ae[t] = V::fma(b, we, ae[t]);
      ao[t] = V::fma(b, wo, ao[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NB; ++t) {
    V::store(out + t * ldo + c0, ae[t]);
    V::store(out + t * ldo + c0 + V::W, ao[t]);
  }
}

static void axpy16_rows(const unsigned short* w, i64 ldw, i64 L, i64 rows, const float* coef,
                        i64 ldc, i64 n, float* out, i64 ldo) {
  const i64 RG = 16;
  const i64 P = 2 * V::W;
  const i64 Lp = (L / P) * P;
  for (i64 r0 = 0; r0 < rows; r0 += RG) {
    const i64 r1 = r0 + RG < rows ? r0 + RG : rows;
    const bool first = r0 == 0;
    for (i64 c = 0; c < Lp; c += P) {
      i64 t = 0;
      for (; t + V::AXPY_NB <= n; t += V::AXPY_NB)
        axpy16_tile<V::AXPY_NB>(w, ldw, r0, r1, c, coef + t * ldc, ldc, out + t * ldo, ldo, first);
      for (; t < n; ++t)
        axpy16_tile<1>(w, ldw, r0, r1, c, coef + t * ldc, ldc, out + t * ldo, ldo, first);
    }
    for (i64 t = 0; t < n; ++t)
      for (i64 cc = Lp; cc < L; ++cc) {
        float s = first ? 0.f : out[t * ldo + cc];
        for (i64 r = r0; r < r1; ++r) s += coef[t * ldc + r] * widen(w[r * ldw + cc]);
        out[t * ldo + cc] = s;
      }
  }
  // paired -> natural order, block by block
  float tmp[2 * V::W];
  for (i64 t = 0; t < n; ++t)
    for (i64 c = 0; c < Lp; c += P) {
      float* o = out + t * ldo + c;
      for (int i = 0; i < P; ++i) tmp[i] = o[i];
      for (int i = 0; i < V::W; ++i) {
        o[2 * i] = tmp[i];
        o[2 * i + 1] = tmp[V::W + i];
      }
    }
}

}  // namespace

#define NPU_LORA_EXPORT(isa)                                                                    \
  namespace npu_lora_stream {                                                                   \
  void isa##_dot_f32(const float* w, i64 ldw, i64 L, i64 rows, const float* x, i64 ldx, i64 n, \
                     float* out, i64 ldo) {                                                     \
    dot_rows<float>(w, ldw, L, rows, x, ldx, n, out, ldo);                                      \
  }                                                                                             \
  void isa##_dot_bf16(const unsigned short* w, i64 ldw, i64 L, i64 rows, const float* x,      \
                      i64 ldx, i64 n, float* out, i64 ldo) {                                    \
    if (V::PAIRED) dot16_rows(w, ldw, L, rows, x, ldx, n, out, ldo);                            \
    else dot_rows<unsigned short>(w, ldw, L, rows, x, ldx, n, out, ldo);                        \
  }                                                                                             \
  void isa##_axpy_f32(const float* w, i64 ldw, i64 L, i64 rows, const float* c, i64 ldc,       \
                      i64 n, float* out, i64 ldo) {                                             \
    axpy_rows<float>(w, ldw, L, rows, c, ldc, n, out, ldo);                                     \
  }                                                                                             \
  void isa##_axpy_bf16(const unsigned short* w, i64 ldw, i64 L, i64 rows, const float* c,     \
                       i64 ldc, i64 n, float* out, i64 ldo) {                                   \
    if (V::PAIRED) axpy16_rows(w, ldw, L, rows, c, ldc, n, out, ldo);                           \
    else axpy_rows<unsigned short>(w, ldw, L, rows, c, ldc, n, out, ldo);                       \
  }                                                                                             \
  /* block of the paired fp32 operand order for bf16 weights (1: natural order) */             \
  int isa##_pair() { return V::PAIRED ? 2 * V::W : 1; }                                         \
  }
