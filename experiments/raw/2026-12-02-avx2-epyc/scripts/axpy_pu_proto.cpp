// prototype: AVX2 bf16 axpy with unpack widening (1 shuffle uop per 8 weights) and the out rows in
// "unpack order" per 16 columns ([c0-3, c8-11], [c4-7, c12-15]); timing only
#pragma GCC target("avx2,fma")
#include <immintrin.h>
using i64 = long long;
template <int RR, int NB>
static inline void tile(const unsigned short* w, i64 ldw, i64 L, const float* coef, i64 ldc, float* out, i64 ldo, bool first) {
  __m256 cf[NB][RR];
  for (int t = 0; t < NB; ++t) for (int j = 0; j < RR; ++j) cf[t][j] = _mm256_set1_ps(coef[t * ldc + j]);
  const __m256i z = _mm256_setzero_si256();
  for (i64 c = 0; c + 16 <= L; c += 16) {
    __m256 wv[RR];
#pragma GCC unroll 8
    for (int j = 0; j < RR; ++j) wv[j] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, _mm256_loadu_si256((const __m256i*)(w + j * ldw + c))));
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) {
      __m256 acc = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + t * ldo + c);
#pragma GCC unroll 8
      for (int j = 0; j < RR; ++j) acc = _mm256_fmadd_ps(cf[t][j], wv[j], acc);
      _mm256_storeu_ps(out + t * ldo + c, acc);
    }
#pragma GCC unroll 8
    for (int j = 0; j < RR; ++j) wv[j] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, _mm256_loadu_si256((const __m256i*)(w + j * ldw + c))));
#pragma GCC unroll 8
    for (int t = 0; t < NB; ++t) {
      __m256 acc = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + t * ldo + c + 8);
#pragma GCC unroll 8
      for (int j = 0; j < RR; ++j) acc = _mm256_fmadd_ps(cf[t][j], wv[j], acc);
      _mm256_storeu_ps(out + t * ldo + c + 8, acc);
    }
  }
}
template <int RR, int NB>
void axpy_pu(const unsigned short* w, i64 ldw, i64 L, i64 R, const float* coef, i64 ldc, i64 n, float* out, i64 ldo) {
  for (i64 r = 0; r + RR <= R; r += RR)
    for (i64 t0 = 0; t0 + NB <= n; t0 += NB)
      tile<RR, NB>(w + r * ldw, ldw, L, coef + t0 * ldc + r, ldc, out + t0 * ldo, ldo, r == 0);
}
template void axpy_pu<3, 4>(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
template void axpy_pu<3, 3>(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
template void axpy_pu<2, 4>(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
template void axpy_pu<4, 2>(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
template void axpy_pu<4, 3>(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
