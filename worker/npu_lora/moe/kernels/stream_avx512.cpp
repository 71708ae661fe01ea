// AVX-512 (F/BW/VL/DQ + FMA) instance of the streaming micro-kernels: 16 fp32 lanes, bf16
// widened in registers (vpmovzxwd + shift). 32 zmm: dot 4 rows x 6 tokens (24 accumulators),
// axpy 8 tokens x 2 vectors (16 accumulators); bf16 weights: even/odd split (dot 4 x 5).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,bmi2")
#include <immintrin.h>

namespace {
struct V {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int DOT_RB = 4, DOT_NB = 6, AXPY_CV = 2, AXPY_NB = 8;
  static constexpr bool PAIRED = true;
  static constexpr int DOT16_RB = 4, DOT16_NB = 5;  // 20 acc + 8 weight + 2 x registers
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg loadf(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg load(const unsigned short* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static inline void load2(const unsigned short* p, reg& even, reg& odd) {
    __m512i v = _mm512_loadu_si512(p);
    even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static inline reg set1(float v) { return _mm512_set1_ps(v); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static inline float hsum(reg v) { return _mm512_reduce_add_ps(v); }
};
}  // namespace

#include "stream_isa.h"
NPU_LORA_EXPORT(avx512)
