// NVFP4 quantization in CUDA C++: the same bytes as the Triton kernel `nvfp4_quant_kernel`
// (kernels/nvfp4.py), written to be read side by side with it. Device code and a C launcher only:
// no torch header, so `nvcc -arch=sm_90 -c nvfp4.cu` compiles it on its own (tests/test_cuda.py).
// The Python side (workbook/cuda.py) allocates, checks and passes raw pointers and a stream.
//
// Format: per 16-element block of a row, amax = max |x| (fp16/bf16 -> fp32), the scale
//   sf = e4m3_rne_satfinite(min(RN(gs * amax) / 6 (correctly rounded), 448)),
// and per element the E2M1 code of RN(RN(x * gs) / sf), ties to the even index, saturated at 6;
// sf = 0 gives index 0. Bit 3 of a code is the sign bit of x. Element 2i is the low nibble.
//
// One thread per scale entry (row r, 16-element block c) of the grid the scales span: the padded
// grid [round_up(M,128), round_up(K/16,4)] for the 128x4 swizzled layout, [M, K/16] for the linear
// one. A thread of a real block (r < M, c < K/16) loads its 32 bytes (two 16-byte loads), writes its
// 8 code bytes (one 8-byte store) and its scale byte; a thread of a padded entry writes a 0 scale
// byte. So EVERY byte of the swizzled storage is written, padding included (`empty` is safe);
// WRITE_PADDING=false skips the padded entries and reproduces the regression the workbook teaches.
//
// The E2M1 rounding. `cvt.rn.satfinite.e2m1x2.f32` (two fp32 -> two E2M1 codes, round to nearest
// even, saturating) exists only on Blackwell's arch-specific targets (sm_100a, sm_103a, sm_110a,
// sm_120a, sm_121a), not on the H200's sm_90. Under that arch guard the kernel uses it on the
// correctly rounded quotient RN(RN(x*gs)/sf); on sm_90 (the H200) it emulates it exactly, as the
// Triton kernel does: without a division, by comparing |RN(x*gs)| against the E2M1 decision points
// times sf (exact products), one saturating FMA per comparison (see e2m1_pair_bits). Both give the
// same codes; the H200 runs the emulation.
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM110_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define NVFP4_HW_E2M1 1   // cvt.rn.satfinite.e2m1x2.f32 exists on this target
#else
#define NVFP4_HW_E2M1 0   // sm_90 and others: exact emulation
#endif

namespace nvfp4 {

constexpr float kTwo40 = 1099511627776.0f;          // 2^40
constexpr float kTwo60 = 1.152921504606846976e18f;  // 2^60: the stand-in scale of an sf = 0 block

// Per 16-bit half, the larger magnitude of two words of fp16|bf16 pairs (sign bits are junk).
// Triton: _absmax_bf16x2 / _absmax_f16x2 (the same PTX).
template <bool IS_BF16>
__device__ __forceinline__ uint32_t absmax_x2(uint32_t a, uint32_t b) {
  uint32_t d;
  if (IS_BF16) {
    asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  } else {
    asm("max.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  }
  return d;
}

// The two halves of a word as fp32: element 2i (low half), 2i+1 (high half). Exact.
// Triton: unpack_pairs (kernels/common.py).
template <bool IS_BF16>
__device__ __forceinline__ void unpack_pair(uint32_t w, float& lo, float& hi) {
  if (IS_BF16) {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xFFFF0000u);
  } else {
    unsigned short l = (unsigned short)(w & 0xFFFFu), h = (unsigned short)(w >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
  }
}

// y / 6 correctly rounded for y >= 0 (normal quotient) in three FP32 operations. Triton: div6_rn.
// The explicit __fmul_rn/__fmaf_rn keep nvcc from contracting or reassociating anything.
__device__ __forceinline__ float div6_rn(float y) {
  const float r = 0.16666667163372039795f;           // RN(1/6)
  const float q1 = __fmul_rn(y, r);
  return __fmaf_rn(__fmaf_rn(q1, -6.0f, y), r, q1);
}

// fp32 -> E4M3 byte, round to nearest even, saturating (cvt.rn.satfinite.e4m3x2.f32; the value
// converted in the low byte), and the byte back to fp32 (cvt.rn.f16x2.e4m3x2, exact).
// Triton: b_sf_want.to(tl.float8e4nv) and b_f8.to(tl.float32).
__device__ __forceinline__ uint32_t e4m3_byte(float v) {
  unsigned short two;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "f"(0.0f), "f"(v));
  return two & 0xFFu;
}

__device__ __forceinline__ float e4m3_value(uint32_t byte) {
  uint32_t h2;
  unsigned short b = (unsigned short)byte;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(b));
  float f;
  unsigned short lo = (unsigned short)(h2 & 0xFFFFu);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(lo));
  return f;
}

