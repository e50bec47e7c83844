// TurboQuant (4bit_nc) split-KV decode attention in CUDA C++: the same computation as the Triton
// kernel `tq_decode_kernel` (kernels/turboquant.py), written so that no operand is ever moved between
// threads on its way to the tensor cores. Device code and a C launcher only (no torch header): the
// Python side (workbook/turboquant.py, backend="cuda") checks, allocates and passes raw pointers.
//
// The cache (kernels/turboquant.py has the full layout): per page, per KV head, BLOCK_SIZE tokens of
// 64 bytes of key codes (4-bit sign-magnitude Lloyd-Max codes of the rotated unit key; byte j holds
// coordinates 2j and 2j+1, so 32-bit word j holds coordinates 8j..8j+7), an fp16 key scale, 64 bytes
// of value codes (4-bit uniform) and an fp16 value scale and zero.
//
// One warp = one run: a range of one (decode request b, KV head h) pair's steps of 32 tokens (two MMA tiles
// of 16, one softmax step). The launcher's W runs go to the pairs as evenly as whole runs allow, a pair's
// steps to its runs likewise (struct Split), so W may be a round of resident warps whether or not the pairs
// divide it. A warp attends head h's G = HQ / HKV query heads (G <= 8) over its run and writes the run's
// normalised output and log2-sum-exp2. It rotates the raw queries itself (Walsh-Hadamard butterflies in
// registers, the last two levels through shuffles), scaled by sm_scale * log2(e) / sqrt(D). The merge
// kernel (one block per (request, head)) is launched as the decode grid's programmatic dependent (PDL).
//
// Both products use mma.sync.m16n8k16 (fp16 in, fp32 accumulate), the G heads as the n = 8 side:
//   scores^T [16 tokens, 8 heads] = K [16, 128] . Q^T [128, 8]        (A = K, 8 k-steps over D)
//   out^T   [128, 8 heads]      += V^T [128, 16 tokens] . P [16, 8]   (A = V^T, 8 m-tiles over D)
// An MMA fixes which thread holds which (row, k) of A: thread (g = lane / 4, t = lane % 4) holds rows
// g and g + 8, columns 2t, 2t+1, 2t+8, 2t+9 of every 16 x 16 block. Both sums may permute their
// reduction axis and the output may permute its rows, so the kernel chooses the coordinate order that
// puts each thread's own loaded bytes where the MMA wants them:
//   keys: thread t reads words 4t..4t+3 of tokens g and g+8 (16 contiguous bytes each) and k-step
//     kk = 2i + e, position 2t + 8c + j is coordinate 32t + 8i + 4e + 2c + j; the queries are loaded
//     once, in that order (B fragment: column = head g);
//   values: thread g reads words 2g and 2g+1 of tokens 2t, 2t+1, 2t+8, 2t+9 (8 bytes each), and row
//     g (g + 8) of m-tile mt is coordinate 16g + mt (16g + 8 + mt): the output is stored back in the
//     natural order (each thread writes 16 consecutive floats per head).
// The scores come out of the first MMA as C fragments (thread holds tokens g, g+8 x heads 2t, 2t+1);
// the second MMA wants P as a B fragment (tokens 2t, 2t+1 x head g): the transpose of each 8 x 8
// half, which one movmatrix.trans per half does inside the warp.
//
// Codes become fp16 operands without conversions. Keys come in two instantiations (LUT), picked per call
// (key_table; the Python launcher's rule: CONFIG["cuda_decode"]["KEY_TABLE_MIN_SPLIT"], measured):
//   table (long runs): a 256-entry table in shared memory maps a byte of two codes to the whole
//     A-fragment register, signs included: one prmt (the address) and one ld.shared per byte, against
//     about 4 instructions per byte by registers. 32 copies, one per lane (no bank conflict whatever the
//     codes), 64 KB: blocks of LUT_WARPS warps, one per multiprocessor, whose threads fill the table and
//     meet at a barrier before the first lookup (the one rule: every entry and copy a lookup reads is
//     written first; tests/test_turboquant.py: both forms give the same bits);
//   registers (short runs, where a 64 KB fill per block costs more than it saves): prmt looks up 4
//     magnitudes at once in the 8-entry fp16 table held in 4 registers, one more prmt + lop3 places the
//     signs (the Triton kernel's _KEY_ASM); blocks of REG_WARPS warps, no table.
// Values, centred (code - 8): one prmt puts the same bytes of two tokens side by side, then per coordinate
// one lop3 (mask | fp16 exponent of 1024 or 64) and one sub.f16x2 give an A register's (token A, token B)
// pair (an offset left in the operand would add offset x sum(P) to the sums and swamp a small output).
// Softmax in base 2 (the queries carry sm_scale * log2(e)), each score taken relative to the running max by
// one FFMA (s k_scale - m); l = sum p, z = sum p (v_zero + 8 v_scale) are reduced once at the end.
// Loads: a warp streams its steps through a ring of STAGES shared-memory steps filled with cp.async (STAGES - 1
// in flight while one is computed). The block table is read 32 tiles at a time, one window ahead; lane i
// turns tile base + i's page into its cache slot, so a tile's copies cost a shuffle and a multiply-add each.
//
// Coverage (why `empty` is right for part_out and part_lse): run k of pair (b, h) writes row (b, h G + head,
// k) of both for each of its G heads, all D coordinates, a run past the sequence's end included (output 0,
// lse -inf); each run k < n of a pair has its warp, and the pair's merge reads exactly those n rows (rows
// past n, room for the pair with the most runs, are neither written nor read). The merge block (b, head)
// writes out[b, head, :] whole, for the rows [0, B) of out.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

#include <type_traits>

