// Fused SiLU-mul + FP8 (E4M3) group quantization with packed UE8M0 scales, in CUDA C++: the same
// bytes as the Triton kernel `silu_mul_quant_fp8_kernel` (kernels/fp8.py, EMULATE=False), written
// to be read side by side with it. Device code and a C launcher only: no torch header, so
// `nvcc -arch=sm_90 -c fp8.cu` compiles it on its own. The Python side (workbook/fp8.py,
// backend="cuda") allocates, checks, and passes raw pointers and a stream.
//
//   y = bf16(bf16(silu(gate)) * up), silu(g) = g / (1 + exp(-g)) in fp32 (torch's sequence: CUDA's
//       accurate expf and IEEE division, or a cheaper one proven to give the same bf16 on every
//       gate, see silu_f32), each result rounded to nearest even to bf16 (cvt.rn.bf16x2.f32);
//   per group of 128 along N: e = the UE8M0 exponent from amax's bits (as the Triton kernel computes
//       it), q = e4m3_rne_satfinite(y * 2^-e) (cvt.rn.satfinite.e4m3x2.f32; the product is exact);
//   exponent bytes e + 127 packed four to an int32, group 4p+j in bits 8j..8j+7 (groups past G: 0),
//       stored MN-major: word p of row m at scales[p * stride_sp + m] (stride_sp = round_up(M, 4)).
//
// One warp per (row m, packed word p), as one Triton program per (rows, word p): the warp owns the
// 512 columns of groups 4p..4p+3, so it builds the whole word and stores it once (no read-modify-
// write of a shared word, no zero fill needed). Lane l, step t in {0, 1} handles 8 consecutive
// columns 512p + 256t + 8l: 16-byte loads of gate and up, an 8-byte store of codes; the 16 lanes of a
// half-warp hold one group, reduced with 4 shuffles. Rows M..round_up(M,4)-1 of the scale storage
// are outside the returned view and are not written, as in Triton.
#include <cuda_runtime.h>
#include <stdint.h>

namespace fp8q {

constexpr int GROUP = 128;

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// y = bf16(bf16(silu(gate)) * up). Triton: _silu_mul_bf16.
// FAST = false: torch's own sequence, CUDA's accurate expf and the IEEE division (__fdiv_rn), as
//   Triton's SILU_IMPL = 0 (libdevice expf, div_rn).
// FAST = true: ex2.approx of -gate * log2(e) and the approximate div.full.f32, the kind of
//   instructions Triton's tl.exp and default division lower to (its SILU_IMPL = 3). Only bf16(silu)
//   matters and a bf16 gate has 65536 values, so the launcher uses FAST only after proving, on this
//   GPU and for every finite gate, that it gives torch's bf16 silu (workbook.fp8.silu_fast_is_exact;
//   the same proof as workbook.fp8.silu_impl).
template <bool FAST>
__device__ __forceinline__ float silu_f32(float gate) {
  if (FAST) {
    // ex2.approx.ftz: a subnormal argument or result would only meet 1 + e, which is 1 either way
    float t = __fmul_rn(-gate, 1.4426950216293335f), e, s;   // log2(e) in fp32
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
    asm("div.full.f32 %0, %1, %2;" : "=f"(s) : "f"(gate), "f"(__fadd_rn(1.0f, e)));
    return s;
  }
  return __fdiv_rn(gate, __fadd_rn(1.0f, expf(-gate)));
}

// Two fp32 -> two bf16 (round to nearest even) in one word, lo in the low half: cvt.rn.bf16x2.f32
// rounds two values in one instruction (Triton: round_to_bf16 of a pair, b_y.to(tl.bfloat16)).
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// y of a pair of elements (gate word g, up word u: element 2i low half, 2i+1 high half), as the
// bf16 word of the two results.
template <bool FAST>
__device__ __forceinline__ uint32_t silu_mul_bf16x2(uint32_t g, uint32_t u) {
  const uint32_t s = bf16x2_rn(silu_f32<FAST>(bf16_lo(g)), silu_f32<FAST>(bf16_hi(g)));
  // bf16 * bf16 has at most 16 significant bits: exact in fp32, then one rounding
  return bf16x2_rn(__fmul_rn(bf16_lo(s), bf16_lo(u)), __fmul_rn(bf16_hi(s), bf16_hi(u)));
}

// Two fp32 -> two E4M3 bytes (round to nearest even, saturating): a in the low byte, b in the high.
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
  unsigned short two;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(two) : "f"(b), "f"(a));
  return two;
}

