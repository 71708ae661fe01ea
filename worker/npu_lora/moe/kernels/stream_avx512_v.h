// AVX-512 (F/BW/VL/DQ + FMA) vector traits for stream_isa.h: 16 fp32 lanes, 32 zmm registers.
// Tiles: dot 4 rows x 6 tokens (24 + 4 + 1; fp32 and bf16 weights), axpy 4 rows x 6 tokens (24
// coefficients + 4 weights + 1 accumulator). Shared by stream_avx512.cpp (which exports the
// kernels) and stream_avx512bf16.cpp (which uses stream_isa.h's tile loops for its native
// kernels); include after `#pragma GCC target(...)` and <immintrin.h>.
#pragma once

namespace {
struct V {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int DOT_RB = 4, DOT_NB = 6;
  static constexpr int AXPY_RR = 4, AXPY_NB = 6;
  static constexpr bool AXPY_CF_MEM = false;
  static constexpr int PF_TILES = 2;
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg load(const unsigned short* p) {  // 16 bf16 -> 16 fp32, natural order
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static inline reg set1(float v) { return _mm512_set1_ps(v); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static inline float hsum(reg v) { return _mm512_reduce_add_ps(v); }
};
}  // namespace