namespace tq {

constexpr int D = 128;            // head dim: the kernel's one size
constexpr int ROW_BYTES = D / 2;  // 64 bytes of codes per (token, head)
constexpr int TILE = 16;          // tokens per MMA tile
constexpr int STEP = 32;          // tokens per softmax step: two tiles
constexpr int STAGES = 2;         // cp.async ring depth per warp (steps in flight while one is computed)
constexpr int MAX_REGS = 128;     // registers per thread: the most that keeps 16 warps per multiprocessor
constexpr int LUT_WARPS = 16;     // warps per block of the table kernel (one block per multiprocessor)
constexpr int REG_WARPS = 2;      // of the register-table kernel (eight blocks per multiprocessor)
constexpr int LUT_COPIES = 32;    // copies of the key table, one per lane: every lookup conflict-free
constexpr int LUT_STRIDE = 256;   // bytes per entry: its copies in the low 128 (an address's byte 1 = the entry)
constexpr int LUT_BYTES = 256 * LUT_STRIDE;   // 256 entries: a byte of two key codes -> their fp16 pair
static_assert(LUT_COPIES * 4 <= 128 && LUT_STRIDE == 256, "a lookup address: byte 0 = 4 x lane, byte 1 = the entry");
constexpr int SMEM_BYTES = LUT_BYTES + LUT_WARPS * STAGES * 4288;   // 4288 = sizeof(Stage), asserted below
constexpr int REG_SMEM_BYTES = REG_WARPS * STAGES * 4288;            // the register-table kernel: rings only
constexpr float RESCALE_LOG2 = 4.f;  // the running max moves only when a score passes it by this much

struct __align__(16) Stage {      // one step (32 tokens) in shared memory
  uint4 k[STEP * ROW_BYTES / 16];   // token n's 64 bytes at k[4n .. 4n+3]
  uint4 v[STEP * ROW_BYTES / 16];
  __half ks[STEP], vs[STEP], vz[STEP];
};

static_assert(sizeof(Stage) == 4288, "SMEM_BYTES counts 4288 bytes a stage");

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {   // dst: a shared-space address
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int OFF>   // the same byte offset on both sides, as an immediate of the instruction
__device__ __forceinline__ void cp_async16_off(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0+%2], [%1+%2], 16;" :: "r"(dst), "l"(src), "n"(OFF));
}

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// Four fp16 pairs (nibbles 2j, 2j+1 -> pair j) from one word of 8 key codes; tab = prmt table
// (low bytes of magnitudes 0-3, 4-7, high bytes of 0-3, 4-7). Here and in unpack_value_pairs the right
// shifts are written as mul.hi: ptxas makes them IMADs, which issue to the FMA pipe, instead of SHFs on
// the ALU pipe that the byte permutes and logic ops already keep busy (ncu, turboquant.json "profile").
__device__ __forceinline__ void unpack_keys(uint32_t w, const uint32_t tab[4], uint32_t out[4]) {
  asm("{\n"
      ".reg .b32 s, t, l0, h0, l1, h1, v, g;\n"
      "and.b32 s, %4, 0x77777777;  mul.hi.u32 t, s, 0x10000;  shl.b32 v, %4, 4;\n"
      "prmt.b32 l0, %5, %6, s;  prmt.b32 h0, %7, %8, s;  prmt.b32 l1, %5, %6, t;  prmt.b32 h1, %7, %8, t;\n"
      "prmt.b32 g, v, %4, 0x5140;  and.b32 g, g, 0x80808080;  or.b32 h0, h0, g;\n"
      "prmt.b32 g, v, %4, 0x7362;  and.b32 g, g, 0x80808080;  or.b32 h1, h1, g;\n"
      "prmt.b32 %0, l0, h0, 0x5140;  prmt.b32 %1, l0, h0, 0x7362;\n"
      "prmt.b32 %2, l1, h1, 0x5140;  prmt.b32 %3, l1, h1, 0x7362;\n"
      "}"
      : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
      : "r"(w), "r"(tab[0]), "r"(tab[1]), "r"(tab[2]), "r"(tab[3]));
}

// Four fp16 pairs from one word of 8 key codes, by table: byte k of w (codes 2k, 2k+1) is the entry, and
// lane c reads its own copy at byte LUT_STRIDE x entry + 4c of the table (at the start of dynamic shared
// memory); lut = 4 x lane. One prmt per address: byte 0 from lut, byte 1 = byte k of w, bytes 2-3 zero.
__device__ __forceinline__ void lookup_keys(uint32_t w, uint32_t lut, const uint8_t* smem, uint32_t out[4]) {
  uint32_t i0, i1, i2, i3;
  asm("prmt.b32 %0, %4, %5, 0x6504;  prmt.b32 %1, %4, %5, 0x6514;\n"
      "prmt.b32 %2, %4, %5, 0x6524;  prmt.b32 %3, %4, %5, 0x6534;"
      : "=r"(i0), "=r"(i1), "=r"(i2), "=r"(i3) : "r"(w), "r"(lut));
  out[0] = *reinterpret_cast<const uint32_t*>(smem + i0);
  out[1] = *reinterpret_cast<const uint32_t*>(smem + i1);
  out[2] = *reinterpret_cast<const uint32_t*>(smem + i2);
  out[3] = *reinterpret_cast<const uint32_t*>(smem + i3);
}

// Eight fp16 pairs from the same word of two tokens A and B: pair n = (A's code n - 8, B's code n - 8).
__device__ __forceinline__ void unpack_value_pairs(uint32_t wa, uint32_t wb, uint32_t out[8]) {
  asm("{\n"
      ".reg .b32 x, y, p;\n"
      "prmt.b32 x, %8, %9, 0x5410;  mul.hi.u32 y, x, 0x1000000;\n"
      "lop3.b32 p, x, 0x000F000F, 0x64006400, 0xEA;  sub.f16x2 %0, p, %10;\n"
      "lop3.b32 p, x, 0x00F000F0, 0x54005400, 0xEA;  sub.f16x2 %1, p, %11;\n"
      "lop3.b32 p, y, 0x000F000F, 0x64006400, 0xEA;  sub.f16x2 %2, p, %10;\n"
      "lop3.b32 p, y, 0x00F000F0, 0x54005400, 0xEA;  sub.f16x2 %3, p, %11;\n"
      "prmt.b32 x, %8, %9, 0x7632;  mul.hi.u32 y, x, 0x1000000;\n"
      "lop3.b32 p, x, 0x000F000F, 0x64006400, 0xEA;  sub.f16x2 %4, p, %10;\n"
      "lop3.b32 p, x, 0x00F000F0, 0x54005400, 0xEA;  sub.f16x2 %5, p, %11;\n"
      "lop3.b32 p, y, 0x000F000F, 0x64006400, 0xEA;  sub.f16x2 %6, p, %10;\n"
      "lop3.b32 p, y, 0x00F000F0, 0x54005400, 0xEA;  sub.f16x2 %7, p, %11;\n"
      "}"
      : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3]),
        "=r"(out[4]), "=r"(out[5]), "=r"(out[6]), "=r"(out[7])
      : "r"(wa), "r"(wb), "r"(0x64086408u), "r"(0x54805480u));
}