// 1.0 where a < t, else 0.0, for a >= 0 and t_big = t * 2^40: one saturating FMA (FFMA.SAT).
// Triton: lt01. Exact: see its docstring.
__device__ __forceinline__ float lt01(float a, float t_big) {
  return __saturatef(__fmaf_rn(a, -kTwo40, t_big));
}

// E2M1 magnitude indices of RN(a/s) for two values a_lo, a_hi >= 0, packed as the bits of
// 2^23 + i_lo + 65536 * i_hi (i_lo in bits 0-2, i_hi in bits 16-18). k* = decision points * s * 2^40.
// Triton: e2m1_pair_bits, operation for operation.
struct Thresholds { float k175, k275, k35, k15, k375, k25, k5; };

__device__ __forceinline__ uint32_t e2m1_pair_bits(float a_lo, float a_hi, const Thresholds& k) {
  const float n2_lo = lt01(a_lo, k.k175);
  const float n2_hi = lt01(a_hi, k.k175);
  const float n1_lo = lt01(a_lo, __fmaf_rn(n2_lo, -k.k275, k.k35));
  const float n1_hi = lt01(a_hi, __fmaf_rn(n2_hi, -k.k275, k.k35));
  const float nt0_lo = __fmaf_rn(n2_lo, __fmaf_rn(n1_lo, -k.k15, k.k375), __fmaf_rn(n1_lo, k.k25, -k.k5));
  const float nt0_hi = __fmaf_rn(n2_hi, __fmaf_rn(n1_hi, -k.k15, k.k375), __fmaf_rn(n1_hi, k.k25, -k.k5));
  const float c0_lo = __saturatef(__fmaf_rn(a_lo, kTwo40, nt0_lo));
  const float c0_hi = __saturatef(__fmaf_rn(a_hi, kTwo40, nt0_hi));
  float acc = __fmaf_rn(n2_hi, -262144.0f, 8388608.0f + 6.0f + 6.0f * 65536.0f);
  acc = __fmaf_rn(n1_hi, -131072.0f, acc);
  acc = __fmaf_rn(c0_hi, 65536.0f, acc);
  acc = __fmaf_rn(n2_lo, -4.0f, acc);
  acc = __fmaf_rn(n1_lo, -2.0f, acc);
  return __float_as_uint(__fadd_rn(acc, c0_lo));
}

