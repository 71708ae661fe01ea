// 8-bit expert weights, AVX2 + FMA + F16C instance: 8 fp32 lanes, 16 ymm registers.
// Tiles: dot 3 rows x 3 tokens (9 accumulators + 3 weights + 1 x + the e4m3 mask), axpy 2 rows x
// 4 tokens (8 coefficients + 2 weights + 1 accumulator + the mask).
#pragma GCC target("avx2,fma,f16c,bmi2")
#include <immintrin.h>

namespace {
struct Q {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int DOT_RB = 3, DOT_NB = 3;
  static constexpr int AXPY_RR = 2, AXPY_NB = 4;
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
  static inline reg set1(float v) { return _mm256_set1_ps(v); }
  static inline reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  static inline reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static inline float hsum(reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // 8 int8 -> 8 fp32
  static inline reg i8(const signed char* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  // 8 e4m3 -> 8 fp32 / 2^8 (IEEE halves, widened by vcvtph2ps)
  static inline reg e4m3(const signed char* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    __m128i h = _mm_slli_epi16(_mm_cvtepi8_epi16(b), 7);
    h = _mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0xBF80)));
    return _mm256_cvtph_ps(h);
  }
};
}  // namespace

#include "stream_q8_isa.h"
NPU_LORA_Q8_EXPORT(avx2)
