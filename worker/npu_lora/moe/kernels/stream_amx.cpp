// AMX instance (Intel Sapphire Rapids and later: AMX-TILE + AMX-BF16, with AVX-512 + AVX512-BF16):
// the two native bf16 kernels on tile registers (`tdpbf16ps`: C[m, n] += sum over k pairs of
// A[m, 2k] * B[k, n, 0] + A[m, 2k+1] * B[k, n, 1], bf16 products, fp32 accumulation). fp32 and
// widened-bf16 weights run the AVX-512 kernels (stream_core.h: ops_for).
//
// Legend: tiles are 16 rows x 64 bytes (16 x 32 bf16, or 16 x 16 fp32). Tile registers:
// 0-3 accumulators C, 4-5 A operands, 6-7 B operands. "k-step" = 32 summed elements.
//
//   dot  (forward)   out[t, r] = sum_c x[t, c] * w[r, c]
//        C[r, t] (16 weight rows x 16 tokens) += A[r, c] * B[c, t]: A is 16 rows of w as stored
//        (loaded straight from the weights, row stride ldw), B the tokens packed in VNNI blocks
//        of 16 by the driver (stream_core.h: pack_tokens): word (q, t) = (x[t, 2q], x[t, 2q+1]).
//        Row groups of 64 rows (4 C tiles, one token block) or 2 x 2 (32 rows x 32 tokens) when an
//        expert has more than 16 tokens. Each k-step prefetches the next 64 bytes of its rows into
//        L1, and the next 128 when the rows start on a cache line (torch's large tensors sit 64
//        bytes past a page start): with rows 4 KiB apart (gate/up at H=2048) the T=128 forward
//        took 65-72 ms with line-aligned rows and no or one line of prefetch, 56-61 ms with two,
//        while rows 16 bytes off a line ran 57-58 ms with one (two: 67). Into L2 instead: 73-80
//        ms. Measured through the extension on a 2-core Xeon with AMX, weights placed at page
//        offsets 0/16/32/64/128 (experiments/2026-12-02-xeon-amx.md). Prefetching the next row
//        group instead (as the AVX kernels do) was even on gate/up and slower on down (21 vs 17.6
//        ms); groups of 32 rows: gate/up 38 vs 34 ms.
//   axpy (backward)  out[t, c] = sum_r coef[t, r] * w[r, c]
//        C[t, c] (16 tokens x 16 columns) += A[t, r] * B[r, c]: A is 16 rows of the coefficients
//        as gathered (bf16, the driver pads 16 rows past the end), B two weight rows interleaved
//        into (w[r, c], w[r+1, c]) pairs (`vpermt2w`, as the AVX512-BF16 axpy does) into an L1
//        buffer, 32 weight rows x 32 columns at a time (whole rows in order, the next 32 rows
//        prefetched); the partial C of each (16 tokens, 32 columns) lives in a padded fp32
//        buffer between k-steps.
//
// Tails: columns past L and rows past R enter as zeros (weights copied into a zero-padded
// buffer when L % 32 or R % 16 is not 0 in the dot; masked loads and a padded coefficient tile in
// the axpy); tokens past n are computed on padding and never stored. The summation order depends
// on the shapes only, so results are deterministic across runs and thread counts.
//
// Each call loads its tile configuration and releases the tiles at the end (torch's oneDNN
// kernels may run AMX on the same threads between our calls). The process must have been granted
// AMX state (arch_prctl ARCH_REQ_XCOMP_PERM: stream_core.h amx_request, done before the ISA is
// offered).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,avx2,bmi2")
#include <immintrin.h>

#include "stream_silu512.h"  // exp16, silu_mul16, dh_row

namespace {

using i64 = long long;
typedef unsigned short bf16_t;

struct alignas(64) TileCfg {
  unsigned char palette, start_row, rsv[14];
  unsigned short colsb[16];
  unsigned char rows[16];
};

// Every used tile 16 x 64 bytes, loaded at the start of a call, released at its end.
struct Tiles {
  Tiles() {
    TileCfg c;
    std::memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; ++i) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
  }
  ~Tiles() { _tile_release(); }
};