// The code byte of one word (elements 2i, 2i+1) in its low 8 bits; the bits above are junk.
template <bool IS_BF16>
__device__ __forceinline__ uint32_t code_byte(uint32_t w, float gs, float sf, const Thresholds& k) {
  float lo, hi;
  unpack_pair<IS_BF16>(w, lo, hi);
#if NVFP4_HW_E2M1
  // Blackwell: the hardware conversion on y = RN(RN(x*gs)/sf) (signed; sf = 0: a zero with x's sign)
  (void)k;
  const float y_lo = sf > 0.0f ? __fdiv_rn(__fmul_rn(lo, gs), sf) : copysignf(0.0f, lo);
  const float y_hi = sf > 0.0f ? __fdiv_rn(__fmul_rn(hi, gs), sf) : copysignf(0.0f, hi);
  uint32_t out;
  asm("{\n\t.reg .b8 q;\n\t"
      "cvt.rn.satfinite.e2m1x2.f32 q, %2, %1;\n\t"   // %2 (element 2i+1) -> high nibble
      "cvt.u32.u8 %0, q;\n\t}"
      : "=r"(out) : "f"(y_lo), "f"(y_hi));
  return out;
#else
  // sm_90: the exact emulation (Triton's fast kernel, line for line)
  (void)sf;
  const uint32_t pair = e2m1_pair_bits(fabsf(__fmul_rn(lo, gs)), fabsf(__fmul_rn(hi, gs)), k);
  const uint32_t nib = pair | ((w >> 12) & 0x80008u);  // sign bits 15, 31 -> bits 3, 19
  return nib + (nib >> 12);                            // low nibble 2i, high nibble 2i+1
#endif
}

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING>
__global__ void __launch_bounds__(256) nvfp4_quant_kernel(
    const uint4* __restrict__ xw,          // [M, K/16] blocks of 32 bytes: the fp16|bf16 input as words
    const float* __restrict__ global_scale,  // [1] fp32, read on the device
    uint2* __restrict__ codes,             // [M, K/16] blocks of 8 code bytes = uint8 [M, K/2]
    uint8_t* __restrict__ sf,              // scale bytes: swizzled [sf_rows * sf_cols] or linear [M, K/16]
    uint32_t M, uint32_t n_blocks,         // rows, 16-element blocks per row (K/16)
    uint32_t sf_rows, uint32_t sf_cols,    // the grid the threads span (padded when swizzled)
    uint32_t n_entries) {                  // sf_rows * sf_cols
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n_entries) return;
  const uint32_t r = t / sf_cols;                     // Triton: o_m (row)
  const uint32_t c = t - r * sf_cols;                 // Triton: o_s (scale column = block)
  const bool real = r < M && c < n_blocks;            // Triton: m_real
  uint32_t sf_byte = 0;                               // padded entries store 0
  if (real) {
    const size_t blk = (size_t)r * n_blocks + c;
    const uint4 a = xw[2 * blk], b = xw[2 * blk + 1];  // 8 words = 16 elements (Triton: b_w)
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};

    // block amax on packed pairs (Triton: tl.reduce(b_w, 2, _absmax_*), then the two halves)
    uint32_t m01 = absmax_x2<IS_BF16>(w[0], w[1]), m23 = absmax_x2<IS_BF16>(w[2], w[3]);
    uint32_t m45 = absmax_x2<IS_BF16>(w[4], w[5]), m67 = absmax_x2<IS_BF16>(w[6], w[7]);
    const uint32_t m = absmax_x2<IS_BF16>(absmax_x2<IS_BF16>(m01, m23), absmax_x2<IS_BF16>(m45, m67));
    float m_lo, m_hi;
    unpack_pair<IS_BF16>(m, m_lo, m_hi);
    const float amax = fmaxf(fabsf(m_lo), fabsf(m_hi));

    // scale: sf = e4m3(min(gs * amax / 6, 448)) (Triton: b_sf_want, b_f8, b_sf_byte, b_sf)
    const float gs = __ldg(global_scale);
    const float sf_want = fminf(div6_rn(__fmul_rn(gs, amax)), 448.0f);
    sf_byte = e4m3_byte(sf_want);
    const float sfv = e4m3_value(sf_byte);

    // decision points times sf * 2^40 (exact); sf = 0 uses 2^60 so every |p| is below every point
    // (Triton: b_u, k175, ...)
    const float u = __fmul_rn(sfv > 0.0f ? sfv : kTwo60, kTwo40);
    const Thresholds k = {__fmul_rn(1.75f, u), __fmul_rn(2.75f, u), __fmul_rn(3.5f, u),
                          __fmul_rn(1.5f, u), __fmul_rn(3.75f, u), __fmul_rn(2.5f, u),
                          __fmul_rn(5.0f, u)};
    uint32_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = code_byte<IS_BF16>(w[i], gs, sfv, k);
    // 8 code bytes, byte i from word i (Triton: b_packed, stored at o_x)
    const uint32_t lo4 = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
    const uint32_t hi4 = __byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410);
    codes[blk] = make_uint2(lo4, hi4);
  }

  // the scale byte (Triton: o_sf, m_sf, b_sf_out)
  if (SWIZZLED) {
    if (WRITE_PADDING || real) {
      const size_t o = ((size_t)(r / 128) * (sf_cols / 4) + c / 4) * 512
                       + (r % 32) * 16 + ((r % 128) / 32) * 4 + (c % 4);
      sf[o] = (uint8_t)sf_byte;
    }
  } else {
    sf[(size_t)r * n_blocks + c] = (uint8_t)sf_byte;   // the grid is exactly [M, K/16]
  }
}

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING>
static void launch(const void* x, const float* gs, void* codes, void* sf, uint32_t M, uint32_t n_blocks,
                   uint32_t sf_rows, uint32_t sf_cols, cudaStream_t stream) {
  const uint32_t n = sf_rows * sf_cols;
  const uint32_t threads = 256;
  nvfp4_quant_kernel<IS_BF16, SWIZZLED, WRITE_PADDING><<<(n + threads - 1) / threads, threads, 0, stream>>>(
      static_cast<const uint4*>(x), gs, static_cast<uint2*>(codes), static_cast<uint8_t*>(sf), M, n_blocks,
      sf_rows, sf_cols, n);
}

