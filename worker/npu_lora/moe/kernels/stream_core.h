// npu_lora streaming MoE experts: the forward and backward drivers, free of torch.
//
// Legend: T tokens, K slots per token, S = T*K (token, slot) rows sorted by expert ("expert
// order"), E experts, H hidden, I intermediate. Weights as transformers stores them: Wgu
// [E, 2I, H] (gate rows, then up rows) and Wd [E, H, I], fp32 or bf16 (raw 16-bit words).
//
// Used by stream.cpp (torch bindings, threads from at::parallel_for) and by the stand-alone
// benchmark experiments/stream-kernel/bench.cpp (OpenMP threads), so what is timed there is
// what runs here.
//
// Threads: each phase is a list of (hit expert, row block) tasks that depends on the shapes and
// the routing only; threads take tasks from a shared counter (largest first), every output
// element is written by exactly one task and partial sums are reduced in a fixed order, so
// results are bitwise identical across runs and thread counts.
//
// Numerics: fp32 weights -> fp32 operands; bf16 weights -> bf16 operands (the hidden states and
// the SiLU·mul activations rounded to bf16, as a bf16 model holds them, but held as fp32 floats)
// with fp32 accumulation; pre-activations h, gradients and every reduction stay fp32. The bf16
// path runs the fp32 tiles with the weights widened in registers, so its result is bitwise the
// fp32 path's on the bf16-rounded weights and activations.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace npu_lora_stream {

using i64 = long long;
typedef unsigned short bf16_t;

#define NPU_LORA_DECL(isa)                                                                        \
  void isa##_dot_f32(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);           \
  void isa##_dot_bf16f(const bf16_t*, i64, i64, i64, const float*, i64, i64, float*, i64);        \
  void isa##_axpy_f32(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);          \
  void isa##_axpy_bf16(const bf16_t*, i64, i64, i64, const float*, i64, i64, float*, i64);
NPU_LORA_DECL(base)
NPU_LORA_DECL(avx2)
NPU_LORA_DECL(avx512)
#undef NPU_LORA_DECL
// native bf16 x bf16 (AVX512-BF16 only): the operands x / coef are bf16 too
void avx512bf16_dot_bf16n(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64);
void avx512bf16_axpy_bf16n(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64);
float avx512bf16_dh_row(const float*, const float*, i64, i64, i64, float, float*, bf16_t*);
void avx512bf16_act_row(const float*, i64, i64, i64, bf16_t*);
// AMX tiles (stream_amx.cpp): the dot takes its tokens packed (pack_tokens), the axpy reads 16
// coefficient rows per token block (the drivers pad 16 rows past the end)
void amx_dot_bf16n(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64);
void amx_axpy_bf16n(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64);
void amx_pack_tokens(const bf16_t*, i64, i64, i64, bf16_t*);
void amx_act_packed(const float*, i64, i64, i64, i64, i64, bf16_t*, i64);
float amx_dh_row(const float*, const float*, i64, i64, i64, float, float*, bf16_t*);

enum Isa : int { kBase = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };

struct Ops {
  void (*dot_f32)(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);
  void (*dot_bf16f)(const bf16_t*, i64, i64, i64, const float*, i64, i64, float*, i64);
  void (*axpy_f32)(const float*, i64, i64, i64, const float*, i64, i64, float*, i64);
  void (*axpy_bf16)(const bf16_t*, i64, i64, i64, const float*, i64, i64, float*, i64);
  // native bf16 operands (nullptr: bf16 weights are widened and run the fp32 tiles)
  void (*dot_bf16n)(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64) = nullptr;
  void (*axpy_bf16n)(const bf16_t*, i64, i64, i64, const bf16_t*, i64, i64, float*, i64) = nullptr;
  // non-null: dot_bf16n takes the tokens in VNNI blocks of 16 made by this (pack_tokens; x = the
  // expert's first block, ldx = the block stride) instead of rows (AMX)
  void (*pack)(const bf16_t*, i64, i64, i64, bf16_t*) = nullptr;
  // with `pack` (required with it): SiLU(gate) * up of one gate/up task (even rows r0, r1 or
  // r1 = I) straight into the VNNI blocks, padding zeros included
  void (*act_packed)(const float*, i64, i64, i64, i64, i64, bf16_t*, i64) = nullptr;
  // native path without `pack`: SiLU(gate) * up of one token's gate rows [r0, r1) as bf16 words
  // into its activation row, vectorised (nullptr: the scalar loop in forward)
  void (*act_row)(const float*, i64, i64, i64, bf16_t*) = nullptr;
  // native path: one row of the backward's elementwise part (dh, its bf16 copy, returns dw),
  // vectorised (nullptr: the scalar loop in backward)
  float (*dh_row)(const float*, const float*, i64, i64, i64, float, float*, bf16_t*) = nullptr;
  // axpy_bf16 writes its out rows in unpack order (u16_pos; AVX2): the drivers read them so
  bool axpy_u16 = false;
};