// Thread-local 64-byte aligned scratch (grown on demand, freed when the thread ends).
struct Scratch {
  void* p = nullptr;
  std::size_t n = 0;
  void* get(std::size_t bytes) {
    if (bytes > n) {
      std::free(p);
      n = (bytes + 4095) / 4096 * 4096;
      p = std::aligned_alloc(64, n);
      if (!p) std::abort();
    }
    return p;
  }
  ~Scratch() { std::free(p); }
};
thread_local Scratch s_wpad, s_out, s_b, s_tail;

inline i64 up(i64 v, i64 m) { return (v + m - 1) / m * m; }

// ---- dot -----------------------------------------------------------------------------------------
// RB row blocks (16 rows each) x NB token blocks (NB = 2 only with RB <= 2); C tile of (rb, tb)
// is rb * NB + tb; the C tiles are stored to cs (16 x 16 fp32 each, row = weight row).
template <int RB, int NB>
inline void dot_sub(const bf16_t* w, i64 ldw, i64 Lp, const bf16_t* xb, i64 bstride, bool two,
                    float* cs) {
  static_assert(RB * NB <= 4 && NB <= 2, "4 accumulator tiles");
  _tile_zero(0);
  if constexpr (RB * NB > 1) _tile_zero(1);
  if constexpr (RB * NB > 2) _tile_zero(2);
  if constexpr (RB * NB > 3) _tile_zero(3);
  const i64 sw = ldw * 2;
  for (i64 k = 0; k < Lp; k += 32) {
    // the next k-step of the same rows into L1, and the one after when rows are line-aligned
    // (see the legend)
    if (two && k + 64 < Lp) {
      for (int r = 0; r < RB * 16; ++r) {
        __builtin_prefetch(w + r * ldw + k + 32, 0, 3);
        __builtin_prefetch(w + r * ldw + k + 64, 0, 3);
      }
    } else if (k + 32 < Lp) {
      for (int r = 0; r < RB * 16; ++r) __builtin_prefetch(w + r * ldw + k + 32, 0, 3);
    }
    _tile_loadd(6, xb + k * 16, 64);  // word rows q = k/2 .. k/2 + 15 of the token block
    if constexpr (NB == 2) _tile_loadd(7, xb + bstride + k * 16, 64);
    _tile_loadd(4, w + k, sw);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (RB >= 2) {
      _tile_loadd(5, w + 16 * ldw + k, sw);
      if constexpr (NB == 2) {
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      } else {
        _tile_dpbf16ps(1, 5, 6);
      }
    }
    if constexpr (RB >= 3) {
      _tile_loadd(4, w + 32 * ldw + k, sw);
      _tile_dpbf16ps(2, 4, 6);
    }
    if constexpr (RB >= 4) {
      _tile_loadd(5, w + 48 * ldw + k, sw);
      _tile_dpbf16ps(3, 5, 6);
    }
  }
  _tile_stored(0, cs, 64);
  if constexpr (RB * NB > 1) _tile_stored(1, cs + 256, 64);
  if constexpr (RB * NB > 2) _tile_stored(2, cs + 512, 64);
  if constexpr (RB * NB > 3) _tile_stored(3, cs + 768, 64);
}

// cs (RB x NB tiles, tile (rb, tb) = C[16 rows, 16 tokens]) -> out[t, r] for r < R, t < n
template <int RB, int NB>
inline void dot_store(const float* cs, i64 r0, i64 R, i64 t0, i64 n, float* out, i64 ldo) {
  for (int rb = 0; rb < RB; ++rb)
    for (int tb = 0; tb < NB; ++tb) {
      const float* c = cs + (rb * NB + tb) * 256;
      const i64 nt = n - (t0 + 16 * tb) < 16 ? n - (t0 + 16 * tb) : 16;
      const i64 nr = R - (r0 + 16 * rb) < 16 ? R - (r0 + 16 * rb) : 16;
      for (i64 t = 0; t < nt; ++t) {
        float* o = out + (t0 + 16 * tb + t) * ldo + r0 + 16 * rb;
        for (i64 r = 0; r < nr; ++r) o[r] = c[r * 16 + t];
      }
    }
}