__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float max_over_tokens(float x) {  // over the 8 lanes with the same t
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

__device__ __forceinline__ float sum_over_tokens(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

struct Args {
  const void* q;               // [B.., HQ, D] raw queries, fp32 / fp16 / bf16 (rows [0, B) are the decode tokens)
  const int32_t* block_table;  // [R, stride_bt]
  const int32_t* seq_lens;     // [R]
  const uint8_t* k_codes;      // [pages, HKV, BLOCK_SIZE, 64]
  const __half* k_scale;       // [pages, HKV, BLOCK_SIZE]
  const uint8_t* v_codes;
  const __half* v_scale;
  const __half* v_zero;
  float* part_out;             // [B, HQ, slots, D]: row k = run k of the pair
  float* part_lse;             // [B, HQ, slots]
  uint32_t tab[4];
  float q_scale;               // sm_scale * log2(e) / sqrt(D): the orthonormal Hadamard's 1/sqrt(D) folded in
  int q_dtype;                 // 0 fp32, 1 fp16, 2 bf16
  long long stride_q;          // elements between query rows (tokens); heads and dims are dense
  int B, HQ, HKV, G, block_size, tiles_per_page_log2, stride_bt, bt_cols;
  int warps, slots;            // runs (one warp each) and partial rows per pair
  int runs_lo, pairs_hi;       // the work split (run_of_warp): pair p has runs_lo + (p < pairs_hi) runs,
  int base[2], extra[2];       // and of a pair's n runs (i = n - runs_lo) run k takes base[i] + (k < extra[i]) steps
};

// The queries of this warp as MMA B fragments, rotated here: lane (g, t) loads coordinates 32t .. 32t+31
// of head g, the Walsh-Hadamard butterflies over the 5 low index bits run in its registers, the 2 high
// bits (= t) through shuffles with lanes t ^ 1 and t ^ 2 (same g). Same result as q @ H (Sylvester order,
// symmetric): no separate rotation launch, no fp32 copy of the queries in memory.
__device__ __forceinline__ void load_rotated_queries(const Args& a, int b, int h, int g, int t, uint32_t qf[8][2]) {
  float x[32];
  const bool real = g < a.G;
  const long long off = (long long)b * a.stride_q + (long long)(h * a.G + (real ? g : 0)) * D + 32 * t;
  if (a.q_dtype == 0) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(a.q) + off);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 v = p[i];
      x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.q) + off);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = p[i];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float lo = a.q_dtype == 1 ? __half2float(__ushort_as_half((unsigned short)(w[j] & 0xFFFFu)))
                                        : __uint_as_float(w[j] << 16);
        const float hi = a.q_dtype == 1 ? __half2float(__ushort_as_half((unsigned short)(w[j] >> 16)))
                                        : __uint_as_float(w[j] & 0xFFFF0000u);
        x[8 * i + 2 * j] = lo;
        x[8 * i + 2 * j + 1] = hi;
      }
    }
  }
#pragma unroll
  for (int bit = 1; bit < 32; bit <<= 1)
#pragma unroll
    for (int i = 0; i < 32; ++i)
      if (!(i & bit)) {
        const float u = x[i], v = x[i + bit];
        x[i] = u + v;
        x[i + bit] = u - v;
      }
#pragma unroll
  for (int m = 1; m <= 2; m <<= 1) {   // index bits 5 and 6: the lower half adds, the upper subtracts itself
    const float sg = (t & m) ? -1.f : 1.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) x[i] = fmaf(sg, x[i], __shfl_xor_sync(0xffffffffu, x[i], m));
  }
  const float s = real ? a.q_scale : 0.f;   // heads past G: zero columns of the MMA
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {   // k-step kk = 2i + e: coordinates 32t + 4kk + 0..3
    qf[kk][0] = half2_bits(x[4 * kk] * s, x[4 * kk + 1] * s);
    qf[kk][1] = half2_bits(x[4 * kk + 2] * s, x[4 * kk + 3] * s);
  }
}

