// NVFP4 quantization in CUDA C++: the same bytes as the Triton `nvfp4_quant_kernel` (kernels/nvfp4.py),
// by another route. Device code and C launchers only (no torch header: it compiles alone); workbook/nvfp4.py
// (backend="cuda") checks, allocates and passes raw pointers and torch's stream; workbook/nvcc.py builds it.
//
// Format: per 16-element block of a row, amax = max |x| (fp16/bf16 -> fp32), the scale
//   sf = e4m3_rne_satfinite(min(RN(gs * amax) / 6 (correctly rounded), 448)),
// per element the E2M1 code of RN(RN(x * gs) / sf), ties to the even index, saturated at 6 (sf = 0: index
// 0); bit 3 of a code is the sign bit of x; element 2i is the low nibble.
//
// Thresholds, not division. For scale byte b and decision point t_j (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5),
// X_j(b) is the largest pattern of x's format (>= 0) whose |x| does NOT pass t_j: passing is
// RN(|x| gs) > t_j sf (a tie goes down: t = 0.25, 1.25, 2.5, 5) or >= t_j sf (up: 0.75, 1.75, 3.5). The
// Triton kernel's docstring proves this is the rounding of RN(RN(|x| gs) / sf); RN(|x| gs) never decreases
// as |x| grows, so the index is the number of thresholds below |x|, compared in x's own format, two
// elements per instruction (set.gt.u32.bf16x2 / .f16x2): no conversion, no division per element.
// Closed form (threshold_word): p0 = RN(T / gs) (T = t_j sf, exact) rounded toward zero into x's format,
// and X_j = p0 - 1, p0 or p0 + 1 by testing whether p0 and p0 + 1 pass: neighbours of the format differ
// by >= 2^-11 relatively (bf16 2^-8), each fp32 rounding by <= 2^-24, so p0 - 1 never passes and p0 + 2
// always does (subnormals alike); p0 is clamped to the largest finite pattern, past which all passes (so
// gs = 0, inf, NaN, < 0 are covered). tests/test_cuda.py checks it against a binary search.
//
// Work: a CTA of 256 threads per tile of 128 rows x kC blocks (wide: kC = 32; narrow: 8), or per row
// piece of a wide tile (the tail); a thread per block column, 32/kC rows per warp per step. Per step: the
// next step's two 16-byte loads first; the block amax (max.xorsign.abs on pairs), the scale byte
// (cvt.rn.satfinite.e4m3x2.f32), its 7 thresholds from shared memory, and per word a binary search
// (code_pair: 3 packed comparisons whose masks are the index's bits and pick the next threshold). The
// threshold table (128 scale bytes x 8 words): within one wave each CTA builds its own while its first
// loads are in flight; past one wave nvfp4_threshold_table_kernel builds it once per call. The scale bytes
// gather in shared memory and leave as whole 512-byte swizzled tiles, 16 bytes per thread: a 32-byte
// sector holds 8 rows x 4 columns, and storing each byte as it goes would write it 4 bytes at a time.
//
// The tail (the launch rule, plan()). P = SMs x resident wide CTAs per SM; N wide tiles. Past one wave, a
// thin last wave (under 90% of P) goes to a second launch, each wide tile as 4 narrow ones. Within one
// wave (N = k SMs + r), k SMs whole tiles and the r others by how many SMs they would burden: 2r <= SMs,
// row pieces in the same launch (quarters of 32 rows if 4r <= SMs, else halves; quarter s = rows
// 32g + 8s .. 32g + 8s + 7, bytes 128s .. 128s + 127 of each scale tile); 8r <= 7 SMs, narrow tiles in a
// second launch; else whole tiles. The rule reads N, the SM count and the occupancy, no shape.
// Launch order (griddepcontrol): the first launch is ordinary (after whatever wrote x and gs): past one
// wave the table kernel, whose programmatic dependent, the wide launch, waits for it before reading the
// table. The narrow launch is the wide one's programmatic dependent (a wide CTA signals once it has its
// table, so a narrow CTA reads a finished one); it writes disjoint tiles and never waits for the wide one.
//
// Coverage (why `empty` is right for both outputs):
// * codes: the wide tiles cover all M x K/16 blocks, each quantized whole, as 4 or 2 row pieces (all 16
//   steps) or as 4 narrow pieces (one past column K/16 holds no block); a real block's thread stores it.
// * scales, swizzled: a tile's CTA stores its whole 512-byte tiles, padding included (rows >= M, columns
//   >= K/16 hold 0; a tile's pieces store their 128-byte runs, all four together); the tiles cover the
//   padded grid round_up(M,128) x round_up(K/16,4) (a last column tile stores the 512-byte tiles that exist;
//   column round_up(K/16,4) - 1 is in the piece holding column K/16 - 1). WRITE_PADDING=false stores only
//   the real entries: the regression the workbook teaches. Linear [M, K/16]: a real block's thread, its byte.
// * table: past one wave the table kernel writes all 1024 scratch words before any quantizer CTA reads
//   them; within one wave a CTA's threads write its shared table before the barrier; scratch unread.
//
// Decisions in force (how the kernel got its shape, and the figures behind it: notebook 02's appendix):
// * a binary search, not a count of 7 thresholds: fewer instructions where the power cap sets the clock.
// * one CTA per tile, __launch_bounds__(256, 6): about 40 registers, 6 CTAs per SM (fp16 narrow: 5).
// * The loop's bookkeeping: steps walked by a block index, n_real known before the loop, the trip count
//   kept at compile time so that ptxas issues the next step's loads first (tests/test_cuda.py holds it).
// * no deeper prefetch (L2 bulk prefetch, cp.async stages in shared memory): slower where measured.
// * sm_100a+ (NVFP4_HW_E2M1): cvt.rn.satfinite.e2m1x2.f32 on RN(RN(x gs)/sf), same codes; sm_90 lacks it.
#include <cuda_runtime.h>
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM110_ALL) || defined(__CUDA_ARCH_FEAT_SM120_ALL) || \
    defined(__CUDA_ARCH_FEAT_SM121_ALL)