// ------------------------------------------------------------------------------------------------
// The TABLE variant (Triton: nvfp4_thresholds_kernel + _quant_tile_table with INT_COUNT): the E2M1
// index from packed comparisons in x's own 16-bit format against 7 thresholds per scale byte. Here
// every CTA builds the 127 x 7 table in shared memory once (no second launch), then quantizes blocks
// in a grid-stride loop (a persistent grid: resident CTAs only), one thread per 16-element block.
// ------------------------------------------------------------------------------------------------

// Largest pattern of x's format whose value is <= c (c >= 0), capped at the largest finite value.
// Triton: _format_trunc.
template <bool IS_BF16>
__device__ __forceinline__ int format_trunc(float c) {
  if (IS_BF16) return min((int)(__float_as_uint(c) >> 16), 0x7F7F);
  const float big = fminf(c, 65504.0f);
  const int normal = (int)(__float_as_uint(big) >> 13) - (112 << 10);
  const int sub = (int)__fmul_rn(fminf(c, 6.103515625e-05f), 16777216.0f);   // multiples of 2^-24, truncated
  return c >= 6.103515625e-05f ? normal : sub;
}

template <bool IS_BF16>
__device__ __forceinline__ float format_value(int v) {   // Triton: _format_value
  if (IS_BF16) return __uint_as_float((uint32_t)v << 16);
  float f;
  const unsigned short h = (unsigned short)v;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

// X_t: the largest |x| pattern that does not pass decision point t in a block of scale sf.
// Triton: _threshold (and _passes): RN(|x| gs) > t sf where a tie goes down, >= where it goes up.
template <bool IS_BF16>
__device__ int threshold(float sf, float gs, float t, bool up) {
  const float T = __fmul_rn(sf, t);                       // exact
  const int cand = format_trunc<IS_BF16>(__fdiv_rn(T, gs));
  int X = -1;
#pragma unroll
  for (int k = -2; k <= 2; ++k) {
    const int v = cand + k;
    const bool ok = v >= 0 && v <= (IS_BF16 ? 0x7F7F : 0x7BFF);
    const float a = __fmul_rn(format_value<IS_BF16>(max(v, 0)), gs);
    const bool passes = up ? a >= T : a > T;
    if (ok && !passes) X = v;
  }
  return X;
}

// Code byte of one word (two elements) from the 7 thresholds (words X | X << 16): per half, the
// number of thresholds below |x| counted on integers (set.gt.u32 gives 0xFFFF per passing half;
// -sum * 65537 = c_lo + c_hi * 2^16), the sign bits moved next to it. Triton: _e2m1_bytes_int_count.
template <bool IS_BF16>
__device__ __forceinline__ uint32_t code_byte_table(uint32_t w, const uint32_t* X) {
  uint32_t out;
  if (IS_BF16) {
    asm("{\n\t.reg .b32 a, m, s, t;\n\t"
        "abs.bf16x2 a, %1;\n\t"
        "set.gt.u32.bf16x2 s, a, %2;\n\t"
        "set.gt.u32.bf16x2 m, a, %3;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.bf16x2 m, a, %4;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.bf16x2 m, a, %5;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.bf16x2 m, a, %6;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.bf16x2 m, a, %7;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.bf16x2 m, a, %8;\n\tadd.u32 s, s, m;\n\t"
        "neg.s32 s, s;\n\tmul.lo.u32 s, s, 65537;\n\t"
        "shr.u32 t, %1, 12;\n\tand.b32 t, t, 0x80008;\n\tor.b32 s, s, t;\n\t"
        "shr.u32 t, s, 12;\n\tor.b32 %0, s, t;\n\t}"
        : "=r"(out) : "r"(w), "r"(X[0]), "r"(X[1]), "r"(X[2]), "r"(X[3]), "r"(X[4]), "r"(X[5]), "r"(X[6]));
  } else {
    asm("{\n\t.reg .b32 a, m, s, t;\n\t"
        "abs.f16x2 a, %1;\n\t"
        "set.gt.u32.f16x2 s, a, %2;\n\t"
        "set.gt.u32.f16x2 m, a, %3;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.f16x2 m, a, %4;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.f16x2 m, a, %5;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.f16x2 m, a, %6;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.f16x2 m, a, %7;\n\tadd.u32 s, s, m;\n\t"
        "set.gt.u32.f16x2 m, a, %8;\n\tadd.u32 s, s, m;\n\t"
        "neg.s32 s, s;\n\tmul.lo.u32 s, s, 65537;\n\t"
        "shr.u32 t, %1, 12;\n\tand.b32 t, t, 0x80008;\n\tor.b32 s, s, t;\n\t"
        "shr.u32 t, s, 12;\n\tor.b32 %0, s, t;\n\t}"
        : "=r"(out) : "r"(w), "r"(X[0]), "r"(X[1]), "r"(X[2]), "r"(X[3]), "r"(X[4]), "r"(X[5]), "r"(X[6]));
  }
  return out;
}

constexpr int kTableThreads = 256;

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING>
__global__ void __launch_bounds__(kTableThreads) nvfp4_quant_table_kernel(
    const uint4* __restrict__ xw, const float* __restrict__ global_scale, uint2* __restrict__ codes,
    uint8_t* __restrict__ sf, uint32_t M, uint32_t n_blocks, uint32_t sf_rows, uint32_t sf_cols) {
  __shared__ __align__(16) uint32_t table[128 * 8];
  const float gs = __ldg(global_scale);
  const uint32_t n_real = M * n_blocks;                     // < 2^31 (the caller checks)
  const uint32_t stride = gridDim.x * blockDim.x;
  uint32_t blk = blockIdx.x * blockDim.x + threadIdx.x;
  // the first block's loads go out before the table is built
  uint4 a = make_uint4(0, 0, 0, 0), b = a;
  if (blk < n_real) { a = xw[2 * (size_t)blk]; b = xw[2 * (size_t)blk + 1]; }

  // the table: row = scale byte (0..127), words 0..6 = X_j | X_j << 16; sf = 0 and byte 0x7F: 0x7FFF
  for (int e = threadIdx.x; e < 128 * 8; e += blockDim.x) {
    const int byte = e >> 3, j = e & 7;
    int X = 0;
    if (j < 7) {
      if (byte == 0 || byte == 0x7F) {
        X = 0x7FFF;
      } else {
        const float sfv = e4m3_value((uint32_t)byte);
        const float t = j == 0 ? 0.25f : j == 1 ? 0.75f : j == 2 ? 1.25f : j == 3 ? 1.75f : j == 4 ? 2.5f : j == 5 ? 3.5f : 5.0f;
        X = threshold<IS_BF16>(sfv, gs, t, (j & 1) != 0);
      }
    }
    table[e] = (uint32_t)X | ((uint32_t)X << 16);
  }
  __syncthreads();

  // (row, column) of the block, carried along the grid-stride loop without a division per block
  uint32_t r = blk / n_blocks, c = blk - r * n_blocks;
  const uint32_t dr = stride / n_blocks, dc = stride - dr * n_blocks;
  for (; blk < n_real; blk += stride) {
    const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    const uint32_t next = blk + stride;
    if (next < n_real) { a = xw[2 * (size_t)next]; b = xw[2 * (size_t)next + 1]; }   // prefetch

    uint32_t m01 = absmax_x2<IS_BF16>(w[0], w[1]), m23 = absmax_x2<IS_BF16>(w[2], w[3]);
    uint32_t m45 = absmax_x2<IS_BF16>(w[4], w[5]), m67 = absmax_x2<IS_BF16>(w[6], w[7]);
    const uint32_t m = absmax_x2<IS_BF16>(absmax_x2<IS_BF16>(m01, m23), absmax_x2<IS_BF16>(m45, m67));
    float m_lo, m_hi;
    unpack_pair<IS_BF16>(m, m_lo, m_hi);
    const float amax = fmaxf(fabsf(m_lo), fabsf(m_hi));
    const uint32_t sf_byte = e4m3_byte(fminf(div6_rn(__fmul_rn(gs, amax)), 448.0f));

    const uint4 t0 = *reinterpret_cast<const uint4*>(&table[sf_byte * 8]);
    const uint4 t1 = *reinterpret_cast<const uint4*>(&table[sf_byte * 8 + 4]);
    const uint32_t X[7] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z};
    uint32_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = code_byte_table<IS_BF16>(w[i], X);
    const uint32_t lo4 = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
    const uint32_t hi4 = __byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410);
    codes[blk] = make_uint2(lo4, hi4);
    if (SWIZZLED) {
      sf[((size_t)(r >> 7) * (sf_cols >> 2) + (c >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (c & 3)] = (uint8_t)sf_byte;
    } else {
      sf[blk] = (uint8_t)sf_byte;
    }
    c += dc;
    r += dr;
    if (c >= n_blocks) { c -= n_blocks; ++r; }
  }

  // the padded entries of the swizzled grid: rows M..sf_rows-1 (all columns), then columns
  // n_blocks..sf_cols-1 of rows < M; zeros
  if (SWIZZLED && WRITE_PADDING) {
    const uint32_t pad_rows = (sf_rows - M) * sf_cols, pad_cols = M * (sf_cols - n_blocks);
    for (uint32_t e = blockIdx.x * blockDim.x + threadIdx.x; e < pad_rows + pad_cols; e += stride) {
      uint32_t pr, pc;
      if (e < pad_rows) { pr = M + e / sf_cols; pc = e - (pr - M) * sf_cols; }
      else { const uint32_t f = e - pad_rows, w = sf_cols - n_blocks; pr = f / w; pc = n_blocks + (f - pr * w); }
      sf[((size_t)(pr >> 7) * (sf_cols >> 2) + (pc >> 2)) * 512 + (pr & 31) * 16 + ((pr >> 5) & 3) * 4 + (pc & 3)] = 0;
    }
  }
}

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING>
static cudaError_t launch_table(const void* x, const float* gs, void* codes, void* sf, uint32_t M, uint32_t n_blocks,
                                uint32_t sf_rows, uint32_t sf_cols, int device, cudaStream_t stream) {
  auto kernel = nvfp4_quant_table_kernel<IS_BF16, SWIZZLED, WRITE_PADDING>;
  int sms = 0, per_sm = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kTableThreads, 0);
  if (err != cudaSuccess) return err;
  const uint64_t need = ((uint64_t)M * n_blocks + kTableThreads - 1) / kTableThreads;
  const uint64_t resident = (uint64_t)sms * (per_sm > 0 ? per_sm : 1);
  const uint32_t grid = (uint32_t)(need < resident ? (need > 0 ? need : 1) : resident);
  kernel<<<grid, kTableThreads, 0, stream>>>(static_cast<const uint4*>(x), gs, static_cast<uint2*>(codes),
                                              static_cast<uint8_t*>(sf), M, n_blocks, sf_rows, sf_cols);
  return cudaGetLastError();
}

}  // namespace nvfp4