inline Ops ops_for(int isa) {
  if (isa == kAmx)
    return {avx512_dot_f32, avx512_dot_bf16f, avx512_axpy_f32, avx512_axpy_bf16, amx_dot_bf16n,
            amx_axpy_bf16n, amx_pack_tokens,  amx_act_packed,  nullptr,          amx_dh_row};
  if (isa == kAvx512Bf16)
    return {avx512_dot_f32,       avx512_dot_bf16f,      avx512_axpy_f32, avx512_axpy_bf16,
            avx512bf16_dot_bf16n, avx512bf16_axpy_bf16n, nullptr,         nullptr,
            avx512bf16_act_row,   avx512bf16_dh_row};
  if (isa == kAvx512) return {avx512_dot_f32, avx512_dot_bf16f, avx512_axpy_f32, avx512_axpy_bf16};
  if (isa == kAvx2) {
    Ops o{avx2_dot_f32, avx2_dot_bf16f, avx2_axpy_f32, avx2_axpy_bf16};
    o.axpy_u16 = true;
    return o;
  }
  return {base_dot_f32, base_dot_bf16f, base_axpy_f32, base_axpy_bf16};
}

// True when the CPU has AMX-TILE and AMX-BF16 and Linux granted this process the tile data state
// (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA; needed once per process before any thread uses a
// tile; idempotent). Without the grant the first tile instruction would fault.
inline bool amx_request() {
#if defined(__x86_64__) && defined(__linux__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 22) & 1u) || !((d >> 24) & 1u)) return false;  // AMX-BF16, AMX-TILE
  return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
  return false;
#endif
}

// ---- small helpers -------------------------------------------------------------------------------

// Unpack order (Ops::axpy_u16): where natural column c of a row of L columns is stored. Within
// each whole block of 16 columns bits 2 and 3 of the offset swap (0-3 stay, 4-7 -> 8-11, 8-11 ->
// 4-7, 12-15 stay), the order in which one AVX2 unpack pair widens 16 bf16 words; columns past the
// last whole block stay. The swap is its own inverse.
inline i64 u16_pos(i64 c, i64 L) {
  return c >= (L & ~15LL) ? c : (c & ~15LL) | (c & 3) | ((c & 4) << 1) | ((c & 8) >> 1);
}
// dst[c] += src[u16_pos(c, L)] (u16) or src[c], for c in [c0, c1) (c0 a multiple of 16)
inline void add_row(const float* src, bool u16, i64 L, i64 c0, i64 c1, float* dst) {
  i64 c = c0;
  if (u16) {
    static constexpr int kPos[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};
    for (const i64 whole = std::min(c1, L & ~15LL); c + 16 <= whole; c += 16)
      for (int j = 0; j < 16; ++j) dst[c + j] += src[c + kPos[j]];
  }
  for (; c < c1; ++c) dst[c] += src[c];
}

inline float bf16_to_f32(bf16_t v) {
  unsigned int u = static_cast<unsigned int>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// the bf16 value nearest to f, as a float: round to nearest even, NaN stays NaN (as torch's
// float -> bfloat16); branch-free so that loops over it vectorise
inline float round_bf16(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  u = (u & 0x7fffffffu) > 0x7f800000u ? ((u | 0x00400000u) & 0xffff0000u)
                                      : ((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}
inline bf16_t f32_to_bf16(float f) {
  const float r = round_bf16(f);
  unsigned int u;
  std::memcpy(&u, &r, 4);
  return static_cast<bf16_t>(u >> 16);
}
inline float sigmoid(float v) { return 1.f / (1.f + std::exp(-v)); }

// Leading dimension for a row of `n` elements of `esz` bytes: a multiple of 64 bytes, plus one
// cache line, so that consecutive rows never sit a multiple of 4 KiB apart (cache-set aliasing
// when several rows are streamed at once).
inline i64 padded_ld(i64 n, i64 esz) {
  const i64 per_line = 64 / esz;
  return (n + per_line - 1) / per_line * per_line + per_line;
}

// Process-wide cache of 64-byte aligned blocks for the work buffers and (stream.cpp) the output
// tensors. One call's buffers reach tens of MB (80 MB forward at T=512); glibc serves blocks over
// its mmap threshold (128 KiB, raised dynamically up to 32 MiB) with a fresh mapping, so every
// call would fault its pages in again: measured on a Zen 4 guest, 16-23 thousand faults and
// ~40 ms of system time per T=512 backward, first-touch faults at 0.7-2 GB/s
// (experiments/2026-12-02-zen4-native-bf16.md). Returned blocks are kept and reused, best fit
// among blocks at most twice the request; blocks that would take the cache over `cap` bytes
// (NPU_LORA_STREAM_POOL_MB, default 4096) are freed instead. So the cache holds what the calls
// used at once (e.g. the saved pre-activations of every layer between forward and backward), as a
// caching allocator does. `trim()` frees it all.
class Pool {
 public:
  Pool() {
    const char* mb = std::getenv("NPU_LORA_STREAM_POOL_MB");
    cap_ = (mb && *mb ? static_cast<std::size_t>(std::strtoull(mb, nullptr, 10)) : 4096) << 20;
  }
  void* get(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::size_t best = free_.size();
      for (std::size_t i = 0; i < free_.size(); ++i) {
        const std::size_t b = free_[i].first;
        if (b >= bytes && b / 2 <= bytes && (best == free_.size() || b < free_[best].first))
          best = i;
      }
      if (best != free_.size()) {
        void* p = free_[best].second;
        cached_ -= free_[best].first;
        free_[best] = free_.back();
        free_.pop_back();
        return p;
      }
    }
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void put(void* p, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= cap_) {
        free_.emplace_back(bytes, p);
        cached_ += bytes;
        return;
      }
    }
    std::free(p);
  }
  std::size_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  void trim() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : free_) std::free(b.second);
    free_.clear();
    cached_ = 0;
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<std::size_t, void*>> free_;
  std::size_t cached_ = 0, cap_;
};
inline Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: tensors may return blocks until the very end
  return *p;
}
inline std::size_t block_bytes(std::size_t bytes) { return (bytes + 63) / 64 * 64; }

