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
