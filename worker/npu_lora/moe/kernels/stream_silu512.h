// AVX-512 elementwise pieces shared by the native bf16 instances (stream_amx.cpp,
// stream_avx512bf16.cpp): e^x, SiLU(g) * u, the forward's activation row and one row of the
// backward's elementwise part. Like stream_tiles.h: internal linkage (anonymous namespace), so
// each file compiles its own copy under its own `#pragma GCC target` (include it after the
// pragma and <immintrin.h>).
#pragma once

namespace {

// e^x for x clamped to [-87.3, 88] (e^-87.3 is the smallest normal float): x = n ln2 + r,
// |r| <= ln2/2, Cephes' degree-6 polynomial for e^r, 2^n by vscalefps. Relative error <= 2e-7
// (tests: the native paths against the widening one). NaN stays NaN through the product below.
static inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.f));
  const __m512 fn = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, fn);
}
// g * sigmoid(g) * u, in the scalar path's order
static inline __m512 silu_mul16(__m512 g, __m512 u) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
  return _mm512_mul_ps(_mm512_mul_ps(g, sg), u);
}

// dst[j] = bf16(SiLU(h[j]) * h[I + j]) for j in [r0, r1) (one token's gate/up pre-activations
// `h`, the forward's activation row `dst`): silu_mul16, then vcvtneps2bf16 (round to nearest even,
// as the scalar f32_to_bf16; denormal results flush to zero)
static inline void act_row(const float* h, long long I, long long r0, long long r1,
                           unsigned short* dst) {
  for (long long j = r0; j < r1; j += 16) {
    const __mmask16 m = r1 - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (r1 - j)) - 1u);
    const __m512 g = _mm512_maskz_loadu_ps(m, h + j), u = _mm512_maskz_loadu_ps(m, h + I + j);
    const __m512 v = silu_mul16(g, u);
    _mm256_mask_storeu_epi16(dst + j, m, (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// One row s of the backward's elementwise part (stream_core.h: backward, Ops::dh_row): z = sum of
// the P partials (in partial order), then dh = [w z u SiLU'(g), w z SiLU(g)] (fp32, and as bf16
// into `dhn` unless it is nullptr: vcvtneps2bf16, round to nearest even) and dw = sum_i SiLU(g) u z,
// 16 lanes summed in a fixed order. Returns dw.
static inline float dh_row(const float* h, const float* zp, long long pstride, long long P,
                           long long I, float wr, float* ds, unsigned short* dhn) {
  const __m512 one = _mm512_set1_ps(1.f), w = _mm512_set1_ps(wr);
  __m512 acc = _mm512_setzero_ps();
  for (long long i = 0; i < I; i += 16) {
    const __mmask16 m = I - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (I - i)) - 1u);
    __m512 z = _mm512_maskz_loadu_ps(m, zp + i);
    for (long long p = 1; p < P; ++p) z = _mm512_add_ps(z, _mm512_maskz_loadu_ps(m, zp + p * pstride + i));
    const __m512 g = _mm512_maskz_loadu_ps(m, h + i), u = _mm512_maskz_loadu_ps(m, h + I + i);
    const __m512 sg = _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    const __m512 silu = _mm512_mul_ps(g, sg);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(silu, u), z));
    const __m512 da = _mm512_mul_ps(z, w);
    // sg * (1 + g * (1 - sg))
    const __m512 dsg = _mm512_mul_ps(sg, _mm512_fmadd_ps(g, _mm512_sub_ps(one, sg), one));
    const __m512 d0 = _mm512_mul_ps(_mm512_mul_ps(da, u), dsg), d1 = _mm512_mul_ps(da, silu);
    _mm512_mask_storeu_ps(ds + i, m, d0);
    _mm512_mask_storeu_ps(ds + I + i, m, d1);
    if (dhn) {  // nullptr: fp32 only (the 8-bit kernels round their coefficients themselves)
      _mm256_mask_storeu_epi16(dhn + i, m, (__m256i)_mm512_cvtneps_pbh(d0));
      _mm256_mask_storeu_epi16(dhn + I + i, m, (__m256i)_mm512_cvtneps_pbh(d1));
    }
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace
