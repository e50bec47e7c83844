// NVFP4 quantization in CUDA C++: the same bytes as the Triton kernel `nvfp4_quant_kernel`
// (kernels/nvfp4.py), by another route. Device code and a C launcher only: no torch header, so
// `nvcc -arch=sm_90 -c nvfp4.cu` compiles it on its own (tests/test_cuda.py). The Python side
// (workbook/cuda.py) allocates, checks and passes raw pointers and a stream. Every H200 timing this
// comment quotes is GPU time from CUDA-graph replay (workbook.bench.graph_time_us).
//
// Format: per 16-element block of a row, amax = max |x| (fp16/bf16 -> fp32), the scale
//   sf = e4m3_rne_satfinite(min(RN(gs * amax) / 6 (correctly rounded), 448)),
// and per element the E2M1 code of RN(RN(x * gs) / sf), ties to the even index, saturated at 6;
// sf = 0 gives index 0. Bit 3 of a code is the sign bit of x. Element 2i is the low nibble.
//
// Per call: nvfp4_quant_kernel in one launch (two when the tail rule below splits the matrix), after
// nvfp4_threshold_table_kernel when the tiles take more than one wave. Each quantizer CTA:
//
// 1. Gets its threshold table into shared memory: for each of the 128 scale bytes b and each E2M1
//    decision point t_j (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5), the threshold X_j(b): the largest
//    pattern of x's own format (bf16 or fp16, >= 0) whose |x| does NOT pass t_j, where passing means
//    RN(|x| gs) > t_j sf (a tie goes down to the even index: t = 0.25, 1.25, 2.5, 5) or
//    RN(|x| gs) >= t_j sf (a tie goes up: 0.75, 1.75, 3.5). The Triton kernel's docstring proves that
//    this is the rounding of RN(RN(|x| gs) / sf) (t_j sf is exact); RN(|x| gs) never decreases as |x|
//    grows, so |x| passes exactly when |x| > X_j. So the index of an element is the number of
//    thresholds below |x|, compared in x's own format, two elements per instruction (set.gt.u32.bf16x2 /
//    set.gt.u32.f16x2): no conversion to fp32, no multiply, no division per element.
//    X_j is found in closed form (threshold_word): p0 = the pattern of RN(T / gs) (T = t_j sf) rounded
//    toward zero into x's format, and X_j is p0 - 1, p0 or p0 + 1, told apart by testing whether p0 and
//    p0 + 1 pass. Why: neighbouring values of the format differ by at least 2^-11 relatively (fp16;
//    bf16 2^-8), and the two fp32 roundings (T / gs, |x| gs) by at most 2^-24 each; so p0 - 1 never
//    passes and p0 + 2 always does (the same holds in the subnormal ranges, where the format's absolute
//    spacing dwarfs fp32's). Above the format's largest finite value nothing is tested: p0 is clamped
//    there and p0 + 1 counts as passing, which also covers gs = 0, inf, NaN and negative gs. On the H200
//    (while this kernel was built; not part of the records) it matched the binary search it replaced on
//    every word for 300,013 global scales per dtype, every fp32 exponent and the edge values among them;
//    tests/test_cuda.py checks it against the search in torch. Without the search a word is a few
//    dozen instructions, and who computes them depends on the size. Within one wave of tiles (see
//    "the tail" below) each CTA builds its own 1024 words, 4 per thread, while its first loads of x
//    are in flight. Past one wave the table kernel (one block of 1024 threads) builds them once per
//    call, and each CTA of the quantizer, its programmatic dependent, loads its first rows of x, waits
//    for the table kernel and copies the table in. On the H200, while this kernel was built (not part
//    of the records): building the table in every CTA was faster than the table kernel on each of 46
//    one-wave inputs (64-100 MiB; by 0.5 to 13 points of the copy ceiling, 3.8 on average), in the
//    same run; past one wave it was slower on 13 of 17 inputs of 100-600 MiB (by 0.5 to 2.4 points;
//    each timed three times, alternating with the table kernel, in one run): there one kernel
//    boundary and one wait per call cost less than 1024 words per CTA.
// 2. The quantization of one tile of 128 rows x kC blocks (wide tiles: kC = 32; narrow: 8;
//    or a row piece of a wide tile: see "the tail" below). 32/kC rows per warp per step, a thread per
//    block (two 16-byte loads, the
//    next step's loads in flight during this one's arithmetic); for kC = 32 eight warps and 16 steps
//    cover the 128 rows. The block amax (packed
//    max.xorsign.abs), the scale byte (cvt.rn.satfinite.e4m3x2.f32), its 7 thresholds from shared
//    memory, and per word of two elements a binary search (code_pair): 3 packed comparisons whose
//    0xFFFF/0 masks pick the next threshold by bitwise selects and are the index's bits, the sign bit
//    of x moved next to them.
//    Why a search and not a count: this kernel is limited by the power cap as much as by DRAM. On the
//    H200, while this kernel was built (nvidia-smi sampled every 50 ms during back-to-back graph
//    replays; not part of the records, which hold the current kernel's probe under "power"): a 1 GiB
//    copy drew about 505-535 W at an SM clock of 1980 MHz, while this kernel, then counting the
//    thresholds (7 comparisons and 7 adds per word), ran the card at its 700 W cap with the SM clock
//    between 1290 and 1845 MHz. At those clocks its instruction issue, not DRAM, likely sets the pace
//    (an inference: Nsight Compute, which runs the kernel alone and so at 1.95 GHz, saw its schedulers
//    issue in 65% of the cycles, which would be about 90% at 1.4 GHz), and a replay window that lands in
//    a dip came out as much as 13 points of the copy ceiling below the same input's other timing.
//    The search cut the loop from 216 to 188 instructions per block (bf16,
//    swizzled, wide tile; fp16 206 to 180: the static count of the records' sass_sm90 before and
//    after). In one run, alternating the two kernels, the search's SM clock averaged about 1720 MHz
//    against the count's 1630, and over 40 inputs of 64-600 MiB (bf16 and fp16, each timed twice) the
//    mean of its two timings reached 85% of the copy ceiling on 23 inputs against 15 (1.3 points higher
//    on average), while the better of the two was about the same (0.4 points lower on average): the
//    search loses less in the clock dips and gains little outside them.
//    The loop's bookkeeping is cut for the same reason. A thread of a whole tile knows before its loop
//    how many of its 16 (narrow: 4) steps hold a real block (n_real: rows below M, a column below
//    K/16), walks its steps with a block index that grows by 8 rows (narrow: 32) per step, and stores
//    each scale byte row-major in shared memory (row lr at lr (kC + 4): conflict-free, one address add
//    per step); the gather at the end reads each 16-byte run of a swizzled tile as the 4-byte words of
//    4 rows. No row arithmetic and no 64-bit block number per step. That took the loop from 188 to 171
//    instructions per block (bf16, swizzled, wide tile; fp16 180 to 163: the static count of the
//    records' sass_sm90 before and after). The loop keeps its compile-time trip count on purpose: a
//    tighter version that looped over the n_real steps only (154 instructions) let ptxas, short of
//    registers, issue the next step's loads near the end of the loop body instead of at its start; check
//    where the LDGs sit in the SASS after any change here. On the H200, while this kernel was built (not
//    part of the records; one run, bf16, each input timed twice, alternating the three loops, graph
//    replay after a 0.3 s idle pause), that version was 8.1 to 11.5 points of the copy ceiling below
//    this loop on all 10 inputs of 16-40 MiB (1 to 3 CTAs per SM, where nothing hides the loads'
//    latency); against the previous loop, this one gained 2.2 points on average on the 6 one-wave
//    inputs of 64-82 MiB (+1.1 to +3.2; all 6 at 85% or more, against 3), 1.2 on the 10 inputs of
//    16-40 MiB (-0.2 to +2.9), and changed the 4 of 168-410 MiB by -0.5 to +0.4.
//    One CTA per tile keeps the loop small: ptxas allocates about 40 registers per thread (the
//    previous persistent version, which carried the next tile's indices and loads across tiles, took
//    91), so 6 CTAs (48 warps) stay resident per SM instead of 2: three times the loads of x in flight.
//    __launch_bounds__(256, 6) holds it there (fp16's linear layout would take more; its spill is 8
//    bytes). On the H200, while this kernel was built (not part of the records), a 40-register
//    version was faster than the 91-register one on each of the 28 inputs of 64 MiB or more timed, in
//    the same run.
//    Prefetching more of the tile than the next step does not pay: in one run on the H200 (not part of
//    the records; 20 inputs of 64-540 MiB), an L2 bulk prefetch (cp.async.bulk.prefetch.L2) of the
//    CTA's next 3 steps at its start was slower than none on 18 of them (by up to 6.5 points of the
//    copy ceiling), of 7 or 15 steps on all 20 (by 5 to 27 points). Nor does a deeper pipeline through
//    shared memory: in another run (20 inputs of 64-592 MiB), cp.async copies of the next 2 steps into
//    3 stages of shared memory (still 6 CTAs per SM) were slower than this loop on all 20, by 0.5 to 13
//    points. With each thread copying its own 32 bytes as two 16-byte cp.async.cg (which skip L1), every
//    sector crossed from L2 twice (49-58% of the ceiling on 46 inputs of an earlier run); copying a warp's
//    bytes in address order, or through L1 (cp.async.ca), removed that but not the gap.
//
// Why tiles of 128 rows (the lesson of this kernel). The swizzled scale layout puts the 128 x 4 scale
// bytes of a tile in one 512-byte block; a 32-byte sector of it holds 8 rows x 4 columns. A kernel that
// stores each block's scale byte as it goes writes every sector 4 bytes at a time: 8 sector writes
// per warp store of 32 blocks, as many L2 write transactions for the 1-byte scales as for all the
// codes (8 sectors per 32 blocks either way). In an Nsight Compute profile on the H200 (taken while
// building this kernel; not part of the records) such a kernel kept L2 near its peak throughput while
// DRAM stayed well below the copy ceiling, even with the arithmetic removed. Here the CTA gathers its
// 128 x 32 scale bytes in shared memory (row-major) and stores them as eight whole 512-byte tiles, 16
// bytes per thread: the words of rows r, r + 32, r + 64 and r + 96 of 4 columns.
//
// The tail (the launch rule). With 6 CTAs resident per SM the GPU runs P = 6 x SMs tiles at a time.
// When the wide tiles fill one or more whole waves and leave a thin last one (at most 90% of P), that
// last wave runs few CTAs per SM, each latency-bound, and the SMs that finish first sit idle. The
// launcher then quantizes the whole waves, W = floor(N/P) P wide tiles, in one launch, and the rest of
// the matrix (the wide tiles W..N-1, each cut into 4 narrow tiles of 8 blocks) in a second launch that
// starts, by programmatic dependent launch, as soon as every wide CTA is running: its small CTAs fill
// the slots that the last wide wave frees. No shape is named: the rule reads N, the SM count and the
// occupancy. On the H200, while this kernel was built (not part of the records), this split raised the
// lowest share of the copy ceiling over the heatmap's inputs of 64 MiB or more from about 67% (one
// launch of wide tiles) to about 82%, in the same run; narrow tiles everywhere (no split) were slower
// wherever there is no thin wave. In a later run (16 inputs of 100-600 MiB with a thin last wave,
// bf16 and fp16), the rest cut instead into quarter or half row pieces of the wide launch was slower
// than the narrow launch on 28 and 30 of the 32 (by up to 4.8 and 11.2 points), and moving one or two
// more tiles per SM into the narrow launch on 27 and 28 (by up to 1.2 and 2.8 points).
// Within one wave (N < P) every tile starts at once, so the launch takes as long as the SMs that hold
// the most tiles: with N = k SMs + r, r SMs hold k + 1 tiles while the rest hold k. The launcher keeps
// k SMs whole tiles and, by how many SMs the r others would burden:
// * 2r <= SMs: cuts them into row pieces in the same launch, each piece a CTA of the same kernel:
//   quarters (32 rows) when 4r <= SMs, halves (64 rows) otherwise, so that there are no more pieces
//   than SMs (one each if the block scheduler spreads them evenly).
// * SMs < 2r <= 7 SMs / 4 (8r <= 7 SMs): cuts each into 4 narrow tiles in a second launch, as past one
//   wave: its small CTAs take the slots that the k whole tiles per SM leave free, and more as slots
//   come free, so the SMs finish nearly together.
// * 8r > 7 SMs: whole tiles (nearly every SM holds k + 1; cutting only adds CTAs).
// No shape is named: the rule reads N, the SM count and the occupancy. On the H200, while this rule
// was built (not part of the records): 49 one-wave launches with 4 <= r <= 64 went from 75-85% of the
// copy ceiling (whole tiles) to 84-91% with pieces in the same run (one was 1.7 points slower), over
// M = 128 x 64..99 at K = 4096, 128 x 37..56 at K = 7168 (bf16 and fp16), 128 x 128..198 at K = 2048
// (fp16) and the heatmap's shapes. With 2r > SMs, pieces were slower than whole tiles (quarters by up
// to 14 points, halves by up to 9; pieces that at most SMs CTAs take in turn from an atomic counter
// were not faster on 62 of 71 inputs), while the narrow launch (in a later run, with the tables built
// per CTA) was faster than whole tiles on each of the 18 inputs with 66 < r <= 104 (by 1.9 to 6.9
// points), and from 2.7 points slower to 2.6 faster on the 12 with 110 <= r <= 130: hence 7/8.
// A row piece takes the rows 32g + 8s .. 32g + 8s + 7 (g < 4) of its quarters s: in the swizzled layout
// they fill the bytes 128s .. 128s + 127 of each of the tile's 512-byte scale tiles, so a piece still
// stores whole 128-byte runs.
// Why the tail needs the narrow tiles: CTAs started together do not progress alike. In a timeline of one
// call (an instrumented build writing %globaltimer per CTA; 8192 x 8192 bf16, one graph replay on the H200,
// not part of the records) the first wave's 792 CTAs, started together, spent 21 to 34 us in their loops,
// the spread mostly within an SM (standard deviation 1.6 us within, 1.0 between SMs); the narrow CTAs fill
// the slots as they free. Cutting the last P/8, P/4 or P/2 narrow tiles once more, into one-step quarter
// pieces dispatched last, was not faster: over 58 inputs of 64-600 MiB in one run the mean change was
// -0.3, -0.6 and -2.0 points. Where the table comes from did not matter either: past one wave, the first
// wave's CTAs building their own (the later ones copying the table kernel's) changed 36 inputs of one to
// two waves by -1.6 to +1.1 points, +0.1 on average, in another run.
// A gap left open: when K/16 is not a multiple of 32 the last column of tiles holds few real blocks, yet
// each of its tiles takes a CTA (16 steps in which most lanes hold no block) and the tail rule counts it
// as a whole tile. In one run on the H200 (not part of the records; about 140 MiB, bf16), K = 1040, 1056,
// 2064 and 4112 (1 or 2 real block columns in the last tile) reached 72-78% of the copy ceiling, against
// 82-87% at K = 1024, 2048 and 4096. That those CTAs are latency-bound is an inference, not profiled.
//
// Coverage (why `empty` is right for both outputs):
// * codes: every real block (r < M, c < K/16) belongs to exactly one tile step of one thread, which
//   stores its 8 code bytes; the wide tiles 0..N-1 cover all M x K/16 blocks, and each is quantized
//   either whole (CTA W' < W of the wide launch), or as its 4 (quarters) or 2 (halves) row pieces
//   (CTAs W.. of the same launch; the quarters s of a tile's pieces are 0..3, so their steps are all
//   16), or as its 4 narrow pieces (the narrow launch); a narrow piece that starts at or past column
//   K/16 holds no real block and no scale column.
// * scales, swizzled: the CTA of a tile writes its whole 512-byte tiles, padded entries included (rows
//   >= M and columns >= K/16 hold 0 in shared memory; a row piece writes the 128-byte runs of its
//   quarters, and the pieces of a tile write all four); the tiles of 32 (or 8) block columns cover the
//   padded grid round_up(M,128) x round_up(K/16,4) (the last column tile stores only the 512-byte
//   tiles that exist; round_up(K/16,4) - 1 lies in the piece that holds column K/16 - 1).
//   WRITE_PADDING=false stores only the real entries' bytes: the regression the workbook teaches.
// * scales, linear [M, K/16]: each real block's thread stores its byte.
// * table: past one wave the table kernel writes all 1024 words of the scratch table before any
//   quantizer CTA reads it; within one wave each CTA's 256 threads write all 1024 words of its shared
//   table before the barrier that precedes the first read, and the scratch table is not read.
//
// The launches of a call (programmatic dependent launch: griddepcontrol). The first launch of a call is
// an ordinary one, so it starts after whatever wrote x and the global scale: the table kernel past one
// wave, the wide launch within one. Past one wave the wide launch is the table kernel's programmatic
// dependent: its CTAs load their first rows of x, wait for the table kernel (griddepcontrol.wait) and
// then read the table. The narrow launch is the wide launch's programmatic dependent: it may start once
// every wide CTA has signalled griddepcontrol.launch_dependents, which a wide CTA does once it has its
// table (built, or after the wait: so the table kernel has finished and its writes are visible when a
// narrow CTA reads the table without waiting), and its CTAs take the slots that wide CTAs leave or
// free. It reads only x, the global scale and the table, and writes tiles disjoint from the wide
// launch's, so it never waits for the wide grid. With fewer tiles than SMs the narrow launch may be the
// only one, an ordinary launch.
//
// Blackwell has an E2M1 conversion instruction (`cvt.rn.satfinite.e2m1x2.f32`), but only on its
// arch-specific targets (sm_100a, sm_103a, sm_110a, sm_120a, sm_121a), not on the H200's sm_90. Under
// that arch guard the quantizer converts the correctly rounded quotient RN(RN(x*gs)/sf) with it; on
// sm_90 (the H200) it uses the thresholds. Both give the same codes; the H200 runs the thresholds.
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
// fp16's narrow kernel: 5 (<= 48 registers). Held to 40 it spills 8 bytes per block; on the H200, while
// this kernel was built (not part of the records), the 5-CTA version was 1 to 3 points of the copy
// ceiling faster on every split fp16 input timed, in the same run.
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
// row stride and no per-step row arithmetic (the header, "The loop's bookkeeping"): a first version
// with one loop for both (a runtime step pattern) ran whole tiles 2-6% slower on the H200 (one run
// against the record of the previous kernel, whose device copies it matched within 0.5%; not part of
// the records).
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