template <bool SILU_MUL, bool FAST>
__global__ void __launch_bounds__(128) silu_mul_quant_fp8_kernel(
    const uint16_t* __restrict__ x,   // [M, 2N] bf16 (gate | up) when SILU_MUL, else y [M, N] bf16
    uint8_t* __restrict__ codes,      // [M, N] E4M3 bytes, row stride stride_cm
    int32_t* __restrict__ scales,     // storage int32 [P, stride_sp]: word p of row m at p*stride_sp + m
    uint32_t M, uint32_t N, uint32_t P,  // rows, columns, packed words per row = ceil(N/512)
    uint64_t stride_xm, uint64_t stride_cm, uint32_t stride_sp) {
  const uint32_t warp = (uint32_t)(((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const uint32_t lane = threadIdx.x & 31;
  if (warp >= M * P) return;                       // whole warps only (blockDim is a multiple of 32)
  const uint32_t m = warp / P;                     // Triton: o_m
  const uint32_t p = warp - m * P;                 // Triton: pid_p
  const uint16_t* row = x + m * stride_xm;

  // load everything first (64 bytes of gate and 64 of up in flight per lane); a half-warp whose
  // group is past N (the last word of a row may hold fewer than 4 groups) loads nothing (Triton: m_g)
  uint4 g[2], u[2];
  bool valid[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const uint32_t col = 512 * p + 256 * t + 8 * lane;
    valid[t] = col < N;
    g[t] = u[t] = make_uint4(0, 0, 0, 0);
    if (valid[t]) {
      g[t] = *reinterpret_cast<const uint4*>(row + col);
      if (SILU_MUL) u[t] = *reinterpret_cast<const uint4*>(row + N + col);
    }
  }

  uint32_t e_byte[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const uint32_t gw[4] = {g[t].x, g[t].y, g[t].z, g[t].w};
    const uint32_t uw[4] = {u[t].x, u[t].y, u[t].z, u[t].w};
    float y[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {                   // Triton: b_y (bf16_to_fp32, _silu_mul_bf16)
      const uint32_t w = SILU_MUL ? silu_mul_bf16x2<FAST>(gw[i], uw[i]) : gw[i];
      y[2 * i] = bf16_lo(w);
      y[2 * i + 1] = bf16_hi(w);
    }
    // group amax over the 16 lanes of this half-warp (Triton: b_amax = tl.max(tl.abs(b_y), axis=2))
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(y[i]));
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, off));

    // UE8M0 exponent from amax's bits (Triton: b_abits, b_e, b_inv): e = ceil(log2(max(amax/448,
    // 1e-10))) without a division or a log; 2^-e built from its bits
    const uint32_t abits = __float_as_uint(amax);
    int e = (int)((abits >> 23) & 0xFFu) - 135 + ((abits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
    e = max(e, -33);
    const float inv = __uint_as_float((uint32_t)(127 - e) << 23);

    // codes: y * 2^-e is exact and within +-448; E4M3 bytes two at a time (Triton: b_v, b_q)
    uint32_t q01 = e4m3x2(__fmul_rn(y[0], inv), __fmul_rn(y[1], inv));
    uint32_t q23 = e4m3x2(__fmul_rn(y[2], inv), __fmul_rn(y[3], inv));
    uint32_t q45 = e4m3x2(__fmul_rn(y[4], inv), __fmul_rn(y[5], inv));
    uint32_t q67 = e4m3x2(__fmul_rn(y[6], inv), __fmul_rn(y[7], inv));
    if (valid[t]) {
      const uint32_t col = 512 * p + 256 * t + 8 * lane;
      *reinterpret_cast<uint2*>(codes + m * stride_cm + col) = make_uint2(q01 | (q23 << 16), q45 | (q67 << 16));
    }
    e_byte[t] = valid[t] ? (uint32_t)(e + 127) : 0u;   // Triton: b_byte (groups >= G are 0)
  }

  // the word: group 4p + 2t + h (h = half-warp) in bits 8(2t+h) (Triton: b_word); lane 0 stores it
  const uint32_t hi0 = __shfl_sync(0xFFFFFFFFu, e_byte[0], 16);
  const uint32_t hi1 = __shfl_sync(0xFFFFFFFFu, e_byte[1], 16);
  if (lane == 0) {
    const uint32_t word = e_byte[0] | (hi0 << 8) | (e_byte[1] << 16) | (hi1 << 24);
    scales[(uint64_t)p * stride_sp + m] = (int32_t)word;
  }
}

// The SiLU-mul alone, elementwise on bf16 arrays (the exhaustive proof of FAST runs it).
template <bool FAST>
__global__ void __launch_bounds__(256) silu_mul_bf16_kernel(const uint16_t* __restrict__ gate,
                                                            const uint16_t* __restrict__ up,
                                                            uint16_t* __restrict__ y, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  y[i] = (uint16_t)silu_mul_bf16x2<FAST>(gate[i], up[i]);   // the low half: element i
}

static int use_device(int device) {
  int current = -1;   // this library's CUDA runtime keeps its own current device: use the tensors'
  if (cudaGetDevice(&current) != cudaSuccess || current != device) return (int)cudaSetDevice(device);
  return (int)cudaSuccess;
}

template <bool SILU_MUL, bool FAST>
static void launch(const void* x, void* codes, void* scales, uint32_t M, uint32_t N, uint32_t P,
                   long long stride_xm, long long stride_cm, int stride_sp, cudaStream_t stream) {
  const uint64_t warps = (uint64_t)M * P;
  const uint32_t threads = 128, per_block = threads / 32;
  const uint32_t blocks = (uint32_t)((warps + per_block - 1) / per_block);
  silu_mul_quant_fp8_kernel<SILU_MUL, FAST><<<blocks, threads, 0, stream>>>(
      static_cast<const uint16_t*>(x), static_cast<uint8_t*>(codes), static_cast<int32_t*>(scales),
      M, N, P, (uint64_t)stride_xm, (uint64_t)stride_cm, (uint32_t)stride_sp);
}

}  // namespace fp8q

// Host launcher. x: bf16, [M, 2N] (silu_mul = 1) or [M, N] (silu_mul = 0), rows stride_xm elements
// apart, 16-byte aligned rows; codes: uint8 [M, N], rows stride_cm bytes apart (8-byte aligned);
// scales: int32 storage [ceil(N/512), stride_sp]. N % 128 == 0; M * ceil(N/512) < 2^31 (the caller
// checks); silu_fast: the FAST silu (only once proven exact); device: x's CUDA device; stream: a
// stream of that device. Returns the launch's cudaError_t (0 = success).
extern "C" int silu_mul_quant_fp8_cuda(const void* x, void* codes, void* scales, int M, int N,
                                       long long stride_xm, long long stride_cm, int stride_sp,
                                       int silu_mul, int silu_fast, int device, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return (int)cudaSuccess;
  const int err = fp8q::use_device(device);
  if (err) return err;
  const uint32_t P = (uint32_t)((N + 4 * fp8q::GROUP - 1) / (4 * fp8q::GROUP));
  const uint32_t m = (uint32_t)M, n = (uint32_t)N;
  if (!silu_mul) fp8q::launch<false, false>(x, codes, scales, m, n, P, stride_xm, stride_cm, stride_sp, stream);
  else if (silu_fast) fp8q::launch<true, true>(x, codes, scales, m, n, P, stride_xm, stride_cm, stride_sp, stream);
  else fp8q::launch<true, false>(x, codes, scales, m, n, P, stride_xm, stride_cm, stride_sp, stream);
  return (int)cudaGetLastError();
}

// y[i] = bf16(bf16(silu(gate[i])) * up[i]) for n bf16 values (the kernel's own sequence).
extern "C" int silu_mul_bf16_cuda(const void* gate, const void* up, void* y, int n, int silu_fast,
                                  int device, cudaStream_t stream) {
  if (n <= 0) return (int)cudaSuccess;
  const int err = fp8q::use_device(device);
  if (err) return err;
  const uint32_t threads = 256, blocks = ((uint32_t)n + threads - 1) / threads;
  const uint16_t* g = static_cast<const uint16_t*>(gate);
  const uint16_t* u = static_cast<const uint16_t*>(up);
  uint16_t* out = static_cast<uint16_t*>(y);
  if (silu_fast) fp8q::silu_mul_bf16_kernel<true><<<blocks, threads, 0, stream>>>(g, u, out, (uint32_t)n);
  else fp8q::silu_mul_bf16_kernel<false><<<blocks, threads, 0, stream>>>(g, u, out, (uint32_t)n);
  return (int)cudaGetLastError();
}

// A readable message for a cudaError_t returned by the launchers.
extern "C" const char* workbook_cuda_error_string(int err) {
  return cudaGetErrorString((cudaError_t)err);
}