void dot_rows(const bf16_t* w, i64 ldw, i64 L, i64 R, const bf16_t* xp, i64 bstride, i64 n,
              float* out, i64 ldo) {
  const i64 Lp = up(L, 32), Rp = up(R, 16);
  if (Lp != L || Rp != R) {  // zero-padded copy of the weights (never at the model widths)
    bf16_t* wp = static_cast<bf16_t*>(s_wpad.get(Rp * Lp * sizeof(bf16_t)));
    std::memset(wp, 0, Rp * Lp * sizeof(bf16_t));
    for (i64 r = 0; r < R; ++r) std::memcpy(wp + r * Lp, w + r * ldw, L * sizeof(bf16_t));
    w = wp;
    ldw = Lp;
  }
  Tiles tiles;
  alignas(64) float cs[4 * 256];
  const i64 nbk = (n + 15) / 16;
  const bool two = (reinterpret_cast<unsigned long long>(w) % 64 == 0) && (ldw * 2) % 64 == 0;
  for (i64 r0 = 0; r0 < Rp; r0 += 64) {
    const i64 rb = (Rp - r0) / 16 < 4 ? (Rp - r0) / 16 : 4;
    const bf16_t* wr = w + r0 * ldw;
    for (i64 tb = 0; tb < nbk; tb += 2) {
      const bf16_t* xb = xp + tb * bstride;
      if (tb + 1 < nbk) {  // two token blocks: row blocks in pairs
        for (i64 j = 0; j < rb; j += 2) {
          if (j + 1 < rb) {
            dot_sub<2, 2>(wr + j * 16 * ldw, ldw, Lp, xb, bstride, two, cs);
            dot_store<2, 2>(cs, r0 + j * 16, R, tb * 16, n, out, ldo);
          } else {
            dot_sub<1, 2>(wr + j * 16 * ldw, ldw, Lp, xb, bstride, two, cs);
            dot_store<1, 2>(cs, r0 + j * 16, R, tb * 16, n, out, ldo);
          }
        }
      } else if (rb == 4) {
        dot_sub<4, 1>(wr, ldw, Lp, xb, bstride, two, cs);
        dot_store<4, 1>(cs, r0, R, tb * 16, n, out, ldo);
      } else if (rb == 3) {
        dot_sub<3, 1>(wr, ldw, Lp, xb, bstride, two, cs);
        dot_store<3, 1>(cs, r0, R, tb * 16, n, out, ldo);
      } else if (rb == 2) {
        dot_sub<2, 1>(wr, ldw, Lp, xb, bstride, two, cs);
        dot_store<2, 1>(cs, r0, R, tb * 16, n, out, ldo);
      } else {
        dot_sub<1, 1>(wr, ldw, Lp, xb, bstride, two, cs);
        dot_store<1, 1>(cs, r0, R, tb * 16, n, out, ldo);
      }
    }
  }
}

// ---- axpy ------------------------------------------------------------------------------------------
// k-steps (of 32 weight rows) per k-group, and the prefetch distance in k-groups. Measured (Xeon
// with AMX, 2 threads, T=128 bf16, core alone; experiments/2026-12-02-xeon-amx.md): KG 1 / 2 /
// 4 / 8: dx pass 36 / 78 / 87 / 88 ms (more rows streamed at once cost more than the partial
// sums they save); prefetch distance 0 / 1 / 2: 36 / 36 / 38 ms dx, 20-22 / 19 / 20 ms z. A
// column-strip order (accumulators in tiles over all rows, 64 bytes per row per visit) took
// 90-105 ms, column blocks of 256 / 512 / 1024 columns 65 / 56 / 53 ms: whole rows read in order
// are what the memory system streams best.
constexpr int KG = 1, PFD = 1;

static inline __mmask32 cols_mask(i64 n) {  // n >= 32: all
  return n >= 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << n) - 1u);
}