// Residency: 16 warps per multiprocessor (each of its four register files holds four warps of 128
// registers; a fifth needs 96 or fewer, registers going 8 per thread at a time, and the variant at 96
// spilled into its loop and ran slower).
// STAGES 2 at MAX_REGS 128 is what the record's A/B (cuda_variants_measured) kept: over STAGES 3 at 128
// registers, over STAGES 2 at 112 (spills) and over a loop that computes step i + 1's scores beside step
// i's values (STAGES 3).
// (__maxnreg__ needs nvcc 12.4 or later; an older nvcc gets the same cap as a minimum of blocks per
// multiprocessor, 65536 registers / (MAX_REGS x the block's threads), which ptxas schedules differently.)
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define TQ_DECODE_REGS(W) __maxnreg__(MAX_REGS)
#else
#define TQ_DECODE_REGS(W) __launch_bounds__((W) * 32, 65536 / (MAX_REGS * (W) * 32))
#endif
// The work split, from the host's numbers (tq_decode_cuda; workbook.turboquant.cuda_decode_launch makes the
// same plan): W = `warps` runs over the pairs p = b HKV + h (request b, KV head h), W // pairs each and one
// more for the first W % pairs pairs (W >= pairs by the launcher's rule), runs of one pair consecutive. Run k of
// a pair's n takes M // n steps of 32 tokens, one more for k < M % n (M = pair_steps, M x 32 >= every sequence's
// length), in order, and is the pair's partial row k. Only 32-bit integer divisions on the device: a 64-bit one
// is a subroutine call, and each warp's first loads wait on this arithmetic.
struct Split { int pair, run, start, end; };   // start, end: in steps

// The host's half, once per launch (tq_decode_cuda): W = warps >= pairs runs, pair_steps = M
inline void plan_split(Args& a, int pairs, int warps, int pair_steps) {
  a.warps = warps; a.runs_lo = warps / pairs; a.pairs_hi = warps % pairs;
  for (int i = 0; i < 2; ++i) { a.base[i] = pair_steps / (a.runs_lo + i); a.extra[i] = pair_steps % (a.runs_lo + i); }
}

__device__ __forceinline__ Split run_of_warp(const Args& a, int r) {
  const int hi_runs = a.pairs_hi * (a.runs_lo + 1);   // the runs of the pairs with one run more
  const int more = r < hi_runs ? 1 : 0;
  const int n = a.runs_lo + more, rr = more ? r : r - hi_runs;
  const int q = rr / n, k = rr - q * n;
  const int base = a.base[more], extra = a.extra[more];
  const int start = k * base + min(k, extra);
  return {more ? q : a.pairs_hi + q, k, start, start + base + (k < extra ? 1 : 0)};
}

// One run: tokens [start, min(run_end, seq_len)) of request b's cache for KV head h (start a multiple of 32),
// attended by the G query heads of h, written as partial row `slot` of those heads (output normalised, lse
// in base 2; no token: output 0, lse -inf). The warp's ring of STAGES steps lies in `smem` (after the key
// table in the table kernel, LUT).
template <bool LUT>
__device__ __forceinline__ void attend_run(const Args& a, uint8_t* smem, int b, int h, int start, int run_end,
                                           int slot) {
  const uint8_t* table = smem;
  Stage* st = reinterpret_cast<Stage*>(smem + (LUT ? LUT_BYTES : 0)) + (threadIdx.x >> 5) * STAGES;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int32_t* bt = a.block_table + (long long)b * a.stride_bt;
  const int tile0 = start / TILE;
  const int shift = a.tiles_per_page_log2, in_page = (1 << shift) - 1;
  // the first 32 tiles' pages, read beside the sequence length (not after it): entries past the
  // sequence are read (inside the table's row) but never used, the shuffles below clamp to its last tile
  int page_nxt = bt[min((tile0 + lane) >> shift, a.bt_cols - 1)];
  const int end = min(run_end, a.seq_lens[b]);   // the run stops at the end of the sequence
  const int n_steps = end > start ? (end - start + STEP - 1) / STEP : 0;
  const int n_full = end > start ? (end - start) / STEP : 0;   // steps with 32 real tokens: no masks

  // step i = tiles 2i, 2i+1 of the run; a tile's 16 tokens lie in one page (block_size = 16 << shift).
  // Lane j holds the cache slot of tile base + j (u_reg): one coalesced block-table read per 32 tiles,
  // the next 32 read one window ahead so the shuffle that needs them never waits on memory (page_nxt).
  const int last = (end - 1) / TILE - tile0;   // the run's last tile, relative to tile0
  int u_reg = 0, wr = 0;    // wr: the ring slot the next issue fills
  // Per-lane constants of the copies, hoisted out of the loop. Global side: a tile's first token is slot
  // u = page * HKV * block_size + (tile & in_page) * 16 (+ h * block_size in the lane's base pointers);
  // token slot u holds 64 code bytes at 64 u and one fp16 of each scalar at 2 u.
  const int page_slots = a.HKV * a.block_size;
  const uint8_t* kg = a.k_codes + (long long)h * a.block_size * ROW_BYTES + 16 * lane;
  const uint8_t* vg = a.v_codes + (long long)h * a.block_size * ROW_BYTES + 16 * lane;
  const __half* sg = (lane < 2 ? a.k_scale : lane < 4 ? a.v_scale : a.v_zero) + (long long)h * a.block_size + 8 * (lane & 1);
  // Shared side (32-bit shared addresses). Value rows are stored swizzled: tokens 2m, 2m+1 share a
  // 128-byte block (8 chunks of 16 bytes), chunk j of token 2m + p at chunk (4p + j) ^ 2(m & 3). The
  // value loads below (lane (g, t): 8 bytes of tokens 2t + {0, 1, 8, 9}) then hit 32 different banks per
  // half-warp instead of 16. Keys are read as 16 contiguous bytes per lane: no swizzle needed.
  auto vchunk = [](int n, int j) { return 8 * (n >> 1) + ((4 * (n & 1) + j) ^ (2 * ((n >> 1) & 3))); };
  const uint32_t lut = 4 * lane;
  const uint32_t ring_s = smem_addr(st);
  // a lane copies 16 bytes of token lane / 4 and 16 of token lane / 4 + 8 per tensor and tile: the second
  // lands 512 bytes after the first on both sides (the value swizzle repeats every 4 token pairs)
  const uint32_t dk0 = 16 * lane, dv0 = offsetof(Stage, v) + 16 * vchunk(lane >> 2, lane & 3);
  const uint32_t ds = (lane < 2 ? offsetof(Stage, ks) : lane < 4 ? offsetof(Stage, vs) : offsetof(Stage, vz)) + 16 * (lane & 1);
  // ldmatrix.trans row addresses for the scalars: matrix j's row r (given by lane 8j + r) is the 16-byte
  // chunk of tokens 16c..16c+7 (r even) or 16c+8..16c+15 (r odd), so lane (g, t) receives rows 2t, 2t+1 at
  // column g: the scalars of tokens 16c + g and 16c + g + 8. x4: ks tile 0, ks tile 1, vs tile 0, vs tile 1;
  // x2: vz tile 0, vz tile 1.
  const uint32_t sm_rows4 = offsetof(Stage, ks) + 64 * ((lane >> 3) >> 1) + 32 * ((lane >> 3) & 1) + 16 * (lane & 1);
  const uint32_t sm_rows2 = offsetof(Stage, vz) + 32 * ((lane >> 3) & 1) + 16 * (lane & 1);
  auto issue = [&](int i) {
    if ((i & 15) == 0) {  // warp-uniform: a new window of 32 tiles; lane j's slot of tile 2i + j, next pages
      u_reg = (int)((uint32_t)page_nxt * (uint32_t)page_slots + (uint32_t)(((tile0 + 2 * i + lane) & in_page) << 4));
      page_nxt = bt[min((tile0 + 2 * i + 32 + lane) >> shift, a.bt_cols - 1)];
    }
    const uint32_t dst = ring_s + wr * (uint32_t)sizeof(Stage);
    wr = wr + 1 == STAGES ? 0 : wr + 1;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      // the second tile of the last step may lie past the run: its slot is the last tile's (same window,
      // a valid page), its tokens are masked in the math
      const uint32_t u = (uint32_t)__shfl_sync(0xffffffffu, u_reg, min(2 * i + c, last) & 31);
      const uint8_t* kp = kg + (uint64_t)u * ROW_BYTES;
      const uint8_t* vp = vg + (uint64_t)u * ROW_BYTES;
      const uint32_t d = dst + c * (TILE * ROW_BYTES);
      cp_async16(d + dk0, kp);
      cp_async16_off<512>(d + dk0, kp);
      cp_async16(d + dv0, vp);
      cp_async16_off<512>(d + dv0, vp);
      if (lane < 6) cp_async16(dst + ds + 32 * c, sg + u);   // 3 x 32 bytes of fp16 scalars, 16 at a time
    }
  };