#define NVFP4_HW_E2M1 1   // cvt.rn.satfinite.e2m1x2.f32 exists on this target
#else
#define NVFP4_HW_E2M1 0   // sm_90 and others: the thresholds
#endif

namespace nvfp4 {

constexpr int kRows = 128, kWide = 32, kNarrow = 8, kThreads = 256, kWarps = 8;   // tiles: 128 x kWide | kNarrow blocks
constexpr int kMinBlocks = 6;   // resident CTAs per SM that __launch_bounds__ asks for: <= 40 registers
// fp16's narrow kernel: 5 (<= 48 registers): held to 40 it spills 8 bytes per block, and the 5-CTA
// version was the faster (notebook 02's appendix).
constexpr int kMinBlocksNarrowF16 = 5;

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

// One pattern of x's format (bf16 or fp16, low 16 bits) as fp32. Exact.
template <bool IS_BF16>
__device__ __forceinline__ float format_value(uint32_t v) {
  float lo, hi;
  unpack_pair<IS_BF16>(v, lo, hi);
  return lo;
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

template <bool IS_BF16> __device__ __forceinline__ uint32_t max_finite() { return IS_BF16 ? 0x7F7Fu : 0x7BFFu; }

// x's format from fp32, rounded toward zero, as a pattern (a negative or NaN value gives >= 0x8000).
template <bool IS_BF16>
__device__ __forceinline__ uint32_t format_rz(float q) {
  if (IS_BF16) return __float_as_uint(q) >> 16;
  unsigned short h;
  asm("cvt.rz.f16.f32 %0, %1;" : "=h"(h) : "f"(q));
  return h;
}

// table[8 b + j] = X_j(b) | X_j(b) << 16 (j < 7; word 7 of each row is 0), in closed form (the header).
// Byte 0 (sf = 0) and the NaN byte 0x7F (never produced: the conversion saturates): nothing finite
// passes, X = the largest finite pattern (an infinite |x| still passes, as RN(inf gs) does).
template <bool IS_BF16>
__device__ __forceinline__ uint32_t threshold_word(uint32_t e, float gs) {
  const uint32_t b = e >> 3, j = e & 7;
  if (j == 7) return 0u;
  uint32_t X = max_finite<IS_BF16>();
  if (b != 0 && b != 0x7F) {
    const float t = j == 0 ? 0.25f : j == 1 ? 0.75f : j == 2 ? 1.25f : j == 3 ? 1.75f : j == 4 ? 2.5f : j == 5 ? 3.5f : 5.0f;
    const float T = __fmul_rn(t, e4m3_value(b));   // exact: 3 x 4 significant bits
    const bool up = (j & 1) != 0;                 // 0.75, 1.75, 3.5: a tie goes up
    const uint32_t p0 = min(format_rz<IS_BF16>(__fdiv_rn(T, gs)), max_finite<IS_BF16>());
    const float v0 = __fmul_rn(format_value<IS_BF16>(p0), gs), v1 = __fmul_rn(format_value<IS_BF16>(p0 + 1), gs);
    const bool pass0 = up ? v0 >= T : v0 > T;
    const bool pass1 = p0 == max_finite<IS_BF16>() || (up ? v1 >= T : v1 > T);   // past the largest: passes
    X = p0 - 1 + (pass0 ? 0u : 1u) + (pass1 ? 0u : 1u);
  }
  return X | (X << 16);
}

// One table of 1024 words per block: block i reads global_scale[i] and writes table[1024 i ...]. A
// call past one wave launches one block; tests launch many (nvfp4_threshold_tables_cuda).
template <bool IS_BF16>
__global__ void __launch_bounds__(1024) nvfp4_threshold_table_kernel(const float* __restrict__ global_scale,
                                                                     uint32_t* __restrict__ table) {
  asm volatile("griddepcontrol.launch_dependents;");   // the quantizer may start (its loads of x)
  table[1024u * blockIdx.x + threadIdx.x] = threshold_word<IS_BF16>(threadIdx.x, global_scale[blockIdx.x]);
}

// The table, read after griddepcontrol.wait: an asm volatile load is never moved above the wait (a
// plain const __restrict__ load was: ptxas issued it as a non-coherent load before the wait).
__device__ __forceinline__ uint4 load_after_wait(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// Per 16-bit half of a word: 0xFFFF where |x| > X (the same half of X), else 0 (set.gt with a .u32
// result: one HSET2 for two elements). a holds |x| (sign bits clear), X a pair of threshold patterns.
template <bool IS_BF16>
__device__ __forceinline__ uint32_t gt_mask(uint32_t a, uint32_t X) {
  uint32_t m;
  if (IS_BF16) {
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(X));
  } else {
    asm("set.gt.u32.f16x2 %0, %1, %2;" : "=r"(m) : "r"(a), "r"(X));
  }
  return m;
}

// The 4-bit codes of one word's elements 2i, 2i+1 in bits 0-3 and 16-19 (bits 4-15, 20-31 clear): the
// magnitude index by a binary search over the 7 thresholds X[0..6] (non-decreasing), per half: bit 2 =
// |x| > X3; bit 1 = |x| > (bit 2 ? X5 : X1); bit 0 = |x| > the threshold that bits 2 and 1 pick of X0, X2,
// X4, X6. For non-decreasing thresholds this is the number of thresholds below |x|. Three packed
// comparisons per word; the picks are bitwise selects on the masks. The sign bit of x (bit 15 of each
// half) becomes bit 3 of its code.
template <bool IS_BF16>
__device__ __forceinline__ uint32_t code_pair(uint32_t w, const uint32_t* X) {
  uint32_t a;
  if (IS_BF16) {
    asm("abs.bf16x2 %0, %1;" : "=r"(a) : "r"(w));
  } else {
    asm("abs.f16x2 %0, %1;" : "=r"(a) : "r"(w));
  }
  const uint32_t m2 = gt_mask<IS_BF16>(a, X[3]);                       // index >= 4
  const uint32_t t1 = (m2 & X[5]) | (~m2 & X[1]);
  const uint32_t hi = (m2 & X[6]) | (~m2 & X[2]), lo = (m2 & X[4]) | (~m2 & X[0]);
  const uint32_t m1 = gt_mask<IS_BF16>(a, t1);                         // bit 1 of the index
  const uint32_t m0 = gt_mask<IS_BF16>(a, (m1 & hi) | (~m1 & lo));     // bit 0
  const uint32_t b21 = (m2 & 0x00040004u) | (m1 & 0x00020002u);
  return b21 | (m0 & 0x00010001u) | ((w >> 12) & 0x00080008u);
}

// Four words' codes -> one word of 8 codes (element order, element 2i in the low nibble of byte i):
// bytes 0 and 2 of each word hold the 4-bit codes of its elements 2i and 2i+1 (code_pair).
__device__ __forceinline__ uint32_t pack4(const uint32_t* a) {
  const uint32_t p01 = __byte_perm(a[0], a[1], 0x6420), p23 = __byte_perm(a[2], a[3], 0x6420);
  const uint32_t lo = __byte_perm(p01, p23, 0x6420), hi = __byte_perm(p01, p23, 0x7531);  // elements 2i, 2i+1
  return hi * 16u + lo;
}

#if NVFP4_HW_E2M1
// Blackwell: the hardware conversion on y = RN(RN(x*gs)/sf) (signed; sf = 0: a zero with x's sign);
// the code byte of one word in the low 8 bits.
template <bool IS_BF16>
__device__ __forceinline__ uint32_t hw_code_byte(uint32_t w, float gs, float sf) {
  float lo, hi;
  unpack_pair<IS_BF16>(w, lo, hi);
  const float y_lo = sf > 0.0f ? __fdiv_rn(__fmul_rn(lo, gs), sf) : copysignf(0.0f, lo);
  const float y_hi = sf > 0.0f ? __fdiv_rn(__fmul_rn(hi, gs), sf) : copysignf(0.0f, hi);
  uint32_t out;
  asm("{\n\t.reg .b8 q;\n\t"
      "cvt.rn.satfinite.e2m1x2.f32 q, %2, %1;\n\t"   // %2 (element 2i+1) -> high nibble
      "cvt.u32.u8 %0, q;\n\t}"
      : "=r"(out) : "f"(y_lo), "f"(y_hi));
  return out;
}
#endif

// The 8 code bytes of one block (words w[0..7]) and its scale byte.
template <bool IS_BF16>
__device__ __forceinline__ uint2 quant_block(const uint32_t* w, float gs, const uint4* s_table, uint32_t& sf_byte) {
  const uint32_t m01 = absmax_x2<IS_BF16>(w[0], w[1]), m23 = absmax_x2<IS_BF16>(w[2], w[3]);
  const uint32_t m45 = absmax_x2<IS_BF16>(w[4], w[5]), m67 = absmax_x2<IS_BF16>(w[6], w[7]);
  const uint32_t m = absmax_x2<IS_BF16>(absmax_x2<IS_BF16>(m01, m23), absmax_x2<IS_BF16>(m45, m67));
  float m_lo, m_hi;
  unpack_pair<IS_BF16>(m, m_lo, m_hi);
  const float amax = fmaxf(fabsf(m_lo), fabsf(m_hi));
  // scale: sf = e4m3(min(gs * amax / 6, 448)) (Triton: b_sf_want, b_sf_byte)
  sf_byte = e4m3_byte(fminf(div6_rn(__fmul_rn(gs, amax)), 448.0f));
#if NVFP4_HW_E2M1
  (void)s_table;
  const float sfv = e4m3_value(sf_byte);
  uint32_t q[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) q[i] = hw_code_byte<IS_BF16>(w[i], gs, sfv);
  return make_uint2(__byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410),
                    __byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410));
#else
  const uint4 t0 = s_table[2 * sf_byte], t1 = s_table[2 * sf_byte + 1];
  const uint32_t X[7] = {t0.x, t0.y, t0.z, t0.w, t1.x, t1.y, t1.z};
  uint32_t a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = code_pair<IS_BF16>(w[i], X);
  return make_uint2(pack4(a), pack4(a + 4));
#endif
}