// rows [r, r + 32 * nks) x columns [c, c + 32) of w -> nks x 2 B tiles (columns c..c+15, then
// c+16..c+31), each 16 row pairs x 16 columns x 2 bf16; rows >= R and columns >= L are zeros.
inline void pack_b(const bf16_t* w, i64 ldw, i64 r, i64 R, i64 c, i64 L, int nks, bf16_t* bs,
                   const bf16_t* pf) {
  const __m512i idx_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                          40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                          32, 0);
  const __m512i idx_hi = _mm512_add_epi16(idx_lo, _mm512_set1_epi16(16));
  const __mmask32 m = cols_mask(L - c);
  for (int ks = 0; ks < nks; ++ks) {
    bf16_t* lo = bs + ks * 1024;
    bf16_t* hi = lo + 512;
    for (int j = 0; j < 16; ++j) {
      const i64 ra = r + ks * 32 + 2 * j;
      const __m512i va = ra < R ? _mm512_maskz_loadu_epi16(m, w + ra * ldw + c) : _mm512_setzero_si512();
      const __m512i vb =
          ra + 1 < R ? _mm512_maskz_loadu_epi16(m, w + (ra + 1) * ldw + c) : _mm512_setzero_si512();
      _mm512_store_si512(lo + j * 32, _mm512_permutex2var_epi16(va, idx_lo, vb));
      _mm512_store_si512(hi + j * 32, _mm512_permutex2var_epi16(va, idx_hi, vb));
      if (pf) {
        __builtin_prefetch(pf + (ks * 32 + 2 * j) * ldw + c, 0, 2);
        __builtin_prefetch(pf + (ks * 32 + 2 * j + 1) * ldw + c, 0, 2);
      }
    }
  }
}

// C of NB token blocks x 32 columns over nks k-steps: tile (tb, half) = tb * 2 + half. ob: the
// partial sums, rows 16 apart per token block (stride ldob floats); a[ks][tb] the A tiles
// (stride sa[ks] bytes).
template <int NB>
inline void axpy_sub(const bf16_t* const (*a)[2], const i64* sa, int nks, const bf16_t* bs,
                     float* ob, i64 ldob, bool first) {
  const i64 so = ldob * 4;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (NB == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, ob, so);
    _tile_loadd(1, ob + 16, so);
    if constexpr (NB == 2) {
      _tile_loadd(2, ob + 16 * ldob, so);
      _tile_loadd(3, ob + 16 * ldob + 16, so);
    }
  }
  for (int ks = 0; ks < nks; ++ks) {
    _tile_loadd(6, bs + ks * 1024, 64);
    _tile_loadd(7, bs + ks * 1024 + 512, 64);
    _tile_loadd(4, a[ks][0], sa[ks]);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (NB == 2) {
      _tile_loadd(5, a[ks][1], sa[ks]);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, ob, so);
  _tile_stored(1, ob + 16, so);
  if constexpr (NB == 2) {
    _tile_stored(2, ob + 16 * ldob, so);
    _tile_stored(3, ob + 16 * ldob + 16, so);
  }
}