// Host launcher. x: [M, K] fp16|bf16, contiguous, 16-byte aligned; global_scale: fp32 [1] on the
// device; codes: uint8 [M, K/2] (8-byte aligned); sf: uint8 storage [sf_rows, sf_cols] (swizzled:
// round_up(M,128) x round_up(K/16,4); linear: M x K/16). sf_rows * sf_cols < 2^31 (the caller
// checks); device: x's CUDA device; stream: a stream of that device. Returns the launch's
// cudaError_t (0 = success).
extern "C" int nvfp4_quant_cuda(const void* x, const float* global_scale, void* codes, void* sf,
                                int M, int K, int sf_rows, int sf_cols, int is_bf16, int swizzled,
                                int write_padding, int device, cudaStream_t stream) {
  if (M <= 0 || K <= 0) return (int)cudaSuccess;
  int current = -1;   // this library's CUDA runtime keeps its own current device: use x's
  if (cudaGetDevice(&current) != cudaSuccess || current != device) {
    const cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return (int)err;
  }
  const uint32_t m = (uint32_t)M, nb = (uint32_t)(K / 16), rows = (uint32_t)sf_rows, cols = (uint32_t)sf_cols;
  if (is_bf16) {
    if (!swizzled) nvfp4::launch<true, false, true>(x, global_scale, codes, sf, m, nb, rows, cols, stream);
    else if (write_padding) nvfp4::launch<true, true, true>(x, global_scale, codes, sf, m, nb, rows, cols, stream);
    else nvfp4::launch<true, true, false>(x, global_scale, codes, sf, m, nb, rows, cols, stream);
  } else {
    if (!swizzled) nvfp4::launch<false, false, true>(x, global_scale, codes, sf, m, nb, rows, cols, stream);
    else if (write_padding) nvfp4::launch<false, true, true>(x, global_scale, codes, sf, m, nb, rows, cols, stream);
    else nvfp4::launch<false, true, false>(x, global_scale, codes, sf, m, nb, rows, cols, stream);
  }
  return (int)cudaGetLastError();
}

