// 8-bit expert weights, AVX-512 (F/BW/VL/DQ + FMA + F16C) instance: 16 fp32 lanes, 32 zmm
// registers. Also what the avx512bf16 and amx paths run for 8-bit weights (the bytes are widened
// to fp32 in registers; the operands stay fp32). Tiles: dot 4 rows x 6 tokens (24 accumulators
// + 4 weights + 1 x), axpy 4 rows x 4 tokens (16 coefficients + 4 weights + 1 accumulator).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c,avx2,bmi2")
#include <immintrin.h>

namespace {
struct Q {
  using reg = __m512;
  static constexpr int W = 16;
  static constexpr int DOT_RB = 4, DOT_NB = 6;
  static constexpr int AXPY_RR = 4, AXPY_NB = 4;
  static inline reg zero() { return _mm512_setzero_ps(); }
  static inline reg load(const float* p) { return _mm512_loadu_ps(p); }
  static inline reg set1(float v) { return _mm512_set1_ps(v); }
  static inline reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  static inline reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static inline void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static inline float hsum(reg v) { return _mm512_reduce_add_ps(v); }
  // 16 int8 -> 16 fp32
  static inline reg i8(const signed char* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  // 16 e4m3 -> 16 fp32 / 2^8 (as IEEE halves: sign to bit 15, exponent+mantissa to bits 13..7)
  static inline reg e4m3(const signed char* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    __m256i h = _mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7);
    h = _mm256_and_si256(h, _mm256_set1_epi16(static_cast<short>(0xBF80)));
    return _mm512_cvtph_ps(h);
  }
};
}  // namespace

#include "stream_q8_isa.h"
NPU_LORA_Q8_EXPORT(avx512)
