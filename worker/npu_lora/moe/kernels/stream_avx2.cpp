// AVX2 + FMA instance (e.g. AMD EPYC without AVX-512): 8 fp32 lanes, bf16 widened in registers.
// 16 ymm: dot 3 rows x 4 tokens (12 accumulators), axpy 4 tokens x 2 vectors (8 accumulators).
#pragma GCC target("avx2,fma,bmi2")
#include <immintrin.h>

namespace {
struct V {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int DOT_RB = 3, DOT_NB = 4, AXPY_CV = 2, AXPY_NB = 4;
  static constexpr bool PAIRED = true;
  static constexpr int DOT16_RB = 2, DOT16_NB = 4;  // 8 acc + 4 weight + 2 x registers
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
  static inline reg loadf(const float* p) { return _mm256_loadu_ps(p); }
  static inline reg load(const unsigned short* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static inline void load2(const unsigned short* p, reg& even, reg& odd) {
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  static inline reg set1(float v) { return _mm256_set1_ps(v); }
  static inline reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static inline float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
}  // namespace

#include "stream_isa.h"
NPU_LORA_EXPORT(avx2)
