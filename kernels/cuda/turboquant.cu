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
// One warp = one (decode request b, KV head h, split s): it attends the G = HQ / HKV query heads of
// head h (G <= 8) over tokens [s * split_len, min((s + 1) * split_len, seq_len)), 32 tokens (two MMA
// tiles of 16, one softmax step) at a time, and writes that split's normalised output and log2-sum-exp2 for the merge kernel.
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
// Codes become fp16 operands without conversions or table loads in memory:
//   keys: prmt.b32 looks up 4 magnitudes at once in the 8-entry fp16 table held in 4 registers (low
//     bytes, high bytes), one more prmt + lop3 places the sign bits (the Triton kernel's _KEY_ASM);
//   values, centred (code - 8): one prmt puts the same bytes of two tokens side by side, then per
//     coordinate one lop3 (mask | fp16 exponent of 1024 or 64) and one sub.f16x2 give the pair
//     (token A, token B) that an A fragment register holds.
// The softmax is in base 2 (the queries carry sm_scale * log2(e)), with the running max per head and
// the sums l = sum p and z = sum p (v_zero + 8 v_scale) kept per thread and reduced once at the end.
//
// Loads: each warp streams its steps through a ring of STAGES shared-memory slots of one 32-token step
// each, filled with cp.async (the next STAGES - 1 steps are in flight while one is computed); the page
// of each 16-token tile comes from the block table, read 32 tiles at a time (lane i holds the page of
// tile base + i).
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace tq {

constexpr int D = 128;            // head dim: the kernel's one size
constexpr int ROW_BYTES = D / 2;  // 64 bytes of codes per (token, head)
constexpr int TILE = 16;          // tokens per MMA tile
constexpr int STEP = 32;          // tokens per softmax step: two tiles
constexpr int STAGES = 3;         // cp.async ring depth per warp (steps in flight while one is computed)
constexpr int WARPS = 2;          // warps per block; each warp is its own (b, h, split)
constexpr float RESCALE_LOG2 = 4.f;  // the running max moves only when a score passes it by this much

struct __align__(16) Stage {      // one step (32 tokens) in shared memory
  uint4 k[STEP * ROW_BYTES / 16];   // token n's 64 bytes at k[4n .. 4n+3]
  uint4 v[STEP * ROW_BYTES / 16];
  __half ks[STEP], vs[STEP], vz[STEP];
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// Four fp16 pairs (nibbles 2j, 2j+1 -> pair j) from one word of 8 key codes; tab = prmt table
// (low bytes of magnitudes 0-3, 4-7, high bytes of 0-3, 4-7).
__device__ __forceinline__ void unpack_keys(uint32_t w, const uint32_t tab[4], uint32_t out[4]) {
  asm("{\n"
      ".reg .b32 s, t, l0, h0, l1, h1, v, g;\n"
      "and.b32 s, %4, 0x77777777;  shr.b32 t, s, 16;  shl.b32 v, %4, 4;\n"
      "prmt.b32 l0, %5, %6, s;  prmt.b32 h0, %7, %8, s;  prmt.b32 l1, %5, %6, t;  prmt.b32 h1, %7, %8, t;\n"
      "prmt.b32 g, v, %4, 0x5140;  and.b32 g, g, 0x80808080;  or.b32 h0, h0, g;\n"
      "prmt.b32 g, v, %4, 0x7362;  and.b32 g, g, 0x80808080;  or.b32 h1, h1, g;\n"
      "prmt.b32 %0, l0, h0, 0x5140;  prmt.b32 %1, l0, h0, 0x7362;\n"
      "prmt.b32 %2, l1, h1, 0x5140;  prmt.b32 %3, l1, h1, 0x7362;\n"
      "}"
      : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
      : "r"(w), "r"(tab[0]), "r"(tab[1]), "r"(tab[2]), "r"(tab[3]));
}

// Eight fp16 pairs from the same word of two tokens A and B: pair n = (A's code n - 8, B's code n - 8).
__device__ __forceinline__ void unpack_value_pairs(uint32_t wa, uint32_t wb, uint32_t out[8]) {
  asm("{\n"
      ".reg .b32 x, y, p;\n"
      "prmt.b32 x, %8, %9, 0x5410;  shr.b32 y, x, 8;\n"
      "lop3.b32 p, x, 0x000F000F, 0x64006400, 0xEA;  sub.f16x2 %0, p, %10;\n"
      "lop3.b32 p, x, 0x00F000F0, 0x54005400, 0xEA;  sub.f16x2 %1, p, %11;\n"
      "lop3.b32 p, y, 0x000F000F, 0x64006400, 0xEA;  sub.f16x2 %2, p, %10;\n"
      "lop3.b32 p, y, 0x00F000F0, 0x54005400, 0xEA;  sub.f16x2 %3, p, %11;\n"
      "prmt.b32 x, %8, %9, 0x7632;  shr.b32 y, x, 8;\n"
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
  const float* q_rot;          // [B.., HQ, D] fp32, rotated and scaled (rows [0, B) are the decode tokens)
  const int32_t* block_table;  // [R, stride_bt]
  const int32_t* seq_lens;     // [R]
  const uint8_t* k_codes;      // [pages, HKV, BLOCK_SIZE, 64]
  const __half* k_scale;       // [pages, HKV, BLOCK_SIZE]
  const uint8_t* v_codes;
  const __half* v_scale;
  const __half* v_zero;
  float* part_out;             // [B, HQ, S, D]
  float* part_lse;             // [B, HQ, S]
  uint32_t tab[4];
  int B, HQ, HKV, G, block_size, tiles_per_page_log2, stride_bt, num_splits, split_len;
};

__global__ void __launch_bounds__(WARPS * 32) tq_decode_cuda_kernel(const Args a) {
  __shared__ Stage ring[WARPS][STAGES];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int job = blockIdx.x * WARPS + warp;  // (b, h, s), s fastest
  if (job >= a.B * a.HKV * a.num_splits) return;
  const int s = job % a.num_splits;
  const int h = (job / a.num_splits) % a.HKV;
  const int b = job / (a.num_splits * a.HKV);
  const int L = a.seq_lens[b];
  const int start = s * a.split_len;
  const int end = min(start + a.split_len, L);
  const int n_steps = end > start ? (end - start + STEP - 1) / STEP : 0;
  Stage* st = ring[warp];

  // queries as B fragments: head g (zero past G), k-step kk = 2i + e: coordinates 32t + 8i + 4e + 0..3
  uint32_t qf[8][2];
  {
    const bool real = g < a.G;
    const float* q = a.q_rot + ((long long)b * a.HQ + h * a.G + (real ? g : 0)) * D + 32 * t;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      float4 x = real ? *reinterpret_cast<const float4*>(q + 4 * kk) : make_float4(0.f, 0.f, 0.f, 0.f);
      qf[kk][0] = half2_bits(x.x, x.y);
      qf[kk][1] = half2_bits(x.z, x.w);
    }
  }

  // step i = tiles 2i, 2i+1 of the split; a tile's 16 tokens lie in one page (block_size = 16 << shift).
  // Lane j holds the page of tile base + j: one coalesced block-table read per 32 tiles.
  const int32_t* bt = a.block_table + (long long)b * a.stride_bt;
  const int tile0 = start / TILE, last_tile = (end - 1) / TILE;
  const int shift = a.tiles_per_page_log2, in_page = (1 << shift) - 1;
  int page_base = -32, page_reg = 0, wr = 0;   // wr: the ring slot the next issue fills
  // Value rows are stored swizzled: tokens 2m, 2m+1 share a 128-byte block (8 chunks of 16 bytes), chunk
  // j of token 2m + p at chunk (4p + j) ^ 2(m & 3). The value loads below (lane (g, t): 8 bytes of
  // tokens 2t + {0, 1, 8, 9}) then hit 32 different banks per half-warp instead of 16 (no 2-way or
  // 4-way conflicts). Keys are read as 16 contiguous bytes per lane: no swizzle needed.
  auto vchunk = [](int n, int j) { return 8 * (n >> 1) + ((4 * (n & 1) + j) ^ (2 * ((n >> 1) & 3))); };
  const int vdst0 = vchunk(lane >> 2, lane & 3), vdst1 = vchunk((lane + 32) >> 2, lane & 3);
  auto issue = [&](int i) {
    if (2 * i + 1 - page_base >= 32) {  // warp-uniform: the next 32 tiles' pages
      page_base = 2 * i;
      page_reg = bt[min(tile0 + page_base + lane, last_tile) >> shift];  // never past the split's last page
    }
    Stage& dst = st[wr];
    wr = wr + 1 == STAGES ? 0 : wr + 1;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      // the second tile of the last step may lie past the split: its page is clamped to the last
      // one (a valid page), its tokens are masked in the math
      const int tile = tile0 + 2 * i + c;
      const int page = __shfl_sync(0xffffffffu, page_reg, 2 * i + c - page_base);
      const int slot = (page * a.HKV + h) * a.block_size + ((tile & in_page) << 4);  // the tile's first token
      const uint4* kp = reinterpret_cast<const uint4*>(a.k_codes) + 4ll * slot;  // 64 bytes = 4 uint4 per token
      const uint4* vp = reinterpret_cast<const uint4*>(a.v_codes) + 4ll * slot;
      cp_async16(&dst.k[64 * c + lane], kp + lane);
      cp_async16(&dst.k[64 * c + lane + 32], kp + lane + 32);
      cp_async16(&dst.v[64 * c + vdst0], vp + lane);
      cp_async16(&dst.v[64 * c + vdst1], vp + lane + 32);
      if (lane < 6) {  // 3 x 32 bytes of fp16 scalars, 16 at a time
        const __half* src = (lane < 2 ? a.k_scale : lane < 4 ? a.v_scale : a.v_zero) + slot + 8 * (lane & 1);
        __half* d = (lane < 2 ? dst.ks : lane < 4 ? dst.vs : dst.vz) + 16 * c + 8 * (lane & 1);
        cp_async16(d, src);
      }
    }
  };

#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n_steps) issue(i);
    cp_async_commit();
  }

  float acc[8][4];
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
  float m[2] = {-1e30f, -1e30f}, l[2] = {0.f, 0.f}, z[2] = {0.f, 0.f};

  for (int i = 0, rd = 0; i < n_steps; ++i, rd = rd + 1 == STAGES ? 0 : rd + 1) {
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
      float odd[4] = {0.f, 0.f, 0.f, 0.f};   // two accumulator chains (even / odd k-steps): half the MMA latency chain
      sc[c][0] = sc[c][1] = sc[c][2] = sc[c][3] = 0.f;
      const uint4 ka = cur.k[64 * c + 4 * g + t], kb = cur.k[64 * c + 4 * (g + 8) + t];
      const uint32_t wa[4] = {ka.x, ka.y, ka.z, ka.w}, wb[4] = {kb.x, kb.y, kb.z, kb.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t ua[4], ub[4];
        unpack_keys(wa[w], a.tab, ua);
        unpack_keys(wb[w], a.tab, ub);
        mma16816(sc[c], ua[0], ub[0], ua[1], ub[1], qf[2 * w][0], qf[2 * w][1]);
        mma16816(odd, ua[2], ub[2], ua[3], ub[3], qf[2 * w + 1][0], qf[2 * w + 1][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[c][e] += odd[e];
    }
    // token r of the step: row g (r = 16c + g) or g + 8; real iff tok0 + r < end
    bool real[4];
    float vs[4], wz[4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int r = 16 * c + g + 8 * u;
        real[2 * c + u] = tok0 + r < end;
        const float ks = __half2float(cur.ks[r]);
        sc[c][2 * u] = real[2 * c + u] ? sc[c][2 * u] * ks : -INFINITY;
        sc[c][2 * u + 1] = real[2 * c + u] ? sc[c][2 * u + 1] * ks : -INFINITY;
        // masked tokens contribute exactly 0 (their slots may hold anything, NaN included)
        vs[2 * c + u] = real[2 * c + u] ? __half2float(cur.vs[r]) : 0.f;
        wz[2 * c + u] = real[2 * c + u] ? __half2float(cur.vz[r]) + 8.f * vs[2 * c + u] : 0.f;
      }
    }
    // online softmax per head (2t, 2t+1); the max moves only when a score passes it by RESCALE_LOG2
    // (p <= 2^RESCALE_LOG2 otherwise: exact either way, fp16-safe), so most steps skip the rescale
    float mx[2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
      mx[j] = max_over_tokens(fmaxf(fmaxf(sc[0][j], sc[0][j + 2]), fmaxf(sc[1][j], sc[1][j + 2])));
    if (__any_sync(0xffffffffu, mx[0] > m[0] + RESCALE_LOG2 || mx[1] > m[1] + RESCALE_LOG2)) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float mn = fmaxf(m[j], mx[j]);
        const float alpha = exp2_approx(m[j] - mn);
        m[j] = mn;
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
      for (int e = 0; e < 4; ++e) p[e] = exp2_approx(sc[c][e] - m[e & 1]);
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
  }
  cp_async_wait<0>();

  // reduce over the tokens (lanes with the same t) and write this split's part
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] = sum_over_tokens(l[j]);
    z[j] = sum_over_tokens(z[j]);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int head = 2 * t + j;
    if (head >= a.G) continue;
    const long long row = ((long long)b * a.HQ + h * a.G + head) * a.num_splits + s;
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

static int use_device(int device) {
  int current = -1;   // this library's CUDA runtime keeps its own current device: use the tensors'
  if (cudaGetDevice(&current) != cudaSuccess || current != device) return (int)cudaSetDevice(device);
  return (int)cudaSuccess;
}

}  // namespace tq

// Writes part_out [B, HQ, S, D] and part_lse [B, HQ, S] for every (b, head, split) (empty splits:
// output 0, lse -inf); the Triton merge kernel combines the splits. Requirements checked by the
// Python launcher: D = 128, G = HQ / HKV in 1..8, block_size a multiple of 16, split_len a multiple
// of 16, 16-byte aligned q_rot rows and cache pages.
extern "C" int tq_decode_cuda(const void* q_rot, const void* block_table, const void* seq_lens,
                              const void* k_codes, const void* k_scale, const void* v_codes,
                              const void* v_scale, const void* v_zero, void* part_out, void* part_lse,
                              int tab0, int tab1, int tab2, int tab3, int B, int HQ, int HKV,
                              int block_size, int stride_bt, int num_splits, int split_len, int device,
                              cudaStream_t stream) {
  if (B <= 0) return (int)cudaSuccess;
  const int err = tq::use_device(device);
  if (err) return err;
  tq::Args a;
  a.q_rot = static_cast<const float*>(q_rot);
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
  a.num_splits = num_splits; a.split_len = split_len;
  const long long warps = (long long)B * HKV * num_splits;
  const unsigned blocks = (unsigned)((warps + tq::WARPS - 1) / tq::WARPS);
  tq::tq_decode_cuda_kernel<<<blocks, tq::WARPS * 32, 0, stream>>>(a);
  return (int)cudaGetLastError();
}

// How many warps of the decode kernel one multiprocessor holds at once (its registers and shared
// memory decide): the launcher sizes the splits to whole rounds of them.
extern "C" int tq_decode_cuda_warps_per_sm(int device, int* warps) {
  const int err = tq::use_device(device);
  if (err) return err;
  int blocks = 0;
  const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, tq::tq_decode_cuda_kernel,
                                                                      tq::WARPS * 32, 0);
  *warps = blocks * tq::WARPS;
  return (int)e;
}
