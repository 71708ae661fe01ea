// Stand-alone benchmark of the npu_lora_stream core (worker/npu_lora/moe/kernels/stream_core.h),
// no torch: one MoE layer's experts (default Qwen3-30B-A3B widths E=128, top-8, H=2048, I=768),
// random weights (std 0.02, bf16 = the rounding of the same draws), uniform top-K routing,
// forward and backward timed separately, medians of --reps after one warm-up, OpenMP threads.
//
//   g++ -O3 -fno-math-errno -fopenmp -std=c++17 -I../../worker/npu_lora/moe/kernels \
//       bench.cpp ../../worker/npu_lora/moe/kernels/stream_{amx,avx2,avx512,avx512bf16,base}.cpp -o stream-bench
//   ./stream-bench --T 128 --dtype bf16 --threads 2 --isa 1 --reps 7   (isa: 0 base, 1 avx2,
//   2 avx512, 3 avx512bf16 = native bf16 dot products, 4 amx = AMX tiles; --woff 64 places the
//   weights 64 bytes past a 4 KiB boundary as torch's large tensors sit, default: std::vector,
//   16 bytes off a cache line here)
//
// GB/s = hit experts' weight bytes / time (what the kernel must stream once per direction).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <ctime>
#include <vector>

#include "stream_core.h"

using namespace npu_lora_stream;

