// in-cache throughput of the AVX2 micro-kernels (1 thread): weights rows x L resident in L2,
// n tokens; GFLOP/s = 2 * rows * L * n / time
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
using i64 = long long;
namespace npu_lora_stream {
void avx2_dot_f32(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);
void avx2_dot_bf16f(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
void avx2_axpy_f32(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);
void avx2_axpy_bf16(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
}
using namespace npu_lora_stream;
template <int RR, int NB> void axpy_pu(const unsigned short*, i64, i64, i64, const float*, i64, i64, float*, i64);
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char** argv) {
  i64 rows = atoll(argv[1]), L = atoll(argv[2]), n = atoll(argv[3]); int reps = atoi(argv[4]);
  i64 ldw = L + 32, ldx = L + 16, ldo = rows + 16, ldc = rows + 16, ldo2 = L + 16;
  std::vector<float> w32(rows * ldw), x(n * ldx), out(n * ldo > n * ldo2 ? n * ldo : n * ldo2), coef(n * ldc);
  std::vector<unsigned short> w16(rows * ldw);
  for (i64 i = 0; i < rows * ldw; i++) { w32[i] = (i % 7) * 0.01f; w16[i] = 0x3c00 + (i % 5); }
  for (auto& v : x) v = 0.5f; for (auto& v : coef) v = 0.25f;
  const double fl = 2.0 * rows * L * n;
  auto run = [&](const char* name, auto f) {
    f(); double best = 1e9;
    for (int k = 0; k < 5; k++) { double t0 = now(); for (int r = 0; r < reps; r++) f(); best = std::min(best, (now() - t0) / reps); }
    printf("%-10s %7.1f GFLOP/s (%.1f us)\n", name, fl / best / 1e9, best * 1e6);
  };
  run("dot_f32", [&] { avx2_dot_f32(w32.data(), ldw, L, rows, x.data(), ldx, n, out.data(), ldo); });
  run("dot_bf16", [&] { avx2_dot_bf16f(w16.data(), ldw, L, rows, x.data(), ldx, n, out.data(), ldo); });
  run("axpy_f32", [&] { avx2_axpy_f32(w32.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
  run("axpy_bf16", [&] { avx2_axpy_bf16(w16.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
  run("pu_3x4", [&] { axpy_pu<3, 4>(w16.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
  run("pu_2x4", [&] { axpy_pu<2, 4>(w16.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
  run("pu_4x2", [&] { axpy_pu<4, 2>(w16.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
  run("pu_4x3", [&] { axpy_pu<4, 3>(w16.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
  run("axpy_bf16", [&] { avx2_axpy_bf16(w16.data(), ldw, L, rows, coef.data(), ldc, n, out.data(), ldo2); });
}