// One CTA's share of a tile: the whole tile (kPiece = false: kSteps steps of kStepRows rows, the loop
// the kernel was tuned with), or a row piece of the wide launch (kPiece = true: 2^lj quarters from
// quarter s0, quarter s being the rows 32g + 8s .. 32g + 8s + 7, g < 4; they fill the bytes
// 128s .. 128s + 127 of each 512-byte scale tile). Two loops, so the whole tile's keeps a compile-time
// row stride and no per-step row arithmetic (the header, "The loop's bookkeeping"; one loop for both, with
// a runtime step pattern, ran whole tiles slower: notebook 02's appendix).
template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING, int kC, bool kPiece>
__device__ __forceinline__ void quant_tile(const uint4* __restrict__ xw, const uint4* table, bool own_table,
                                           const float* __restrict__ global_scale, uint2* __restrict__ codes,
                                           uint8_t* __restrict__ sf, uint32_t M, uint32_t n_blocks, uint32_t sf_cols,
                                           uint32_t wide, uint32_t c0_off, uint32_t s0, uint32_t lj,
                                           uint4* s_table, uint8_t* s_sf) {
  constexpr bool kIsWide = kC == kWide;
  constexpr int kSub = 32 / kC, kStepRows = kWarps * kSub, kSteps = kRows / kStepRows;   // rows per warp, per step
  const uint32_t lane = threadIdx.x & (kC - 1);                                // block column in the tile
  const uint32_t wrow = (threadIdx.x >> 5) * kSub + ((threadIdx.x & 31) / kC);  // row in the step
  const uint32_t n_wide = (n_blocks + kWide - 1) / kWide;                        // wide column tiles
  const uint32_t rg = wide / n_wide;                                             // row group (128 rows)
  const uint32_t c0 = (wide - rg * n_wide) * kWide + c0_off;
  if (!kIsWide && c0 >= n_blocks) return;   // a piece past the last column: no block, no scale column
  const uint32_t c = c0 + lane;
  // step j's row: whole tile r0 + j kStepRows; piece rows 32 (j % 4) + 8 (s0 + j / 4) + wrow of the tile
  const uint32_t r0 = rg * kRows + wrow + (kPiece ? 8 * s0 : 0u);

  // whole tile: the steps j < n_real have their row below M (none in a column past K/16)
  const uint32_t n_real = kPiece || c >= n_blocks || r0 >= M ? 0u : min((uint32_t)kSteps, (M - r0 + kStepRows - 1) / kStepRows);
  const size_t b0 = (size_t)r0 * n_blocks + c;   // step 0's block
  // the first step's row: loaded before the table is built or waited for
  uint4 nxt0 = make_uint4(0, 0, 0, 0), nxt1 = nxt0;
  if (kPiece ? r0 < M && c < n_blocks : n_real > 0) {
    nxt0 = __ldcs(xw + 2 * b0);
    nxt1 = __ldcs(xw + 2 * b0 + 1);
  }
  const float gs = __ldg(global_scale);
  if (own_table) {   // one wave: thread t builds words 4t .. 4t + 3 (scale byte t / 2, points 4 (t % 2) ..)
    const uint32_t e = 4 * threadIdx.x;
    s_table[threadIdx.x] = make_uint4(threshold_word<IS_BF16>(e, gs), threshold_word<IS_BF16>(e + 1, gs),
                                      threshold_word<IS_BF16>(e + 2, gs), threshold_word<IS_BF16>(e + 3, gs));
    if (kIsWide) asm volatile("griddepcontrol.launch_dependents;");   // the narrow launch may start
  } else {           // past one wave: the table kernel's words
    if (kIsWide) {
      asm volatile("griddepcontrol.wait;" ::: "memory");   // the table kernel has finished
      asm volatile("griddepcontrol.launch_dependents;");    // the narrow launch may start (the table is done)
    }
    s_table[threadIdx.x] = load_after_wait(table + threadIdx.x);
  }
  __syncthreads();

  // the scale byte of the tile's row lr (< 128), column lane: row-major in shared memory, kC + 4 bytes a row
  // (a warp's 32 bytes of one row share 8 words; the final gather's 32 rows fall in 32 different banks)
  constexpr uint32_t kSfRow = kC + 4;
  auto sf_at = [&](uint32_t lr) -> uint32_t { return lr * kSfRow + lane; };
  if constexpr (kPiece) {
    const uint32_t n_steps = 4u << lj;
    auto row = [&](uint32_t j) -> uint32_t { return r0 + 32 * (j & 3) + 8 * (j >> 2); };
#pragma unroll 1
    for (uint32_t j = 0; j < n_steps; ++j) {
      const uint32_t r = row(j), rn = row(j + 1);
      const uint32_t w[8] = {nxt0.x, nxt0.y, nxt0.z, nxt0.w, nxt1.x, nxt1.y, nxt1.z, nxt1.w};
      if (j + 1 < n_steps && rn < M && c < n_blocks) {   // the next step's loads go out first
        const size_t b = (size_t)rn * n_blocks + c;
        nxt0 = __ldcs(xw + 2 * b);
        nxt1 = __ldcs(xw + 2 * b + 1);
      }
      uint32_t sf_byte = 0;                                      // padded entries: 0
      if (r < M && c < n_blocks) {
        const size_t blk = (size_t)r * n_blocks + c;
        codes[blk] = quant_block<IS_BF16>(w, gs, s_table, sf_byte);
        if (!SWIZZLED) sf[blk] = (uint8_t)sf_byte;
      }
      if (SWIZZLED) s_sf[sf_at(r & 127)] = (uint8_t)sf_byte;
    }
  } else {
    // A whole tile: the thread's steps 0 .. n_real - 1 hold real blocks (rows below M of a column below
    // K/16); its block index steps kStepRows rows at a time, no row arithmetic per step; the trip count
    // stays kSteps, so that ptxas issues the next step's loads first (the header, "The loop's bookkeeping").
    const uint32_t stride = kStepRows * n_blocks;        // blocks from one step's row to the next
    uint32_t blk = (uint32_t)b0;                          // M * K/16 < 2^31: a block index fits
#pragma unroll 1
    for (uint32_t j = 0; j < kSteps; ++j, blk += stride) {
      const uint32_t w[8] = {nxt0.x, nxt0.y, nxt0.z, nxt0.w, nxt1.x, nxt1.y, nxt1.z, nxt1.w};
      if (j + 1 < n_real) {   // the next step's loads go out first
        const uint4* px = xw + 2 * (size_t)(blk + stride);
        nxt0 = __ldcs(px);
        nxt1 = __ldcs(px + 1);
      }
      uint32_t sf_byte = 0;   // padded entries: 0
      if (j < n_real) {
        codes[blk] = quant_block<IS_BF16>(w, gs, s_table, sf_byte);
        if (!SWIZZLED) sf[blk] = (uint8_t)sf_byte;
      }
      if (SWIZZLED) s_sf[sf_at(wrow + j * kStepRows)] = (uint8_t)sf_byte;
    }
  }
  if (SWIZZLED) {   // complete: store the tile's whole 512-byte tiles (a piece: its runs of them), 16 bytes per thread
    __syncthreads();
    const uint32_t cg0 = c0 / 4, n_cg = min((uint32_t)(kC / 4), (sf_cols >> 2) - cg0);
    // whole tile: byte 16 t of its kC/4 x 512 bytes; piece: 8 x 2^lj threads per 512-byte tile, from 128 s0
    const uint32_t t = kPiece ? threadIdx.x >> (3 + lj) : threadIdx.x >> 5;    // the thread's 512-byte tile
    const uint32_t off = kPiece ? t * 512 + 128 * s0 + (threadIdx.x & ((8u << lj) - 1)) * 16 : threadIdx.x * 16;
    if (t < n_cg) {
      uint8_t* dst = sf + ((size_t)rg * (sf_cols >> 2) + cg0) * 512 + off;
      // the 16 bytes at `off` of a 512-byte tile hold its rows rr + 32 q (q < 4), 4 columns each: the word
      // of each row in shared memory
      const uint32_t rr = (off & 511) >> 4;
      const uint32_t* rw = reinterpret_cast<const uint32_t*>(s_sf + rr * kSfRow + 4 * t);
      constexpr uint32_t kQ = 32 * kSfRow / 4;   // words from row rr to row rr + 32
      const uint4 v = make_uint4(rw[0], rw[kQ], rw[2 * kQ], rw[3 * kQ]);
      if (WRITE_PADDING) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else {   // the regression: padded entries (row >= M or column >= K/16) left as they were
        const uint8_t* vb = reinterpret_cast<const uint8_t*>(&v);
        for (int k = 0; k < 16; ++k) {
          const uint32_t o = off + k;
          const uint32_t tr = rg * kRows + ((o >> 2) & 3) * 32 + ((o & 511) >> 4), tc = (cg0 + (o >> 9)) * 4 + (o & 3);
          if (tr < M && tc < n_blocks) dst[k] = vb[k];
        }
      }
    }
  }
}

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING, int kC>
__global__ void __launch_bounds__(kThreads, IS_BF16 || kC == kWide ? kMinBlocks : kMinBlocksNarrowF16) nvfp4_quant_kernel(
    const uint4* __restrict__ xw,          // [M, K/16] blocks of 32 bytes: the fp16|bf16 input as words
    const uint4* table,                    // [128 x 2] the table kernel's words (past one wave)
    uint32_t own_table,                    // 1: one wave, each CTA builds its table (`table` unread)
    const float* __restrict__ global_scale,  // [1] fp32, read on the device
    uint2* __restrict__ codes,             // [M, K/16] blocks of 8 code bytes = uint8 [M, K/2]
    uint8_t* __restrict__ sf,              // scale bytes: swizzled [sf_rows * sf_cols] or linear [M, K/16]
    uint32_t M, uint32_t n_blocks,         // rows, 16-element blocks per row (K/16)
    uint32_t sf_cols,                      // scale columns of the storage (round_up(K/16, 4) swizzled)
    uint32_t w_base,                       // narrow launch: the first wide tile it cuts into pieces
    uint32_t n_whole,                      // wide launch: CTAs < n_whole quantize whole tiles, the rest
    uint32_t piece_lj) {                   //   row pieces of 2^piece_lj quarters of the tiles n_whole..
  __shared__ __align__(16) uint4 s_table[256];        // the threshold table: 128 scale bytes x 8 words
  __shared__ __align__(16) uint8_t s_sf[kRows * (kC + 4)];   // the tile's scale bytes, row-major (quant_tile)
  if (kC == kWide && blockIdx.x >= n_whole) {   // a row piece: 2^(2 - piece_lj) pieces per tile
    const uint32_t p = blockIdx.x - n_whole, per_tile = 2 - piece_lj;
    quant_tile<IS_BF16, SWIZZLED, WRITE_PADDING, kC, true>(xw, table, own_table != 0, global_scale, codes, sf, M,
                                                          n_blocks, sf_cols,
                                                          n_whole + (p >> per_tile), 0u,
                                                          (p & ((1u << per_tile) - 1)) << piece_lj, piece_lj,
                                                          s_table, s_sf);
  } else {
    const uint32_t wide = kC == kWide ? blockIdx.x : w_base + blockIdx.x / (kWide / kC);
    const uint32_t c0_off = kC == kWide ? 0u : (blockIdx.x % (kWide / kC)) * kC;
    quant_tile<IS_BF16, SWIZZLED, WRITE_PADDING, kC, false>(xw, table, own_table != 0, global_scale, codes, sf, M,
                                                           n_blocks, sf_cols,
                                                           wide, c0_off, 0u, 2u, s_table, s_sf);
  }
}

