// AVX2 + FMA instance (e.g. AMD EPYC without AVX-512): 8 fp32 lanes, 16 ymm registers.
// Tiles (accumulators/coefficients + operand registers <= 16): dot 3 rows x 4 tokens
// (12 + 3 + 1; fp32 and bf16 weights), axpy 4 rows x 5 tokens (4 weights + 1 accumulator in
// registers, the 20 coefficients read by the FMAs from the stack). Chosen by interleaved
// measurements on an AVX2 EPYC (experiments/2026-12-02-stream-kernel-v2.md,
// experiments/2026-12-03-axpy-tile.md). The bf16 axpy writes its out rows in unpack
// order (NPU_LORA_AXPY_U16; experiments/2026-12-02-avx2-epyc.md).
#pragma GCC target("avx2,fma,bmi2")
#include <immintrin.h>

namespace {
struct V {
  using reg = __m256;
  static constexpr int W = 8;
  static constexpr int DOT_RB = 3, DOT_NB = 4;
  static constexpr int AXPY_RR = 4, AXPY_NB = 5;
  static constexpr bool AXPY_CF_MEM = true;  // coefficients as FMA memory operands (AxpyCoefs)
  static constexpr int PF_TILES = 2;  // prefetch distance (row tiles)
  // bf16 axpy in unpack order (NPU_LORA_AXPY_U16, stream_isa.h): 16 bf16 -> two fp32 vectors
  static inline reg lo16(const unsigned short* p) {  // columns 0-3, 8-11 of the 16
    return _mm256_castsi256_ps(_mm256_unpacklo_epi16(
        _mm256_setzero_si256(), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static inline reg hi16(const unsigned short* p) {  // columns 4-7, 12-15
    return _mm256_castsi256_ps(_mm256_unpackhi_epi16(
        _mm256_setzero_si256(), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static inline reg zero() { return _mm256_setzero_ps(); }
  static inline reg load(const float* p) { return _mm256_loadu_ps(p); }
  static inline reg load(const unsigned short* p) {  // 8 bf16 -> 8 fp32, natural order
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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

#define NPU_LORA_AXPY_U16 1
#include "stream_isa.h"
NPU_LORA_EXPORT(avx2)