struct OmpPar {
  template <class F>
  void run(F&& f) const {
#pragma omp parallel
    f();
  }
};

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// CPU seconds of the whole process (all threads): robust to time slices lost to other tenants on
// a shared host (run with OMP_WAIT_POLICY=passive so that waiting threads do not spin)
static double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int main(int argc, char** argv) {
  i64 T = 128, E = 128, K = 8, H = 2048, I = 768;
  int reps = 5, threads = 0, isa = kAvx2;
  i64 gu_block = 64, down_block = 256, splits = 2;  // as stream.py: GU_BLOCK, DOWN_BLOCK, BWD_SPLITS
  std::string dt = "fp32";
  long woff = -1;  // --woff B: weights B bytes past a 4 KiB boundary (torch: 64); default: std::vector
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--T") T = atoll(v.c_str());
    else if (k == "--dtype") dt = v;
    else if (k == "--reps") reps = atoi(v.c_str());
    else if (k == "--threads") threads = atoi(v.c_str());
    else if (k == "--isa") isa = atoi(v.c_str());
    else if (k == "--E") E = atoll(v.c_str());
    else if (k == "--K") K = atoll(v.c_str());
    else if (k == "--H") H = atoll(v.c_str());
    else if (k == "--I") I = atoll(v.c_str());
    else if (k == "--gu-block") gu_block = atoll(v.c_str());
    else if (k == "--down-block") down_block = atoll(v.c_str());
    else if (k == "--bwd-splits") splits = atoll(v.c_str());
    else if (k == "--woff") woff = atol(v.c_str());
    else { fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  if (threads) omp_set_num_threads(threads);
  const bool B = dt == "bf16";
  const i64 S = T * K;
  std::mt19937 rng(0);
  std::vector<i64> ids(S);
  for (i64 t = 0; t < T; t++) {
    std::vector<i64> p(E);
    for (i64 e = 0; e < E; e++) p[e] = e;
    std::shuffle(p.begin(), p.end(), rng);
    for (i64 k = 0; k < K; k++) ids[t * K + k] = p[k];
  }
  std::vector<int64_t> inv(S), tok(S);
  std::vector<i64> off(E + 1, 0);
  for (i64 s = 0; s < S; s++) off[ids[s] + 1]++;
  for (i64 e = 0; e < E; e++) off[e + 1] += off[e];
  {
    std::vector<i64> pos(off.begin(), off.end() - 1);
    for (i64 s = 0; s < S; s++) {
      const i64 q = pos[ids[s]]++;
      inv[s] = q;
      tok[q] = s / K;
    }
  }
  const size_t ngu = E * 2 * I * H, nd = E * H * I;
  std::vector<float> gu32v(B || woff >= 0 ? 0 : ngu), d32v(B || woff >= 0 ? 0 : nd);
  std::vector<bf16_t> gu16v(!B || woff >= 0 ? 0 : ngu), d16v(!B || woff >= 0 ? 0 : nd);
  auto placed = [&](size_t bytes) {  // woff bytes past a 4 KiB boundary
    return static_cast<char*>(std::aligned_alloc(4096, (bytes + woff + 4095) / 4096 * 4096)) + woff;
  };
  float* gu32 = B ? nullptr : woff >= 0 ? reinterpret_cast<float*>(placed(ngu * 4)) : gu32v.data();
  float* d32 = B ? nullptr : woff >= 0 ? reinterpret_cast<float*>(placed(nd * 4)) : d32v.data();
  bf16_t* gu16 = !B ? nullptr : woff >= 0 ? reinterpret_cast<bf16_t*>(placed(ngu * 2)) : gu16v.data();
  bf16_t* d16 = !B ? nullptr : woff >= 0 ? reinterpret_cast<bf16_t*>(placed(nd * 2)) : d16v.data();
  std::normal_distribution<float> nd01(0, 0.02f);
  for (size_t i = 0; i < ngu; i++) {
    const float v = nd01(rng);
    if (B) gu16[i] = f32_to_bf16(v);
    else gu32[i] = v;
  }
  for (size_t i = 0; i < nd; i++) {
    const float v = nd01(rng);
    if (B) d16[i] = f32_to_bf16(v);
    else d32[i] = v;
  }
  std::vector<float> xs(T * H), gs(T * H), wr(S, 1.f / K), out(T * H), h(S * 2 * I), dx(T * H),
      dw(S), dh(S * 2 * I);
  std::vector<bf16_t> xs16(T * H), gs16(T * H);
  for (i64 i = 0; i < T * H; i++) {
    xs[i] = nd01(rng) * 50;
    gs[i] = nd01(rng) * 50;
    xs16[i] = f32_to_bf16(xs[i]);
    gs16[i] = f32_to_bf16(gs[i]);
  }
  const Weights gu{B ? (const void*)gu16 : (const void*)gu32, B, 2 * I, H};
  const Weights dn{B ? (const void*)d16 : (const void*)d32, B, H, I};
  RoutedArgs routed;
  routed.token_idx = tok.data();
  routed.wr = wr.data();
  routed.off = off;
  routed.gu = gu;
  routed.dn = dn;
  routed.inv = inv.data();
  routed.T = T;
  routed.K = K;
  ForwardArgs fa;
  static_cast<RoutedArgs&>(fa) = routed;
  fa.hs = B ? (const void*)xs16.data() : (const void*)xs.data();
  fa.hs_bf16 = B;
  fa.gu_block = gu_block;
  fa.down_block = down_block;
  fa.out = out.data();
  fa.h = h.data();
  BackwardArgs ba;
  static_cast<RoutedArgs&>(ba) = routed;
  ba.g = B ? (const void*)gs16.data() : (const void*)gs.data();
  ba.g_bf16 = B;
  ba.h = h.data();
  ba.down_split = (H + splits - 1) / splits;
  ba.gu_split = (2 * I + splits - 1) / splits;
  ba.dx = dx.data();
  ba.dw = dw.data();
  ba.dh = dh.data();
  if (isa == kAmx && !amx_request()) { fprintf(stderr, "no AMX here\n"); return 2; }
  const Ops o = ops_for(isa);
  const OmpPar par;
  i64 hit = 0;
  for (i64 e = 0; e < E; e++) hit += off[e + 1] > off[e];
  const double bytes = double(hit) * 3 * H * I * (B ? 2 : 4);
  double pf[4] = {0}, pb[5] = {0};
  std::vector<double> tf, tb, cf, cb;
  for (int r = 0; r <= reps; r++) {
    const double c0 = cpu_now(), t0 = now();
    forward(par, o, fa);
    const double c1 = cpu_now(), t1 = now();
    backward(par, o, ba);
    const double c2 = cpu_now(), t2 = now();
    if (r == 0) fa.phase_s = pf, ba.phase_s = pb;  // phases of the measured reps
    if (r) {
      tf.push_back(t1 - t0);
      tb.push_back(t2 - t1);
      cf.push_back(c1 - c0);
      cb.push_back(c2 - c1);
    }
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tb.begin(), tb.end());
  std::sort(cf.begin(), cf.end());
  std::sort(cb.begin(), cb.end());
  const double f = tf[tf.size() / 2], b = tb[tb.size() / 2];
  printf("T=%lld %s isa=%d threads=%d: fwd %.1f ms %.2f GB/s | bwd %.1f ms %.2f GB/s\n", T,
         dt.c_str(), isa, omp_get_max_threads(), f * 1e3, bytes / f / 1e9, b * 1e3, bytes / b / 1e9);
  printf("  CPU ms (all threads, median): fwd %.1f | bwd %.1f\n", cf[cf.size() / 2] * 1e3,
         cb[cb.size() / 2] * 1e3);
  printf("  mean phase ms: fwd gather %.1f gate/up %.1f down %.1f combine %.1f | bwd gather %.1f "
         "z %.1f dh %.1f dx %.1f combine %.1f\n", pf[0] * 1e3 / reps, pf[1] * 1e3 / reps,
         pf[2] * 1e3 / reps, pf[3] * 1e3 / reps, pb[0] * 1e3 / reps, pb[1] * 1e3 / reps,
         pb[2] * 1e3 / reps, pb[3] * 1e3 / reps, pb[4] * 1e3 / reps);
}