// The launch plan (the tail rule in the header): wide CTAs that quantize whole tiles, wide CTAs that
// quantize row pieces of 2^piece_lj quarters (same launch), narrow CTAs (second launch), and
// P = SMs x resident wide CTAs per SM (the occupancy query, once per instantiation; 6 with the
// register cap), and own_table: the tiles fit in one wave, so each CTA builds its table (no table kernel).
struct Plan { uint32_t wide, pieces, piece_lj, narrow, slots; bool own_table; };

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING>
static Plan plan(uint32_t M, uint32_t n_blocks, int sms) {
  static int per_sm = 0;   // the same for every device of one architecture (this library's sm_90)
  if (per_sm == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, nvfp4_quant_kernel<IS_BF16, SWIZZLED, WRITE_PADDING, kWide>,
                                                      kThreads, 0) != cudaSuccess || n < 1)
      n = 1;
    per_sm = n;
  }
  const uint64_t N = (uint64_t)((M + kRows - 1) / kRows) * ((n_blocks + kWide - 1) / kWide);   // wide tiles
  const uint64_t P = (uint64_t)sms * (uint64_t)per_sm, waves = N / P, rest = N - waves * P;
  if (waves == 0) {   // one wave: k whole tiles per SM, and r more
    const uint64_t S = (uint64_t)sms, k = N / S, r = N - k * S;
    if (r == 0 || 8 * r > 7 * S) return {(uint32_t)N, 0u, 0u, 0u, (uint32_t)P, true};        // whole tiles
    if (2 * r > S) return {(uint32_t)(k * S), 0u, 0u, (uint32_t)(r * (kWide / kNarrow)), (uint32_t)P, true};  // narrow
    const uint32_t lj = 4 * r <= S ? 0u : 1u;                                               // quarters | halves
    return {(uint32_t)(k * S), (uint32_t)(r << (2 - lj)), lj, 0u, (uint32_t)P, true};
  }
  if (rest == 0 || 10 * rest >= 9 * P) return {(uint32_t)N, 0u, 0u, 0u, (uint32_t)P, false};   // no thin last wave
  return {(uint32_t)(waves * P), 0u, 0u, (uint32_t)(rest * (kWide / kNarrow)), (uint32_t)P, false};
}

