// Baseline x86-64 / any-architecture instance: one fp32 lane per "register" (the compiler may
// still vectorise with the baseline ISA, e.g. SSE2). Used where neither AVX2 nor AVX-512 exists.
namespace {
struct V {
  using reg = float;
  static constexpr int W = 1;
  static constexpr int DOT_RB = 2, DOT_NB = 4;
  static constexpr int AXPY_RR = 2, AXPY_NB = 4;
  static constexpr bool AXPY_CF_MEM = false;
  static constexpr int PF_TILES = 2;
  static inline float bits(unsigned short v) {
    unsigned int u = static_cast<unsigned int>(v) << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
  }
  static inline reg zero() { return 0.f; }
  static inline reg load(const float* p) { return *p; }
  static inline reg load(const unsigned short* p) { return bits(*p); }
  static inline reg set1(float v) { return v; }
  static inline reg fma(reg a, reg b, reg c) { return a * b + c; }
  static inline void store(float* p, reg v) { *p = v; }
  static inline float hsum(reg v) { return v; }
};
}  // namespace

#include "stream_isa.h"
NPU_LORA_EXPORT(base)

// Rows an expert from which the native bf16 backward axpy switches to its blocked form
// (stream_avx512bf16.cpp: axpyn_blocked; bitwise the streaming kernel's results), read once per
// process: NPU_LORA_STREAM_BLOCK_TOKENS (0 = never), default 10. Measured on a 2-core Zen 4 with
// the panel prefetch (experiments/2026-12-05-bwd-tune.md): blocked / streaming CPU time 0.77-0.85x
// at 10 rows an expert, 0.68-0.75x at 16, about 1.0-1.08x at 8 (the streaming kernels keep
// T <= 128 at Qwen3's ~8 rows an expert).
#include <cstdlib>
namespace npu_lora_stream {
long long blocked_tokens() {
  static const long long v = [] {
    const char* s = std::getenv("NPU_LORA_STREAM_BLOCK_TOKENS");
    if (!s || !*s) return 10LL;
    const long long n = std::strtoll(s, nullptr, 10);
    return n > 0 ? n : 0LL;
  }();
  return v;
}
}  // namespace npu_lora_stream