void axpy_rows(const bf16_t* w, i64 ldw, i64 L, i64 R, const bf16_t* coef, i64 ldc, i64 n,
               float* out, i64 ldo) {
  const i64 Lp = up(L, 32), nbk = (n + 15) / 16;
  const i64 ldob = Lp + 16;  // one spare line per row: rows never 4 KiB-multiples apart
  float* ob = static_cast<float*>(s_out.get(nbk * 16 * ldob * sizeof(float)));
  bf16_t* bs = static_cast<bf16_t*>(s_b.get(KG * 1024 * sizeof(bf16_t)));
  // the coefficient tile of a partial last k-step: zero-padded copy (16 rows x 32 per block)
  const i64 rtail = R % 32;
  bf16_t* at = static_cast<bf16_t*>(s_tail.get(nbk * 16 * 32 * sizeof(bf16_t)));  // [16 n][32]
  Tiles tiles;
  for (i64 r = 0; r < R; r += 32 * KG) {
    const int nks = static_cast<int>((R - r + 31) / 32 < KG ? (R - r + 31) / 32 : KG);
    const bool tail = rtail && r + 32 * nks > R;
    const bf16_t* pf = r + 32 * KG * PFD < R ? w + (r + 32 * KG * PFD) * ldw : nullptr;
    for (i64 c = 0; c < Lp; c += 32) {
      pack_b(w, ldw, r, R, c, L, nks, bs, pf);
      for (i64 tb = 0; tb < nbk; tb += 2) {
        const int nb = tb + 1 < nbk ? 2 : 1;
        const bf16_t* a[KG][2];
        i64 sa[KG];
        for (int ks = 0; ks < nks; ++ks) {
          const i64 k0 = r + ks * 32;
          if (tail && ks == nks - 1) {
            if (c == 0) {  // build the padded tiles once per k-group (they do not depend on c)
              for (int b = 0; b < nb; ++b)
                for (int t = 0; t < 16; ++t) {
                  const i64 tt = (tb + b) * 16 + t;
                  for (int q = 0; q < 32; ++q)
                    at[((tb + b) * 16 + t) * 32 + q] =
                        tt < n && k0 + q < R ? coef[tt * ldc + k0 + q] : bf16_t(0);
                }
            }
            for (int b = 0; b < nb; ++b) a[ks][b] = at + (tb + b) * 16 * 32;
            sa[ks] = 64;
          } else {
            for (int b = 0; b < nb; ++b) a[ks][b] = coef + (tb + b) * 16 * ldc + k0;
            sa[ks] = ldc * 2;
          }
        }
        float* o = ob + tb * 16 * ldob + c;
        if (nb == 2) axpy_sub<2>(a, sa, nks, bs, o, ldob, r == 0);
        else axpy_sub<1>(a, sa, nks, bs, o, ldob, r == 0);
      }
    }
  }
  for (i64 t = 0; t < n; ++t) std::memcpy(out + t * ldo, ob + t * ldob, L * sizeof(float));
}

// ---- token packing ---------------------------------------------------------------------------------
// One VNNI token block (stream_core.h: pack_tokens): d[q * 16 + t] = 32-bit word q of token row t
// (t < cnt, 2q < L; zeros elsewhere), q < Q = up(L, 32) / 2. A 16 x 16 transpose of 32-bit words
// per 32 columns (unpack 32 / unpack 64 / two lane shuffles).
void pack_block(const bf16_t* src, i64 lds, i64 cnt, i64 L, bf16_t* dst) {
  const i64 Lp = up(L, 32);
  for (i64 c = 0; c < Lp; c += 32) {
    const __mmask32 m = cols_mask(L - c);
    __m512i r[16];
    for (int t = 0; t < 16; ++t)
      r[t] = t < cnt ? _mm512_maskz_loadu_epi16(m, src + t * lds + c) : _mm512_setzero_si512();
    __m512i u[16], v[16];
    for (int i = 0; i < 16; i += 2) {
      u[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      u[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {  // rows g..g+3: v[g + j] = column j (+4, +8, +12) per lane
      v[g] = _mm512_unpacklo_epi64(u[g], u[g + 2]);
      v[g + 1] = _mm512_unpackhi_epi64(u[g], u[g + 2]);
      v[g + 2] = _mm512_unpacklo_epi64(u[g + 1], u[g + 3]);
      v[g + 3] = _mm512_unpackhi_epi64(u[g + 1], u[g + 3]);
    }
    for (int j = 0; j < 4; ++j) {  // rows 0-7 and 8-15 of columns j, j+4, j+8, j+12
      u[2 * j] = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x88);      // cols j, j+8: rows 0-3, 4-7
      u[2 * j + 1] = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xdd);  // cols j+4, j+12
      u[8 + 2 * j] = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x88);
      u[8 + 2 * j + 1] = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xdd);
    }
    std::uint32_t* d = reinterpret_cast<std::uint32_t*>(dst) + c / 2 * 16;
    for (int j = 0; j < 4; ++j) {
      _mm512_store_si512(d + j * 16, _mm512_shuffle_i32x4(u[2 * j], u[8 + 2 * j], 0x88));
      _mm512_store_si512(d + (j + 8) * 16, _mm512_shuffle_i32x4(u[2 * j], u[8 + 2 * j], 0xdd));
      _mm512_store_si512(d + (j + 4) * 16, _mm512_shuffle_i32x4(u[2 * j + 1], u[8 + 2 * j + 1], 0x88));
      _mm512_store_si512(d + (j + 12) * 16, _mm512_shuffle_i32x4(u[2 * j + 1], u[8 + 2 * j + 1], 0xdd));
    }
  }
}