// pdl: the launch may start before the previous one in the stream ends (programmatic dependent launch)
template <typename Kernel>
static cudaError_t launch_one(Kernel kernel, bool pdl, uint32_t grid, const void* x, const float* gs, void* codes,
                              void* sf, const void* table, bool own_table, uint32_t M, uint32_t n_blocks,
                              uint32_t sf_cols, uint32_t w_base, uint32_t n_whole, uint32_t piece_lj,
                              cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);   // the caller keeps M*K/16 < 2^31, so the tile counts fit
  cfg.blockDim = dim3(kThreads);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<const uint4*>(x), static_cast<const uint4*>(table),
                            (uint32_t)own_table, gs,
                            static_cast<uint2*>(codes), static_cast<uint8_t*>(sf), M, n_blocks, sf_cols, w_base,
                            n_whole, piece_lj);
}

template <bool IS_BF16, bool SWIZZLED, bool WRITE_PADDING>
static cudaError_t launch(const void* x, const float* gs, void* codes, void* sf, void* table, uint32_t M,
                          uint32_t n_blocks, uint32_t sf_cols, int sms, cudaStream_t stream) {
  const Plan p = plan<IS_BF16, SWIZZLED, WRITE_PADDING>(M, n_blocks, sms);
  // past one wave: the table kernel first (an ordinary launch: after whatever wrote the global scale and
  // x), the wide launch its programmatic dependent; one wave: the wide launch is the ordinary one
  if (!p.own_table) nvfp4_threshold_table_kernel<IS_BF16><<<1, 1024, 0, stream>>>(gs, static_cast<uint32_t*>(table));
  if (p.wide + p.pieces > 0) {
    const cudaError_t err = launch_one(nvfp4_quant_kernel<IS_BF16, SWIZZLED, WRITE_PADDING, kWide>, !p.own_table,
                                       p.wide + p.pieces, x, gs, codes, sf, table, p.own_table, M, n_blocks, sf_cols,
                                       0u, p.wide, p.piece_lj, stream);
    if (err != cudaSuccess || p.narrow == 0) return err;
  }
  return launch_one(nvfp4_quant_kernel<IS_BF16, SWIZZLED, WRITE_PADDING, kNarrow>, p.wide > 0, p.narrow, x, gs,
                    codes, sf, table, p.own_table, M, n_blocks, sf_cols, p.wide, 0u, 0u, stream);
}

}  // namespace nvfp4

