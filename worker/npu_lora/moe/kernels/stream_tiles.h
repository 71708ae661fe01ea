// Token tiles and compile-time widths, shared by every micro-kernel file (stream_isa.h,
// stream_q8_isa.h, stream_q8_avx512bf16.cpp). Like them: no standard-library header and internal
// linkage (anonymous namespace), so each ISA's translation unit compiles its own copy for its
// target and the linker can never pick one ISA's code for another.
#pragma once

namespace {

template <int N>
struct IntC {
  static constexpr int value = N;
};

// Balanced token tiles: n tokens in ceil(n / NBM) tiles of floor/ceil sizes (each <= NBM).
// `body(k, t0, m)` runs tile k (tokens [t0, t0 + m)); the sizes depend on n only, never on the
// thread count, so the summation order of every output is fixed by the shapes.
template <int NBM, class F>
static inline void token_tiles(long long n, F body) {
  const long long tiles = (n + NBM - 1) / NBM;
  long long t0 = 0;
  for (long long k = 0; k < tiles; ++k) {
    const long long m = (n - t0) / (tiles - k);
    body(k, t0, m);
    t0 += m;
  }
}

// f(IntC<m>{}) for a run-time token-tile width m in [1, NBM] (NBM <= 16).
template <int NBM, class F>
static inline void with_width(long long m, F f) {
  static_assert(NBM >= 1 && NBM <= 16, "with_width dispatches widths 1..16");
  switch (m) {
#define NPU_LORA_T(mm)                       \
  case mm:                                   \
    if constexpr (mm <= NBM) f(IntC<mm>{});  \
    break;
    NPU_LORA_T(1) NPU_LORA_T(2) NPU_LORA_T(3) NPU_LORA_T(4) NPU_LORA_T(5) NPU_LORA_T(6)
    NPU_LORA_T(7) NPU_LORA_T(8) NPU_LORA_T(9) NPU_LORA_T(10) NPU_LORA_T(11) NPU_LORA_T(12)
    NPU_LORA_T(13) NPU_LORA_T(14) NPU_LORA_T(15) NPU_LORA_T(16)
#undef NPU_LORA_T
    default: break;
  }
}

}  // namespace
