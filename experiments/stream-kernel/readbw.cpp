// Pure read bandwidth: OpenMP threads sum disjoint slices of a 1 GiB buffer (touched once first),
// AVX2 loads (8 accumulators), best and median of --reps passes. The yardstick next to the
// harness's torch copy figure ("% of copy").
//   g++ -O3 -mavx2 -fopenmp readbw.cpp -o readbw && ./readbw 2 9
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 9;
  const size_t n = (size_t(1) << 30) / sizeof(float);
  float* a = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  omp_set_num_threads(threads);
#pragma omp parallel for
  for (size_t i = 0; i < n; ++i) a[i] = 1.f;
  std::vector<double> gbs;
  float sink = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    {
      const size_t per = n / omp_get_num_threads(), b = per * omp_get_thread_num();
      __m256 s[8];
      for (auto& v : s) v = _mm256_setzero_ps();
      for (size_t i = b; i < b + per; i += 64)
        for (int k = 0; k < 8; ++k) s[k] = _mm256_add_ps(s[k], _mm256_load_ps(a + i + 8 * k));
      for (int k = 1; k < 8; ++k) s[0] = _mm256_add_ps(s[0], s[k]);
      float o[8];
      _mm256_storeu_ps(o, s[0]);
      sink += o[0];
    }
    gbs.push_back(n * sizeof(float) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  printf("read %d thread(s): median %.1f GB/s, best %.1f GB/s (%g)\n", threads, gbs[gbs.size() / 2], gbs.back(), sink);
}