// The SM count of a device, read once per device.
static int nvfp4_sm_count(int device) {
  static int sms[64] = {0};
  if (device < 0 || device >= 64) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && n > 0 ? n : 1;
  }
  if (sms[device] == 0) {
    int n = 0;
    sms[device] = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && n > 0 ? n : 1;
  }
  return sms[device];
}

static int nvfp4_use_device(int device) {   // this library's CUDA runtime keeps its own current device
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) return (int)cudaSetDevice(device);
  return (int)cudaSuccess;
}

// Host launcher. x: [M, K] fp16|bf16, contiguous, 16-byte aligned; global_scale: fp32 [1] on the
// device; codes: uint8 [M, K/2] (8-byte aligned); sf: uint8 storage [sf_rows, sf_cols] (swizzled:
// round_up(M,128) x round_up(K/16,4), 16-byte aligned; linear: M x K/16); table: 1024 uint32 of
// scratch (past one wave the table kernel writes all of it; within one wave it is not touched).
// M * K/16 < 2^31 (the caller checks); device: x's CUDA device; stream: a stream of that device.
// Returns the launches' cudaError_t (0 = success).
extern "C" int nvfp4_quant_cuda(const void* x, const float* global_scale, void* codes, void* sf, void* table,
                                int M, int K, int sf_rows, int sf_cols, int is_bf16, int swizzled,
                                int write_padding, int device, cudaStream_t stream) {
  (void)sf_rows;
  if (M <= 0 || K <= 0) return (int)cudaSuccess;
  int err0 = nvfp4_use_device(device);
  if (err0 != (int)cudaSuccess) return err0;
  const int sms = nvfp4_sm_count(device);
  const uint32_t m = (uint32_t)M, nb = (uint32_t)(K / 16), cols = (uint32_t)sf_cols;
#define NVFP4_LAUNCH(B, S, P) nvfp4::launch<B, S, P>(x, global_scale, codes, sf, table, m, nb, cols, sms, stream)
  cudaError_t err;
  if (is_bf16) {
    err = !swizzled ? NVFP4_LAUNCH(true, false, true) : write_padding ? NVFP4_LAUNCH(true, true, true) : NVFP4_LAUNCH(true, true, false);
  } else {
    err = !swizzled ? NVFP4_LAUNCH(false, false, true) : write_padding ? NVFP4_LAUNCH(false, true, true) : NVFP4_LAUNCH(false, true, false);
  }
#undef NVFP4_LAUNCH
  if (err == cudaSuccess) err = cudaGetLastError();
  return (int)err;
}

