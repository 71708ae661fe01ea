// 8-bit expert weights, baseline instance (any CPU): one fp32 lane per "register", the bytes
// dequantised by the scalar conversions of stream_q8_isa.h.
namespace {
struct Q {
  using reg = float;
  static constexpr int W = 1;
  static constexpr int DOT_RB = 2, DOT_NB = 4;
  static constexpr int AXPY_RR = 2, AXPY_NB = 4;
  static inline reg zero() { return 0.f; }
  static inline reg load(const float* p) { return *p; }
  static inline reg set1(float v) { return v; }
  static inline reg mul(reg a, reg b) { return a * b; }
  static inline reg fma(reg a, reg b, reg c) { return a * b + c; }
  static inline void store(float* p, reg v) { *p = v; }
  static inline float hsum(reg v) { return v; }
  static inline reg i8(const signed char* p);
  static inline reg e4m3(const signed char* p);
};
}  // namespace

#include "stream_q8_isa.h"

namespace {
inline float Q::i8(const signed char* p) { return static_cast<float>(*p); }
inline float Q::e4m3(const signed char* p) { return e4m3_scalar(static_cast<unsigned char>(*p)); }
}  // namespace
NPU_LORA_Q8_EXPORT(base)