// 64-byte aligned scratch buffer of n elements from the pool (returned to it when it goes out of
// scope); n == 0: no buffer (nullptr).
template <class T>
struct Buf {
  T* p = nullptr;
  std::size_t bytes;
  explicit Buf(i64 n) : bytes(block_bytes(static_cast<std::size_t>(n > 0 ? n : 0) * sizeof(T))) {
    if (bytes) p = static_cast<T*>(pool().get(bytes));
  }
  ~Buf() {
    if (p) pool().put(p, bytes);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* get() const { return p; }
};

// One weight tensor [E, R, C] (fp32 or bf16), row-major contiguous.
struct Weights {
  const void* p;
  bool bf16;
  i64 R, C;
  const float* f(i64 e, i64 r) const { return static_cast<const float*>(p) + (e * R + r) * C; }
  const bf16_t* h(i64 e, i64 r) const { return static_cast<const bf16_t*>(p) + (e * R + r) * C; }
};

// The other operand of a weight pass (tokens of a dot, coefficients of an axpy), in the form
// the ISA's kernel takes: bf16 words `n` (native bf16 weights: rows, or VNNI token blocks on
// AMX) or fp32 values `f` (fp32 weights and the widening ISAs), rows / blocks `ld` apart.
struct Operand {
  const float* f;
  const bf16_t* n;
  i64 ld;
};

// out[t, j] = sum_c x[t, c] * w[e, r0 + j, c] for j < rows, t < n: the dot kernel of the weights'
// dtype and the operand's form (whole rows, L = w.C).
inline void dot(const Ops& o, const Weights& w, i64 e, i64 r0, i64 rows, const Operand& x, i64 n,
                float* out, i64 ldo) {
  const i64 L = w.C;
  if (x.n) o.dot_bf16n(w.h(e, r0), L, L, rows, x.n, x.ld, n, out, ldo);
  else if (w.bf16) o.dot_bf16f(w.h(e, r0), L, L, rows, x.f, x.ld, n, out, ldo);
  else o.dot_f32(w.f(e, r0), L, L, rows, x.f, x.ld, n, out, ldo);
}

// out[t, c] = sum_j c[t, j] * w[e, r0 + j, c] for j < rows, t < n: the axpy kernel likewise.
inline void axpy(const Ops& o, const Weights& w, i64 e, i64 r0, i64 rows, const Operand& c,
                 i64 n, float* out, i64 ldo) {
  const i64 L = w.C;
  if (c.n) o.axpy_bf16n(w.h(e, r0), L, L, rows, c.n, c.ld, n, out, ldo);
  else if (w.bf16) o.axpy_bf16(w.h(e, r0), L, L, rows, c.f, c.ld, n, out, ldo);
  else o.axpy_f32(w.f(e, r0), L, L, rows, c.f, c.ld, n, out, ldo);
}

struct Task {
  i64 e, s0, n, r0, r1, part;
};

// (hit expert, row block) tasks, `block` rows each, largest work first (ties: expert order).
inline std::vector<Task> make_tasks(const std::vector<i64>& off, i64 rows, i64 block) {
  std::vector<Task> out;
  const i64 E = static_cast<i64>(off.size()) - 1;
  for (i64 e = 0; e < E; ++e) {
    const i64 n = off[e + 1] - off[e];
    if (!n) continue;
    i64 p = 0;
    for (i64 r0 = 0; r0 < rows; r0 += block, ++p)
      out.push_back({e, off[e], n, r0, std::min(rows, r0 + block), p});
  }
  std::stable_sort(out.begin(), out.end(), [](const Task& a, const Task& b) {
    return a.n * (a.r1 - a.r0) > b.n * (b.r1 - b.r0);
  });
  return out;
}

// `Par` runs a callable once on each of its threads, concurrently: `par.run(f)`.
template <class Par, class F>
void for_tasks(const Par& par, const std::vector<Task>& ts, F f) {
  std::atomic<i64> next{0};
  const i64 n = static_cast<i64>(ts.size());
  par.run([&] {
    for (i64 i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) f(ts[i]);
  });
}

// f(i) for i in [0, n), in chunks of `chunk`, any thread.
template <class Par, class F>
void for_range(const Par& par, i64 n, i64 chunk, F f) {
  std::atomic<i64> next{0};
  par.run([&] {
    for (i64 b; (b = next.fetch_add(chunk, std::memory_order_relaxed)) < n;)
      for (i64 i = b, e = std::min(n, b + chunk); i < e; ++i) f(i);
  });
}

// Optional per-phase wall times (seconds, added to `acc[i]`) for the stand-alone benchmark.
struct PhaseClock {
  double* acc;
  std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
  int i = 0;
  void lap() {
    if (!acc) return;
    const auto now = std::chrono::steady_clock::now();
    acc[i++] += std::chrono::duration<double>(now - t).count();
    t = now;
  }
};

// ---- forward ---------------------------------------------------------------------------------------

// What the forward and the backward share: routing and weights.
struct RoutedArgs {
  const int64_t* token_idx;  // [S] expert order -> token
  const float* wr;           // [S] routing weights, expert order
  std::vector<i64> off;      // [E + 1] group starts
  Weights gu, dn;            // [E, 2I, H], [E, H, I]
  const int64_t* inv;        // [T*K] flat (token, slot) -> expert-order row
  i64 T, K;
};

struct ForwardArgs : RoutedArgs {
  const void* hs;  // [T, H] hidden states, fp32 or bf16 (hs_bf16)
  bool hs_bf16;
  i64 gu_block, down_block;  // rows per task
  float* out;                // [T, H]
  float* h;                  // [S, 2I] gate/up pre-activations (saved for backward)
  double* phase_s = nullptr;  // [4]: gather, gate/up, down, combine (benchmark only)
};

// One row of H elements from `src` (fp32 or bf16) to `d`: widened from bf16 or, with `round`,
// rounded to bf16 values; into a bf16 `d` (native bf16 path) fp32 sources are rounded to bf16.
template <class DT>
inline void copy_row(const void* src, bool src_bf16, i64 H, bool round, DT* d) {
  if constexpr (std::is_same_v<DT, bf16_t>) {
    if (src_bf16) std::memcpy(d, src, H * sizeof(bf16_t));
    else {
      const float* x = static_cast<const float*>(src);
      for (i64 c = 0; c < H; ++c) d[c] = f32_to_bf16(x[c]);
    }
  } else if (src_bf16) {
    const bf16_t* x = static_cast<const bf16_t*>(src);
    for (i64 c = 0; c < H; ++c) d[c] = bf16_to_f32(x[c]);
  } else {
    const float* x = static_cast<const float*>(src);
    if (round) for (i64 c = 0; c < H; ++c) d[c] = round_bf16(x[c]);
    else std::memcpy(d, x, H * sizeof(float));
  }
}

// dst[s, :] = src[token_idx[s], :] for the valid rows s (rows of H elements, dst rows ld apart),
// converted as copy_row does. Rows >= valid are never read.
template <class Par, class DT>
void gather(const Par& par, const RoutedArgs& a, const void* src, bool src_bf16, i64 H,
            bool round, DT* dst, i64 ld) {
  const i64 esz = src_bf16 ? 2 : 4;
  for_range(par, a.off.back(), 16, [&](i64 s) {
    copy_row(static_cast<const char*>(src) + a.token_idx[s] * H * esz, src_bf16, H, round,
             dst + s * ld);
  });
}

// out[t, :] = sum_k sum_p part[p][inv[t*K + k], :] (rows >= valid are skipped), fixed order;
// `u16`: the partial rows are in unpack order (u16_pos).
template <class Par>
void combine(const Par& par, const float* part, i64 P, i64 pstride, i64 ld, i64 D,
             const int64_t* inv, i64 T, i64 K, i64 valid, float* out, bool u16 = false) {
  for_range(par, T, 8, [&](i64 t) {
    float* o = out + t * D;
    for (i64 d = 0; d < D; ++d) o[d] = 0.f;
    for (i64 k = 0; k < K; ++k) {
      const i64 s = inv[t * K + k];
      if (s >= valid) continue;
      for (i64 p = 0; p < P; ++p) add_row(part + p * pstride + s * ld, u16, D, 0, D, o);
    }
  });
}

// VNNI token blocks for the AMX dot (Ops::packed): each expert's rows in blocks of 16 tokens
// (`boff[e]`: the expert's first block); block k holds the 32-bit words
// dst[k, q, t] = (x[t, 2q], x[t, 2q + 1]) for q < LP / 2 (LP = L rounded up to 32), t < 16, so
// that 16 consecutive q are one B tile; tokens past the expert's count and columns past L are
// zeros. `src` rows are in expert order, `lds` apart.
inline i64 up32(i64 v) { return (v + 31) / 32 * 32; }
inline std::vector<i64> token_blocks(const std::vector<i64>& off) {
  std::vector<i64> boff(off.size(), 0);
  for (std::size_t e = 0; e + 1 < off.size(); ++e) boff[e + 1] = boff[e] + (off[e + 1] - off[e] + 15) / 16;
  return boff;
}
template <class Par>
void pack_tokens(const Par& par, const Ops& o, const std::vector<i64>& off,
                 const std::vector<i64>& boff, const bf16_t* src, i64 lds, i64 L, bf16_t* dst) {
  for_range(par, boff.back(), 4, [&](i64 k) {
    const i64 e = std::upper_bound(boff.begin(), boff.end(), k) - boff.begin() - 1;
    const i64 s0 = off[e] + 16 * (k - boff[e]);
    o.pack(src + s0 * lds, lds, std::min<i64>(16, off[e + 1] - s0), L, dst + k * 16 * up32(L));
  });
}

template <class Par>
void forward(const Par& par, const Ops& o, const ForwardArgs& a) {
  const i64 H = a.gu.C, I = a.gu.R / 2, S = a.T * a.K;
  const i64 valid = a.off.back();
  // bf16 weights: the activations are rounded to bf16. Widening ISAs hold them as fp32 and run
  // the fp32 tiles (same summation order as fp32); the native ISA holds them as bf16 words.
  const bool W16 = a.gu.bf16;  // the two weight tensors share the dtype
  const bool N16 = W16 && o.dot_bf16n;
  // AMX: the tokens and the activations in VNNI blocks of 16 (pack_tokens)
  const bool XP = N16 && o.pack;
  const i64 LX = padded_ld(H, 4), LI = padded_ld(I, 4), LY = padded_ld(H, 4);
  const i64 LXn = padded_ld(H, 2), LIn = padded_ld(I, 2);
  const std::vector<i64> boff = XP ? token_blocks(a.off) : std::vector<i64>(a.off.size(), 0);
  const i64 BX = 16 * up32(H), BA = 16 * up32(I);  // block strides (elements)
  Buf<float> xf(N16 ? 0 : S * LX), af(N16 ? 0 : S * LI), y(S * LY);
  Buf<bf16_t> xn(N16 ? S * LXn : 0), an(N16 && !XP ? S * LIn : 0);
  Buf<bf16_t> xp(XP ? boff.back() * BX : 0), ap(XP ? boff.back() * BA : 0);
  PhaseClock clock{a.phase_s};
  // the tokens, in expert order
  if (N16) gather(par, a, a.hs, a.hs_bf16, H, true, xn.get(), LXn);
  else gather(par, a, a.hs, a.hs_bf16, H, W16, xf.get(), LX);
  if (XP) pack_tokens(par, o, a.off, boff, xn.get(), LXn, H, xp.get());
  if (valid < S) std::memset(a.h + valid * 2 * I, 0, (S - valid) * 2 * I * sizeof(float));
  clock.lap();
  // gate/up: gate rows [r0, r1) and up rows [I + r0, I + r1), then act = SiLU(gate) * up
  // packed activations: even row blocks, so no bf16 pair of a VNNI word spans two tasks
  const i64 gu_block = XP ? (a.gu_block + 1) / 2 * 2 : a.gu_block;
  for_tasks(par, make_tasks(a.off, I, gu_block), [&](const Task& t) {
    const i64 rows = t.r1 - t.r0;
    float* ht = a.h + t.s0 * 2 * I;
    const Operand x = XP    ? Operand{nullptr, xp.get() + boff[t.e] * BX, BX}
                      : N16 ? Operand{nullptr, xn.get() + t.s0 * LXn, LXn}
                            : Operand{xf.get() + t.s0 * LX, nullptr, LX};
    dot(o, a.gu, t.e, t.r0, rows, x, t.n, ht + t.r0, 2 * I);
    dot(o, a.gu, t.e, I + t.r0, rows, x, t.n, ht + I + t.r0, 2 * I);
    if (XP) {  // straight into the VNNI blocks, padding included
      o.act_packed(ht, 2 * I, I, t.r0, t.r1, t.n, ap.get() + boff[t.e] * BA, BA);
      return;
    }
    if (N16 && o.act_row) {
      for (i64 s = 0; s < t.n; ++s)
        o.act_row(ht + s * 2 * I, I, t.r0, t.r1, an.get() + (t.s0 + s) * LIn);
      return;
    }
    for (i64 s = 0; s < t.n; ++s)
      for (i64 j = t.r0; j < t.r1; ++j) {
        const float g = ht[s * 2 * I + j];
        const float v = g * sigmoid(g) * ht[s * 2 * I + I + j];
        if (N16) an.get()[(t.s0 + s) * LIn + j] = f32_to_bf16(v);
        else af.get()[(t.s0 + s) * LI + j] = W16 ? round_bf16(v) : v;
      }
  });
  clock.lap();
  // down: y[s, d] = wr[s] * act[s, :] . Wd[e, d, :]
  for_tasks(par, make_tasks(a.off, H, a.down_block), [&](const Task& t) {
    float* yt = y.get() + t.s0 * LY;
    const i64 rows = t.r1 - t.r0;
    const Operand act = XP    ? Operand{nullptr, ap.get() + boff[t.e] * BA, BA}
                        : N16 ? Operand{nullptr, an.get() + t.s0 * LIn, LIn}
                              : Operand{af.get() + t.s0 * LI, nullptr, LI};
    dot(o, a.dn, t.e, t.r0, rows, act, t.n, yt + t.r0, LY);
    for (i64 s = 0; s < t.n; ++s)
      for (i64 d = t.r0; d < t.r1; ++d) yt[s * LY + d] *= a.wr[t.s0 + s];
  });
  clock.lap();
  combine(par, y.get(), 1, 0, LY, H, a.inv, a.T, a.K, valid, a.out);
  clock.lap();
}

// ---- backward (frozen experts: dX, routing-weight gradient, dh) -----------------------------------

struct BackwardArgs : RoutedArgs {
  const void* g;  // [T, H] dL/d(out), fp32 or bf16 (g_bf16)
  bool g_bf16;
  const float* h;  // [S, 2I] saved pre-activations
  i64 down_split, gu_split;  // rows per task (each expert's rows in ceil(rows / split) partials)
  float* dx;                 // [T, H]
  float* dw;                 // [S] routing-weight gradient (expert order)
  float* dh;                 // [S, 2I]
  double* phase_s = nullptr;  // [5]: gather, z, dh, dx, combine (benchmark only)
};

template <class Par>
void backward(const Par& par, const Ops& o, const BackwardArgs& a) {
  const i64 H = a.gu.C, I = a.gu.R / 2, S = a.T * a.K;
  const i64 valid = a.off.back();
  // native bf16 ISA with bf16 weights: the coefficients (dout, dh) are rounded to bf16 for the
  // two weight passes, as a bf16 model's backward holds them; z, dh, dx and every sum stay fp32
  const bool N16 = a.gu.bf16 && o.axpy_bf16n;
  const bool U16 = a.gu.bf16 && !N16 && o.axpy_u16;  // z and dx partials in unpack order
  const i64 LG = padded_ld(H, 4), LZ = padded_ld(I, 4), LX = padded_ld(H, 4);
  const i64 LGn = padded_ld(H, 2), LDn = padded_ld(2 * I, 2);
  const i64 P1 = (H + a.down_split - 1) / a.down_split;
  const i64 P2 = (2 * I + a.gu_split - 1) / a.gu_split;
  Buf<float> gg(N16 ? 0 : S * LG), zpart(P1 * S * LZ), dxpart(P2 * S * LX);
  // (16 rows of slack: the AMX axpy reads whole 16-row token blocks; the extra rows only reach
  // outputs that are never stored)
  Buf<bf16_t> gn(N16 ? (S + 16) * LGn : 0), dhn(N16 ? (S + 16) * LDn : 0);
  PhaseClock clock{a.phase_s};
  if (N16) gather(par, a, a.g, a.g_bf16, H, true, gn.get(), LGn);
  else gather(par, a, a.g, a.g_bf16, H, false, gg.get(), LG);
  clock.lap();
  // z = g . Wd_e  (one partial per row block of Wd)
  for_tasks(par, make_tasks(a.off, H, a.down_split), [&](const Task& t) {
    float* z = zpart.get() + (t.part * S + t.s0) * LZ;
    const i64 rows = t.r1 - t.r0;
    const Operand coef = N16 ? Operand{nullptr, gn.get() + t.s0 * LGn + t.r0, LGn}
                             : Operand{gg.get() + t.s0 * LG + t.r0, nullptr, LG};
    axpy(o, a.dn, t.e, t.r0, rows, coef, t.n, z, LZ);
  });
  clock.lap();
  // dw = <act, z>; dh = [w z u SiLU'(gate), w z SiLU(gate)]
  if (valid < S) {
    std::memset(a.dh + valid * 2 * I, 0, (S - valid) * 2 * I * sizeof(float));
    std::memset(a.dw + valid, 0, (S - valid) * sizeof(float));
  }
  for_range(par, valid, 16, [&](i64 s) {
    const float* hs = a.h + s * 2 * I;
    float* ds = a.dh + s * 2 * I;
    if (N16 && o.dh_row) {
      a.dw[s] = o.dh_row(hs, zpart.get() + s * LZ, S * LZ, P1, I, a.wr[s], ds, dhn.get() + s * LDn);
      return;
    }
    float acc = 0.f;
    for (i64 i = 0; i < I; ++i) {
      float z = 0.f;
      const i64 zi = U16 ? u16_pos(i, I) : i;
      for (i64 p = 0; p < P1; ++p) z += zpart.get()[(p * S + s) * LZ + zi];
      const float g = hs[i], u = hs[I + i], sg = sigmoid(g), silu = g * sg;
      acc += silu * u * z;
      const float da = z * a.wr[s];
      ds[i] = da * u * (sg * (1.f + g * (1.f - sg)));
      ds[I + i] = da * silu;
    }
    a.dw[s] = acc;
    if (N16)
      for (i64 i = 0; i < 2 * I; ++i) dhn.get()[s * LDn + i] = f32_to_bf16(ds[i]);
  });
  clock.lap();
  // dx = dh . Wgu_e  (one partial per row block of Wgu)
  for_tasks(par, make_tasks(a.off, 2 * I, a.gu_split), [&](const Task& t) {
    float* dx = dxpart.get() + (t.part * S + t.s0) * LX;
    const i64 rows = t.r1 - t.r0;
    const Operand coef = N16 ? Operand{nullptr, dhn.get() + t.s0 * LDn + t.r0, LDn}
                             : Operand{a.dh + t.s0 * 2 * I + t.r0, nullptr, 2 * I};
    axpy(o, a.gu, t.e, t.r0, rows, coef, t.n, dx, LX);
  });
  clock.lap();
  combine(par, dxpart.get(), P2, S * LX, LX, H, a.inv, a.T, a.K, valid, a.dx, U16);
  clock.lap();
}

// ---- dense: one frozen weight, a few token rows (the LM head at the label positions) ----------
//
//   dense_forward:  y[n, r]  = sum_c x[n, c] * W[r, c]    row blocks of W as tasks, y written once
//   dense_backward: dx[n, c] = sum_r g[n, r] * W[r, c]    row blocks of W into one partial each,
//                                                         summed in block order
// The same micro-kernels and numerics as the experts (bf16 weights: operands rounded to bf16,
// fp32 accumulation); a block count fixed by the caller, so results do not depend on threads.

struct DenseArgs {
  Weights w;         // [1, R, C]
  const void* x;     // forward x [N, C], backward g [N, R]; fp32 or bf16 (x_bf16)
  bool x_bf16;
  i64 N;
  i64 block;         // rows of W per task (forward) / per partial (backward)
  float* out;        // forward y [N, R], backward dx [N, C]
};

template <class Par>
void dense_forward(const Par& par, const Ops& o, const DenseArgs& a) {
  const i64 R = a.w.R, C = a.w.C, N = a.N;
  const bool W16 = a.w.bf16, N16 = W16 && o.dot_bf16n, XP = N16 && o.pack;
  const i64 LX = padded_ld(C, 4), LXn = padded_ld(C, 2), BX = 16 * up32(C);
  const std::vector<i64> off{0, N}, boff = token_blocks(off);
  Buf<float> xf(N16 ? 0 : N * LX);
  Buf<bf16_t> xn(N16 ? N * LXn : 0), xp(XP ? boff.back() * BX : 0);
  const i64 esz = a.x_bf16 ? 2 : 4;
  for_range(par, N, 1, [&](i64 t) {
    const void* src = static_cast<const char*>(a.x) + t * C * esz;
    if (N16) copy_row(src, a.x_bf16, C, true, xn.get() + t * LXn);
    else copy_row(src, a.x_bf16, C, W16, xf.get() + t * LX);
  });
  if (XP) pack_tokens(par, o, off, boff, xn.get(), LXn, C, xp.get());
  const Operand x = XP    ? Operand{nullptr, xp.get(), BX}
                    : N16 ? Operand{nullptr, xn.get(), LXn}
                          : Operand{xf.get(), nullptr, LX};
  for_range(par, (R + a.block - 1) / a.block, 1, [&](i64 k) {
    const i64 r0 = k * a.block, rows = std::min(a.block, R - r0);
    dot(o, a.w, 0, r0, rows, x, N, a.out + r0, R);
  });
}

template <class Par>
void dense_backward(const Par& par, const Ops& o, const DenseArgs& a) {
  const i64 R = a.w.R, C = a.w.C, N = a.N;
  const bool N16 = a.w.bf16 && o.axpy_bf16n;
  const bool U16 = a.w.bf16 && !N16 && o.axpy_u16;  // partials in unpack order
  // the coefficients: fp32 g is used in place; bf16 g is widened, or rounded to bf16 words for
  // the native path (16 rows of slack: the AMX axpy reads whole 16-row token blocks)
  const bool widen = !N16 && a.x_bf16;
  const i64 LG = widen ? padded_ld(R, 4) : R, LGn = padded_ld(R, 2), LX = padded_ld(C, 4);
  const i64 P = (R + a.block - 1) / a.block;
  Buf<float> gf(widen ? N * LG : 0), part(P * N * LX);
  Buf<bf16_t> gn(N16 ? (N + 16) * LGn : 0);
  const i64 esz = a.x_bf16 ? 2 : 4;
  if (N16 || widen)
    for_range(par, N, 1, [&](i64 t) {
      const void* src = static_cast<const char*>(a.x) + t * R * esz;
      if (N16) copy_row(src, a.x_bf16, R, true, gn.get() + t * LGn);
      else copy_row(src, true, R, false, gf.get() + t * LG);
    });
  const float* gp = widen ? gf.get() : static_cast<const float*>(a.x);
  for_range(par, P, 1, [&](i64 p) {
    const i64 r0 = p * a.block, rows = std::min(a.block, R - r0);
    const Operand coef = N16 ? Operand{nullptr, gn.get() + r0, LGn} : Operand{gp + r0, nullptr, LG};
    axpy(o, a.w, 0, r0, rows, coef, N, part.get() + p * N * LX, LX);
  });
  // dx[n, c] = sum_p part[p][n, c], in p order; column chunks so a few rows still split
  const i64 CH = 256, nch = (C + CH - 1) / CH;
  for_range(par, N * nch, 1, [&](i64 q) {
    const i64 t = q / nch, c0 = (q % nch) * CH, c1 = std::min(C, c0 + CH);
    float* d = a.out + t * C;
    for (i64 c = c0; c < c1; ++c) d[c] = 0.f;
    for (i64 p = 0; p < P; ++p) add_row(part.get() + (p * N + t) * LX, U16, C, c0, c1, d);
  });
}

}  // namespace npu_lora_stream