// The launch plan nvfp4_quant_cuda would use on `device` (swizzled, write_padding; the other layouts
// plan alike): CTAs of the wide launch that quantize whole tiles (128 x 32 blocks), CTAs of the same
// launch that quantize row pieces and the rows of a piece (32 or 64; pieces = 0 unless one wave
// leaves at most half the SMs a tile more), CTAs of the narrow launch (128 x 8; 0 unless there is a
// thin last wave, or one wave leaves more than half and at most 7/8 of the SMs a tile more), the wide
// CTAs resident at once (P) and the SM count. For tests and the notebook. Returns a cudaError_t.
extern "C" int nvfp4_quant_cuda_plan(int M, int K, int is_bf16, int device, int* wide_ctas, int* narrow_ctas,
                                     int* slots, int* piece_ctas, int* piece_rows, int* sm_count) {
  *wide_ctas = *narrow_ctas = *slots = *piece_ctas = *piece_rows = *sm_count = 0;
  int err = nvfp4_use_device(device);
  if (err != (int)cudaSuccess) return err;
  const int sms = nvfp4_sm_count(device);
  const uint32_t m = M > 0 && K > 0 ? (uint32_t)M : 0u, nb = M > 0 && K > 0 ? (uint32_t)(K / 16) : 0u;
  const nvfp4::Plan p = is_bf16 ? nvfp4::plan<true, true, true>(m, nb, sms) : nvfp4::plan<false, true, true>(m, nb, sms);
  *wide_ctas = (int)p.wide;
  *narrow_ctas = (int)p.narrow;
  *slots = (int)p.slots;
  *piece_ctas = (int)p.pieces;
  *piece_rows = p.pieces ? 32 << p.piece_lj : 0;
  *sm_count = sms;
  return (int)cudaGetLastError();
}

// The threshold tables for n global scales (one 1024-word table each, the words the table kernel and
// a one-wave quantizer CTA build for that scale): for tests. Returns a cudaError_t.
extern "C" int nvfp4_threshold_tables_cuda(const float* global_scales, int n, int is_bf16, uint32_t* tables,
                                           int device, cudaStream_t stream) {
  if (n <= 0) return (int)cudaSuccess;
  int err = nvfp4_use_device(device);
  if (err != (int)cudaSuccess) return err;
  if (is_bf16) nvfp4::nvfp4_threshold_table_kernel<true><<<n, 1024, 0, stream>>>(global_scales, tables);
  else nvfp4::nvfp4_threshold_table_kernel<false><<<n, 1024, 0, stream>>>(global_scales, tables);
  return (int)cudaGetLastError();
}
