// AVX-512 (F/BW/VL/DQ + FMA) instance: 16 fp32 lanes, 32 zmm registers.
// Tiles: dot 4 rows x 6 tokens (24 + 4 + 1; fp32 and bf16 weights),
// axpy 4 rows x 6 tokens (24 coefficients + 4 weights + 1 accumulator).
// Not timed since the v2 kernels (no AVX-512 machine in that session); the shapes follow the
// AVX2 measurements scaled to 32 registers, and the code paths are the generic ones the AVX2 and
// baseline instances run (tests on an AVX-512 CPU run this instance).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,bmi2")
#include <immintrin.h>

namespace {
struct V {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int DOT_RB = 4, DOT_NB = 6;
  static constexpr int AXPY_RR = 4, AXPY_NB = 6;
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

#include "stream_isa.h"
NPU_LORA_EXPORT(avx512)