#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n_steps) issue(i);
    cp_async_commit();
  }

  uint32_t qf[8][2];   // loaded while the first steps are in flight
  load_rotated_queries(a, b, h, g, t, qf);

  float acc[8][4];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
  float m[2] = {0.f, 0.f}, l[2] = {0.f, 0.f}, z[2] = {0.f, 0.f};

  // One 32-token step from ring slot rd. MASKED (the run's last step only, when it is partial): tokens
  // past `end` get score -inf and value weight 0 (their slots may hold anything, NaN included).
  auto step = [&](int i, int rd, auto masked) {
    constexpr bool MASKED = decltype(masked)::value;
    cp_async_wait<STAGES - 2>();
    __syncwarp();                    // step i landed for every lane; the slot of step i - 1 is free
    if (i + STAGES - 1 < n_steps) issue(i + STAGES - 1);
    cp_async_commit();
    const Stage& cur = st[rd];
    const int tok0 = start + i * STEP;

    // scores^T = K Q^T per tile c: tokens 16c + g, 16c + g + 8 (words 4t..4t+3) x heads 2t, 2t+1
    float sc[2][4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float odd[4] = {0.f, 0.f, 0.f, 0.f};   // two accumulator chains (even / odd k-steps)
      sc[c][0] = sc[c][1] = sc[c][2] = sc[c][3] = 0.f;
      const uint4 ka = cur.k[64 * c + 4 * g + t], kb = cur.k[64 * c + 4 * (g + 8) + t];
      const uint32_t wa[4] = {ka.x, ka.y, ka.z, ka.w}, wb[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t ua[4], ub[4];
        if constexpr (LUT) {
          lookup_keys(wa[w], lut, table, ua);
          lookup_keys(wb[w], lut, table, ub);
        } else {
          unpack_keys(wa[w], a.tab, ua);
          unpack_keys(wb[w], a.tab, ub);
        }
        mma16816(sc[c], ua[0], ub[0], ua[1], ub[1], qf[2 * w][0], qf[2 * w][1]);
        mma16816(odd, ua[2], ub[2], ua[3], ub[3], qf[2 * w + 1][0], qf[2 * w + 1][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[c][e] += odd[e];
    }
    // token r of the step: row g (r = 16c + g) or g + 8; real iff tok0 + r < end. The scalars of tokens
    // 16c + g and 16c + g + 8 come as one fp16 pair per register from ldmatrix.trans (see sm_rows)
    uint32_t sx[4], sz[2];
    const uint32_t cur_s = ring_s + rd * (uint32_t)sizeof(Stage);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(sx[0]), "=r"(sx[1]), "=r"(sx[2]), "=r"(sx[3]) : "r"(cur_s + sm_rows4));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(sz[0]), "=r"(sz[1]) : "r"(cur_s + sm_rows2));
    float vs[4], wz[4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float2 ks2 = __half22float2(*reinterpret_cast<const __half2*>(&sx[c]));
      const float2 vs2 = __half22float2(*reinterpret_cast<const __half2*>(&sx[2 + c]));
      const float2 vz2 = __half22float2(*reinterpret_cast<const __half2*>(&sz[c]));
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int r = 16 * c + g + 8 * u;
        const bool real = !MASKED || tok0 + r < end;
        const float ks = u ? ks2.y : ks2.x;
        sc[c][2 * u] = real ? fmaf(sc[c][2 * u], ks, -m[0]) : -INFINITY;
        sc[c][2 * u + 1] = real ? fmaf(sc[c][2 * u + 1], ks, -m[1]) : -INFINITY;
        vs[2 * c + u] = real ? (u ? vs2.y : vs2.x) : 0.f;
        wz[2 * c + u] = real ? (u ? vz2.y : vz2.x) + 8.f * vs[2 * c + u] : 0.f;
      }
    }
    // online softmax per head (2t, 2t+1) on d = score - m (the FFMA above): the max moves on the first step
    // and then only when some d passes RESCALE_LOG2 (p <= 2^RESCALE_LOG2 otherwise: exact either way,
    // fp16-safe), so most steps skip the rescale and its shuffles; a move by dm shifts every d by -dm
    float mx[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) mx[j] = fmaxf(fmaxf(sc[0][j], sc[0][j + 2]), fmaxf(sc[1][j], sc[1][j + 2]));
    if (__any_sync(0xffffffffu, i == 0 || mx[0] > RESCALE_LOG2 || mx[1] > RESCALE_LOG2)) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float step_max = max_over_tokens(mx[j]);
        const float dm = i == 0 ? step_max : fmaxf(0.f, step_max);
        const float alpha = i == 0 ? 0.f : exp2_approx(-dm);
        m[j] += dm;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          sc[c][j] -= dm;
          sc[c][j + 2] -= dm;
        }
        l[j] *= alpha;
        z[j] *= alpha;
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          acc[mt][j] *= alpha;
          acc[mt][2 + j] *= alpha;
        }
      }
    }
    uint32_t pb[2][2];  // P' = p * v_scale as B fragments of tile c (tokens 2t, 2t+1 | 2t+8, 2t+9 x head g)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = exp2_approx(sc[c][e]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        l[j] += p[j] + p[j + 2];
        z[j] += p[j] * wz[2 * c] + p[j + 2] * wz[2 * c + 1];
      }
      pb[c][0] = transpose8x8(half2_bits(p[0] * vs[2 * c], p[1] * vs[2 * c]));
      pb[c][1] = transpose8x8(half2_bits(p[2] * vs[2 * c + 1], p[3] * vs[2 * c + 1]));
    }
    // out^T += V^T P' per tile c: words 2g, 2g+1 of tokens 2t, 2t+1, 2t+8, 2t+9 (swizzled rows)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const uint2* vrow = reinterpret_cast<const uint2*>(cur.v + 64 * c);  // 8-byte units: chunk * 2 + half
      const uint2 v0 = vrow[2 * vchunk(2 * t, g >> 1) + (g & 1)], v1 = vrow[2 * vchunk(2 * t + 1, g >> 1) + (g & 1)];
      const uint2 v8 = vrow[2 * vchunk(2 * t + 8, g >> 1) + (g & 1)];
      const uint2 v9 = vrow[2 * vchunk(2 * t + 9, g >> 1) + (g & 1)];
      uint32_t r0[8], r1[8], r2[8], r3[8];
      unpack_value_pairs(v0.x, v1.x, r0);   // row g (word 2g), tokens 2t, 2t+1
      unpack_value_pairs(v0.y, v1.y, r1);   // row g + 8 (word 2g + 1)
      unpack_value_pairs(v8.x, v9.x, r2);   // row g, tokens 2t+8, 2t+9
      unpack_value_pairs(v8.y, v9.y, r3);
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) mma16816(acc[mt], r0[mt], r1[mt], r2[mt], r3[mt], pb[c][0], pb[c][1]);
    }
  };
  int i = 0, rd = 0;
  for (; i < n_full; ++i, rd = rd + 1 == STAGES ? 0 : rd + 1) step(i, rd, std::false_type{});
  if (i < n_steps) step(i, rd, std::true_type{});
  cp_async_wait<0>();

  // reduce over the tokens (lanes with the same t) and write this run's part (row `slot` of the pair)
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] = sum_over_tokens(l[j]);
    z[j] = sum_over_tokens(z[j]);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int head = 2 * t + j;
    if (head >= a.G) continue;
    const long long row = ((long long)b * a.HQ + h * a.G + head) * a.slots + slot;
    const bool any = l[j] > 0.f;
    const float inv = any ? 1.f / l[j] : 0.f;
    float o[16];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      o[mt] = any ? (acc[mt][j] + z[j]) * inv : 0.f;          // coordinate 16g + mt
      o[8 + mt] = any ? (acc[mt][2 + j] + z[j]) * inv : 0.f;  // coordinate 16g + 8 + mt
    }
    float4* dst = reinterpret_cast<float4*>(a.part_out + row * D + 16 * g);
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = make_float4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
    if (g == 0) a.part_lse[row] = any ? m[j] + log2f(l[j]) : -INFINITY;
  }
}

