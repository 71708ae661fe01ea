// Stand-alone micro-benchmark of the 8-bit bf16-operand micro-kernels (stream_q8_avx512bf16.cpp)
// against the bf16 native ones (stream_avx512bf16.cpp), no torch, no drivers: E experts at
// Qwen3-30B-A3B widths, n tokens each, the four weight passes of a layer (gate/up and down dot,
// down and gate/up axpy), OpenMP threads over the experts. Times are medians of --reps.
//
//   g++ -O3 -fno-math-errno -fopenmp -std=c++17 -I../../worker/npu_lora/moe/kernels q8n_micro.cpp \
//       ../../worker/npu_lora/moe/kernels/stream_q8_avx512bf16.cpp \
//       ../../worker/npu_lora/moe/kernels/stream_avx512bf16.cpp -o q8n-micro
//   ./q8n-micro [E] [n] [reps] [mask]
//
// mask (default 15, all four): the passes timed, 1 gate/up dot + 2 down dot (reported as
// "fwd"), 4 down axpy + 8 gate/up axpy ("bwd"); one at a time gives each matrix's rate. The
// tokens' rows are padded by 32 bf16 words, as the driver's (`padded_ld`), so no two rows share
// a 4 KiB stride.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

using i64 = long long;
typedef unsigned short bf16_t;
namespace npu_lora_stream {
void avx512bf16_dot_bf16n(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64);
void avx512bf16_axpy_bf16n(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64);
void avx512bf16_q8_dotn(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64, bool,
                        const unsigned short*, i64, i64, float*, i64);
void avx512bf16_q8_axpyn(const signed char*, i64, i64, i64, i64, const float*, i64, i64, i64,
                         bool, const float*, i64, i64, float*, i64);
// stream_base.cpp's (torch-side) switch, which the bf16 axpy reads: its default
long long blocked_tokens() { return 32; }
}  // namespace npu_lora_stream
using namespace npu_lora_stream;

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  const i64 E = argc > 1 ? std::atoll(argv[1]) : 128, n = argc > 2 ? std::atoll(argv[2]) : 8;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  const int pass0 = argc > 4 ? std::atoi(argv[4]) : 15;
  const i64 H = 2048, I = 768;
  std::mt19937 rng(0);
  std::vector<bf16_t> gu16(E * 2 * I * H), dn16(E * H * I);
  std::vector<signed char> gu8(E * 2 * I * H), dn8(E * H * I);
  for (auto& v : gu16) v = 0x3c00 | (rng() & 0x7f) | ((rng() & 1) << 15);
  for (auto& v : dn16) v = 0x3c00 | (rng() & 0x7f) | ((rng() & 1) << 15);
  for (auto& v : gu8) v = static_cast<signed char>((rng() % 255) - 127);
  for (auto& v : dn8) v = static_cast<signed char>((rng() % 255) - 127);
  // scales: int8 per row; fp8 128 x 128 blocks
  std::vector<float> s_gu_row(E * 2 * I, 0.001f), s_dn_row(E * H, 0.001f);
  std::vector<float> s_gu_blk(E * (2 * I / 128) * (H / 128), 0.001f);
  std::vector<float> s_dn_blk(E * (H / 128) * (I / 128), 0.001f);
  const i64 LXp = H + 32, LAp = I + 32;
  std::vector<bf16_t> x(n * LXp), a(n * LAp), g(n * H), dh(n * 2 * I);
  std::vector<float> gf(n * H), dhf(n * 2 * I);
  for (auto& v : x) v = 0x3f80;
  for (auto& v : a) v = 0x3f80;
  for (auto& v : g) v = 0x3f80;
  for (auto& v : dh) v = 0x3f80;
  for (auto& v : gf) v = 1.f;
  for (auto& v : dhf) v = 1.f;
  const int nt = omp_get_max_threads();
  std::vector<std::vector<float>> outs(nt, std::vector<float>(n * 2 * H + 64));
  // variant: 0 bf16, 1 int8, 2 fp8 (block); pass 0 fwd (gu dot + dn dot), 1 bwd (dn axpy + gu axpy)
  auto run = [&](int var, int pass) {
#pragma omp parallel for schedule(dynamic, 1)
    for (i64 e = 0; e < E; ++e) {
      float* o = outs[omp_get_thread_num()].data();
      if (var == 0) {
        if (pass == 0) {
          if (pass0 & 1) avx512bf16_dot_bf16n(gu16.data() + e * 2 * I * H, H, H, 2 * I, x.data(), LXp, n, o, 2 * I);
          if (pass0 & 2) avx512bf16_dot_bf16n(dn16.data() + e * H * I, I, I, H, a.data(), LAp, n, o, H);
        } else {
          if (pass0 & 4) avx512bf16_axpy_bf16n(dn16.data() + e * H * I, I, I, H, g.data(), H, n, o, I);
          if (pass0 & 8) avx512bf16_axpy_bf16n(gu16.data() + e * 2 * I * H, H, H, 2 * I, dh.data(), 2 * I, n, o, H);
        }
      } else {
        const bool fp8 = var == 2;
        const float* sg = fp8 ? s_gu_blk.data() + e * (2 * I / 128) * (H / 128) : s_gu_row.data() + e * 2 * I;
        const float* sd = fp8 ? s_dn_blk.data() + e * (H / 128) * (I / 128) : s_dn_row.data() + e * H;
        const i64 BR = fp8 ? 128 : 1, BCg = fp8 ? 128 : H, BCd = fp8 ? 128 : I;
        const i64 lg = fp8 ? H / 128 : 1, ld = fp8 ? I / 128 : 1;
        if (pass == 0) {
          if (pass0 & 1) avx512bf16_q8_dotn(gu8.data() + e * 2 * I * H, H, H, 0, 2 * I, sg, lg, BR, BCg, fp8,
                             x.data(), LXp, n, o, 2 * I);
          if (pass0 & 2) avx512bf16_q8_dotn(dn8.data() + e * H * I, I, I, 0, H, sd, ld, BR, BCd, fp8, a.data(),
                             LAp, n, o, H);
        } else {
          if (pass0 & 4) avx512bf16_q8_axpyn(dn8.data() + e * H * I, I, I, 0, H, sd, ld, BR, BCd, fp8, gf.data(),
                              H, n, o, I);
          if (pass0 & 8) avx512bf16_q8_axpyn(gu8.data() + e * 2 * I * H, H, H, 0, 2 * I, sg, lg, BR, BCg, fp8,
                              dhf.data(), 2 * I, n, o, H);
        }
      }
    }
  };
  const char* names[] = {"bf16", "int8", "fp8"};
  std::vector<double> t[3][2];
  for (int r = 0; r <= reps; ++r)
    for (int k = 0; k < 3; ++k) {
      const int v = (k + r) % 3;
      for (int p = 0; p < 2; ++p) {
        const double t0 = now();
        run(v, p);
        if (r) t[v][p].push_back(now() - t0);
      }
    }
  const double wbytes = static_cast<double>(E) * 3 * H * I;
  for (int v = 0; v < 3; ++v) {
    double m[2];
    for (int p = 0; p < 2; ++p) {
      std::sort(t[v][p].begin(), t[v][p].end());
      m[p] = t[v][p][t[v][p].size() / 2];
    }
    const double b = wbytes * (v == 0 ? 2 : 1);
    std::printf("%s n=%lld threads=%d: fwd %.1f ms (%.1f GB/s) bwd %.1f ms (%.1f GB/s)\n", names[v], n,
                nt, m[0] * 1e3, b / m[0] / 1e9, m[1] * 1e3, b / m[1] / 1e9);
  }
  return 0;
}