// ---- SiLU(gate) * up into the VNNI blocks ----------------------------------------------------------

// act[s, j] = SiLU(h[s, j]) * h[s, I + j] for the n tokens of one expert and the gate rows
// [r0, r1) of one task (r0 even; r1 even or I), written as bf16 (vcvtne2ps2bf16: round to
// nearest even; denormal results flush to zero) into the expert's VNNI blocks `ap` (block stride
// BA elements; stream_core.h: pack_tokens): 32 columns = 16 words, scattered 64 bytes apart.
// Zeros for the padding tokens of the last block and, when r1 == I, for the columns up to the
// padded width.
void act_rows(const float* h, i64 ldh, i64 I, i64 r0, i64 r1, i64 n, bf16_t* ap, i64 BA) {
  const i64 jend = r1 == I ? up(I, 32) : r1, n16 = (n + 15) / 16 * 16;
  const __m512i q16 = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  for (i64 s = 0; s < n16; ++s) {
    int* blk = reinterpret_cast<int*>(ap + (s / 16) * BA);
    const float* g = h + s * ldh;
    const float* u = g + I;
    for (i64 j0 = r0; j0 < jend; j0 += 32) {
      const i64 nw = (jend - j0) / 2 < 16 ? (jend - j0) / 2 : 16;  // words of this step
      const __mmask16 km = static_cast<__mmask16>((1u << nw) - 1u);
      __m512i words = _mm512_setzero_si512();
      if (s < n) {
        const i64 nv = r1 - j0;  // valid columns from j0 (masked loads: zeros past r1)
        const __mmask16 m0 = nv >= 16 ? __mmask16(0xffff) : nv > 0 ? __mmask16((1u << nv) - 1u) : 0;
        const __mmask16 m1 = nv >= 32 ? __mmask16(0xffff) : nv > 16 ? __mmask16((1u << (nv - 16)) - 1u) : 0;
        const __m512 v0 = silu_mul16(_mm512_maskz_loadu_ps(m0, g + j0), _mm512_maskz_loadu_ps(m0, u + j0));
        const __m512 v1 = silu_mul16(_mm512_maskz_loadu_ps(m1, g + j0 + 16), _mm512_maskz_loadu_ps(m1, u + j0 + 16));
        words = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);  // bf16 of columns j0 .. j0 + 31, in order
      }
      const __m512i idx = _mm512_add_epi32(q16, _mm512_set1_epi32(static_cast<int>(j0 / 2 * 16 + s % 16)));
      _mm512_mask_i32scatter_epi32(blk, km, idx, words, 4);
    }
  }
}


}  // namespace

namespace npu_lora_stream {
float amx_dh_row(const float* h, const float* zp, i64 pstride, i64 P, i64 I, float wr, float* ds,
                 unsigned short* dhn) {
  return dh_row(h, zp, pstride, P, I, wr, ds, dhn);
}
void amx_act_packed(const float* h, i64 ldh, i64 I, i64 r0, i64 r1, i64 n, unsigned short* ap,
                    i64 BA) {
  act_rows(h, ldh, I, r0, r1, n, ap, BA);
}
void amx_pack_tokens(const unsigned short* src, i64 lds, i64 cnt, i64 L, unsigned short* dst) {
  pack_block(src, lds, cnt, L, dst);
}
void amx_dot_bf16n(const unsigned short* w, i64 ldw, i64 L, i64 rows, const unsigned short* x,
                   i64 ldx, i64 n, float* out, i64 ldo) {
  dot_rows(w, ldw, L, rows, x, ldx, n, out, ldo);
}
void amx_axpy_bf16n(const unsigned short* w, i64 ldw, i64 L, i64 rows, const unsigned short* c,
                    i64 ldc, i64 n, float* out, i64 ldo) {
  axpy_rows(w, ldw, L, rows, c, ldc, n, out, ldo);
}
}  // namespace npu_lora_stream