template <bool LUT>
__global__ void TQ_DECODE_REGS(LUT ? LUT_WARPS : REG_WARPS) tq_decode_cuda_kernel(const Args a) {
  // The merge kernel is launched as this grid's programmatic dependent: it may be scheduled as soon as
  // every block of this grid has started (no launch gap between the two), and waits (griddepcontrol.wait)
  // until this grid has finished and its writes are visible.
  asm volatile("griddepcontrol.launch_dependents;");
  extern __shared__ __align__(1024) uint8_t tq_smem[];   // the table kernel's table, then the warps' rings
  if constexpr (LUT) {  // the key table: entry e (codes lo nibble, hi nibble) -> fp16 pair (lo, hi), 32 copies
    auto value = [&](uint32_t n) {   // sign-magnitude code -> fp16 bits
      const uint32_t m = n & 7u;
      const uint32_t lo = __byte_perm(a.tab[0], a.tab[1], m) & 0xFFu, hi = __byte_perm(a.tab[2], a.tab[3], m) & 0xFFu;
      return lo | (hi << 8) | ((n & 8u) << 12);
    };
    static_assert(LUT_WARPS * 32 == 2 * 256 && LUT_COPIES == 32, "the fill: two threads per entry");
    {   // thread (h, e) writes 4 of entry e's 8 chunks of 16 bytes (4 copies each), chunk (e + 4h + q) % 8 at
        // step q: the 32 lanes of a warp write 8 different chunk positions (banks) at each step
      const int e = threadIdx.x & 255, h = threadIdx.x >> 8;
      const uint32_t v = value(e & 15) | (value(e >> 4) << 16);
      const uint4 v4 = make_uint4(v, v, v, v);
#pragma unroll
      for (int q = 0; q < 4; ++q) *reinterpret_cast<uint4*>(tq_smem + LUT_STRIDE * e + 16 * ((e + 4 * h + q) & 7)) = v4;
    }
    __syncthreads();   // every entry and copy written before any lookup (the one rule, in shared memory)
  }
  // Block b's warp i takes run b x WARPS + i: a block holds consecutive runs, kernel T's order
  constexpr int WARPS = LUT ? LUT_WARPS : REG_WARPS;
  const int r = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (r >= a.warps) return;
  const Split w = run_of_warp(a, r);
  attend_run<LUT>(a, tq_smem, w.pair / a.HKV, w.pair % a.HKV, w.start * STEP, w.end * STEP, w.run);
}

