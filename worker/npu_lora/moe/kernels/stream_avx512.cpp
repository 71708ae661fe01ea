// AVX-512 (F/BW/VL/DQ + FMA) instance: 16 fp32 lanes, 32 zmm registers.
// Tiles and traits: stream_avx512_v.h.
// The shapes follow the AVX2 measurements scaled to 32 registers; timed on a Zen 4
// (experiments/2026-12-02-zen4-native-bf16.md: fp32 at T=128 streams 21-24 GB/s on 2 threads).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,avx2,bmi2")
#include <immintrin.h>

#include "stream_avx512_v.h"

#include "stream_isa.h"
NPU_LORA_EXPORT(avx512)