// The TABLE variant's host launcher: the same arguments and the same bytes as nvfp4_quant_cuda.
extern "C" int nvfp4_quant_cuda_table(const void* x, const float* global_scale, void* codes, void* sf,
                                      int M, int K, int sf_rows, int sf_cols, int is_bf16, int swizzled,
                                      int write_padding, int device, cudaStream_t stream) {
  if (M <= 0 || K <= 0) return (int)cudaSuccess;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) {
    const cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) return (int)err;
  }
  const uint32_t m = (uint32_t)M, nb = (uint32_t)(K / 16), rows = (uint32_t)sf_rows, cols = (uint32_t)sf_cols;
  cudaError_t err;
  if (is_bf16) {
    if (!swizzled) err = nvfp4::launch_table<true, false, true>(x, global_scale, codes, sf, m, nb, rows, cols, device, stream);
    else if (write_padding) err = nvfp4::launch_table<true, true, true>(x, global_scale, codes, sf, m, nb, rows, cols, device, stream);
    else err = nvfp4::launch_table<true, true, false>(x, global_scale, codes, sf, m, nb, rows, cols, device, stream);
  } else {
    if (!swizzled) err = nvfp4::launch_table<false, false, true>(x, global_scale, codes, sf, m, nb, rows, cols, device, stream);
    else if (write_padding) err = nvfp4::launch_table<false, true, true>(x, global_scale, codes, sf, m, nb, rows, cols, device, stream);
    else err = nvfp4::launch_table<false, true, false>(x, global_scale, codes, sf, m, nb, rows, cols, device, stream);
  }
  return (int)err;
}