// The log-sum-exp merge of a pair's runs (the same computation as the Triton tq_merge_kernel over its
// splits): block (b, head) of MERGE_WARPS warps; lane l of warp w sums coordinates 4l..4l+3 over runs w,
// w + MERGE_WARPS, ... (every load of a lane independent, all in flight at once), then the warps add up
// through shared memory: out[b, head, :] = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M) over the pair's S
// runs (run_of_warp); a run without tokens (lse -inf) weighs 0. out is [B.., HQ, D] dense, fp32 / fp16 / bf16
// (round to nearest even).
constexpr int MERGE_WARPS = 4;

__global__ void __launch_bounds__(MERGE_WARPS * 32) tq_merge_cuda_kernel(const Args a, void* out, int out_dtype) {
  __shared__ float4 num_s[MERGE_WARPS][32];
  __shared__ float den_s[MERGE_WARPS];
  asm volatile("griddepcontrol.wait;" ::: "memory");   // the decode grid's partials are complete
  const long long row = blockIdx.x;                  // b * HQ + head, in pair b HKV + head / G = row / G
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int S = a.runs_lo + ((int)blockIdx.x < a.pairs_hi * a.G ? 1 : 0);   // the pair's runs (run_of_warp)
  const float* lse = a.part_lse + row * a.slots;
  float mx = -INFINITY;
  for (int s = lane; s < S; s += 32) mx = fmaxf(mx, lse[s]);
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const float4* po = reinterpret_cast<const float4*>(a.part_out + row * a.slots * D) + lane;
  float4 num = make_float4(0.f, 0.f, 0.f, 0.f);
  float den = 0.f;
#pragma unroll 8
  for (int s = warp; s < S; s += MERGE_WARPS) {
    const float w = exp2f(lse[s] - mx);
    const float4 x = po[(long long)s * (D / 4)];
    den += w;
    num.x += w * x.x; num.y += w * x.y; num.z += w * x.z; num.w += w * x.w;
  }
  num_s[warp][lane] = num;
  if (lane == 0) den_s[warp] = den;
  __syncthreads();
  if (warp) return;
  float dsum = 0.f;
  num = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int w = 0; w < MERGE_WARPS; ++w) {
    const float4 x = num_s[w][lane];
    num.x += x.x; num.y += x.y; num.z += x.z; num.w += x.w;
    dsum += den_s[w];
  }
  const float o[4] = {num.x / dsum, num.y / dsum, num.z / dsum, num.w / dsum};
  const long long base = row * D + 4 * lane;
  if (out_dtype == 0) {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + base) = make_float4(o[0], o[1], o[2], o[3]);
  } else if (out_dtype == 1) {
    __half2* dst = reinterpret_cast<__half2*>(static_cast<__half*>(out) + base);
    dst[0] = __floats2half2_rn(o[0], o[1]);
    dst[1] = __floats2half2_rn(o[2], o[3]);
  } else {
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + base);
    dst[0] = __floats2bfloat162_rn(o[0], o[1]);
    dst[1] = __floats2bfloat162_rn(o[2], o[3]);
  }
}

