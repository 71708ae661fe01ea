// The `vdpbf16ps` ceiling of this CPU: every OpenMP thread runs 16 independent zmm accumulators
// through `vdpbf16ps` from registers (no loads), best of 5; prints instructions/s and bf16
// multiply-adds/s (32 an instruction). The floor of any kernel that multiplies bf16 operands
// with it (experiments/2026-12-05-q8-floor.md).
//
//   g++ -O2 -fopenmp vdpbf16ps_peak.cpp -o vdpbf16ps-peak && OMP_NUM_THREADS=2 ./vdpbf16ps-peak
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>

#pragma GCC target("avx512f,avx512bf16,avx512bw")
int main() {
  const long iters = 200000000;  // instructions a thread
  double best = 1e9;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
      __m512 acc[16];
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
      __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3c00);
      for (long k = 0; k < iters / 16; ++k) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
        __asm__ volatile("" : "+v"(a), "+v"(b));  // keep the loop from being folded
      }
      __m512 s = acc[0];
      for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
      sink += _mm512_reduce_add_ps(s);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt < best) best = dt;
    if (sink == 1.2345f) std::printf("-");
  }
  const int nt = omp_get_max_threads();
  std::printf("threads %d: %.1f G vdpbf16ps/s, %.1f GMAC/s\n", nt, nt * iters / best / 1e9,
              nt * iters * 32.0 / best / 1e9);
  return 0;
}