// Once per device: the table kernel's shared memory above the default 48 KB, and the largest carveout
// for all three kernels (no shared-memory reconfiguration between the decode grid and its merge).
static void set_attributes(int device) {
  static int done = -1;
  if (done == device) return;
  cudaFuncSetAttribute(tq_decode_cuda_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
  cudaFuncSetAttribute(tq_decode_cuda_kernel<true>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  cudaFuncSetAttribute(tq_decode_cuda_kernel<false>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  cudaFuncSetAttribute(tq_merge_cuda_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  done = device;
}

static int use_device(int device) {
  int current = -1;   // this library's CUDA runtime keeps its own current device: use the tensors'
  if (cudaGetDevice(&current) != cudaSuccess || current != device) return (int)cudaSetDevice(device);
  return (int)cudaSuccess;
}

}  // namespace tq

// Writes part_out [B, HQ, slots, D] and part_lse [B, HQ, slots] for every run of the work split
// (run_of_warp: `warps` runs over B x HKV pairs of pair_steps steps each; a run without tokens: output 0,
// lse -inf), then the merge kernel (launched as its programmatic dependent) writes rows [0, B)
// of out [B.., HQ, D] (out_dtype 0 fp32, 1 fp16, 2 bf16). q: the raw queries (q_dtype 0 fp32,
// 1 fp16, 2 bf16; rows stride_q elements apart, [HQ, D] dense, 16-byte aligned rows), rotated and scaled
// by q_scale in the kernel. Requirements the Python launcher checks: D = 128, G = HQ / HKV in 1..8,
// block_size a power of two >= 16, 16-byte aligned cache tensors; and that its rule guarantees: warps >=
// B x HKV (at least one run per pair), pair_steps x 32 >= every decode request's seq_len, slots >= the most
// runs of one pair.
// key_table: 1 the table kernel, 0 the register-table kernel (the same outputs, bit for bit).
extern "C" int tq_decode_cuda(const void* q, int q_dtype, long long stride_q, float q_scale,
                              const void* block_table, const void* seq_lens,
                              const void* k_codes, const void* k_scale, const void* v_codes,
                              const void* v_scale, const void* v_zero, void* part_out, void* part_lse,
                              void* out, int out_dtype,
                              int tab0, int tab1, int tab2, int tab3, int B, int HQ, int HKV,
                              int block_size, int stride_bt, int bt_cols, int pair_steps, int warps, int slots,
                              int device, cudaStream_t stream, int key_table) {
  if (B <= 0) return (int)cudaSuccess;
  if (warps < B * HKV || slots * B * HKV < warps) return (int)cudaErrorInvalidValue;   // a run per pair, rows for all
  const int err = tq::use_device(device);
  if (err) return err;
  tq::Args a;
  a.q = q;
  a.q_dtype = q_dtype;
  a.stride_q = stride_q;
  a.q_scale = q_scale;
  a.block_table = static_cast<const int32_t*>(block_table);
  a.seq_lens = static_cast<const int32_t*>(seq_lens);
  a.k_codes = static_cast<const uint8_t*>(k_codes);
  a.k_scale = static_cast<const __half*>(k_scale);
  a.v_codes = static_cast<const uint8_t*>(v_codes);
  a.v_scale = static_cast<const __half*>(v_scale);
  a.v_zero = static_cast<const __half*>(v_zero);
  a.part_out = static_cast<float*>(part_out);
  a.part_lse = static_cast<float*>(part_lse);
  a.tab[0] = (uint32_t)tab0; a.tab[1] = (uint32_t)tab1; a.tab[2] = (uint32_t)tab2; a.tab[3] = (uint32_t)tab3;
  a.B = B; a.HQ = HQ; a.HKV = HKV; a.G = HQ / HKV; a.block_size = block_size;
  a.tiles_per_page_log2 = 0;
  while ((16 << a.tiles_per_page_log2) < block_size) ++a.tiles_per_page_log2;
  a.stride_bt = stride_bt;
  a.bt_cols = bt_cols;
  a.slots = slots;
  tq::plan_split(a, B * HKV, warps, pair_steps);   // the split's divisions, here on the host (run_of_warp)
  tq::set_attributes(device);
  if (key_table) {
    const unsigned blocks = (unsigned)((warps + tq::LUT_WARPS - 1) / tq::LUT_WARPS);
    tq::tq_decode_cuda_kernel<true><<<blocks, tq::LUT_WARPS * 32, tq::SMEM_BYTES, stream>>>(a);
  } else {
    const unsigned blocks = (unsigned)((warps + tq::REG_WARPS - 1) / tq::REG_WARPS);
    tq::tq_decode_cuda_kernel<false><<<blocks, tq::REG_WARPS * 32, tq::REG_SMEM_BYTES, stream>>>(a);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return (int)e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(B * HQ));
  cfg.blockDim = dim3(tq::MERGE_WARPS * 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;   // programmatic dependent launch
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, tq::tq_merge_cuda_kernel, a, out, out_dtype);
  return (int)e;
}

// How many warps of the decode kernel one multiprocessor holds at once (its registers and shared
// memory decide): the launcher's work split takes at most WAVES rounds of them (one by default).
extern "C" int tq_decode_cuda_warps_per_sm(int device, int* warps) {
  const int err = tq::use_device(device);
  if (err) return err;
  int lut_blocks = 0, reg_blocks = 0;
  tq::set_attributes(device);
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&lut_blocks, tq::tq_decode_cuda_kernel<true>,
                                                                tq::LUT_WARPS * 32, tq::SMEM_BYTES);
  if (e == cudaSuccess)
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&reg_blocks, tq::tq_decode_cuda_kernel<false>,
                                                      tq::REG_WARPS * 32, tq::REG_SMEM_BYTES);
  *warps = min(lut_blocks * tq::LUT_WARPS, reg_blocks * tq::REG_WARPS);   // both hold 16
  return (int)e;
}
