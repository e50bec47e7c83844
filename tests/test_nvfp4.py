"""NVFP4 quantization: the kernel against the pure-torch reference (exact), the reference against the
format's definition (brute force), the whole storage written (two poisons), the consumer, the bug."""
import pytest
import torch

import workbook  # noqa: F401
import triton
import triton.language as tl

from workbook.check import assert_exact, assert_rel_close
from workbook.coverage import assert_fully_written, consumer_differential
from workbook.device import DEVICE, ON_GPU
from workbook.benchmarks.nvfp4 import SWEEP_CONFIGS
from workbook.graders.nvfp4 import check_e2m1_round, check_quant, check_swizzle_offset
from workbook.kernels.nvfp4 import e2m1_pair_bits
from workbook.nvfp4 import (
    E2M1_VALUES, dequantize_ref, e2m1_decode, e2m1_encode, e2m1_round_brute, e4m3_round_brute,
    global_scale_of, logical_scale_coverage, nvfp4_gemm_ref, nvfp4_gemm_small_m_model, nvfp4_quant,
    nvfp4_quant_plain, padded_scale_shape, quant_coverage, quantize_ref, swizzle_offset, swizzle_scales,
    unswizzle_scales,
)
from workbook.records import load_record


def _u8(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def make_x(M, K, dtype, seed=0):
    """Random data whose 16-element blocks span ~6 decades of magnitude (scales from subnormal E4M3 to
    saturated), with a few all-zero blocks and negative zeros. Never all zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K // 16, 16, generator=g)
    x *= 10.0 ** (torch.rand(M, K // 16, 1, generator=g) * 6 - 4)
    zero_blocks = torch.rand(M, K // 16, 1, generator=g) < 0.03
    x = torch.where(zero_blocks, torch.zeros_like(x), x)
    x = x.view(M, K)
    x[:, 1::37] = -0.0
    return x.to(dtype).to(DEVICE)


# --------------------------------------------------------------------------------------------------
# The reference against the format's definition
# --------------------------------------------------------------------------------------------------

def _e2m1_probe():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    y = torch.cat([torch.tensor(E2M1_VALUES), mids, mids + 1e-6, mids - 1e-6,
                   torch.randn(4000) * 3, torch.tensor([6.0001, 7.0, 1e30, float("inf")])])
    return torch.cat([y, -y])


def test_e2m1_encode_is_nearest_ties_to_even():
    y = _e2m1_probe()
    assert_exact(e2m1_decode(e2m1_encode(y)), e2m1_round_brute(y), "E2M1 round trip")
    # the sign bit survives rounding to zero (as the cvt.rn.satfinite instruction keeps it)
    assert int(e2m1_encode(torch.tensor([-0.1]))) == 0x8


def test_torch_e4m3_cast_is_nearest_ties_to_even():
    grid = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (grid[1:] + grid[:-1]) / 2      # every tie, exact in fp32
    v = torch.cat([grid, mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(500.0)),
                   torch.rand(5000) * 448, torch.rand(2000) * 2 ** -6])
    assert_exact(v.to(torch.float8_e4m3fn).view(torch.uint8), e4m3_round_brute(v), "torch e4m3 cast")


@triton.jit
def _probe_kernel(p, s, idx, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    b_p = tl.load(p + o, mask=m, other=0.0)
    b_s = tl.load(s + o, mask=m, other=1.0)
    b_u = tl.where(b_s > 0.0, b_s, 1.152921504606846976e18) * 1099511627776.0
    b_a = tl.abs(b_p)
    # the same value in both halves of the pair: both indices must come out equal
    b_bits = e2m1_pair_bits(b_a, b_a, 1.75 * b_u, 2.75 * b_u, 3.5 * b_u, 1.5 * b_u, 3.75 * b_u, 2.5 * b_u, 5.0 * b_u)
    b_i = tl.where((b_bits & 0x7) == ((b_bits >> 16) & 0x7), b_bits & 0x7, -1)
    tl.store(idx + o, b_i.to(tl.int32), mask=m)


def _run_probe(p, s):
    n = p.numel()
    idx = torch.full((n,), -1, dtype=torch.int32, device=DEVICE)
    _probe_kernel[(triton.cdiv(n, 1024),)](p.to(DEVICE), s.to(DEVICE), idx, n, BLOCK=1024)
    return idx.cpu()


def test_kernel_e2m1_without_division_is_exact():
    """e2m1_pair_bits(|p|, |p|, decision points * s * 2^40) gives the E2M1 index of RN(p / s), in both
    halves, for every positive E4M3 scale s, at every decision point times s, one fp32 ulp either side
    of it, and random p; s = 0 gives 0."""
    grid = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()   # 126 scales
    pts = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    at = (grid[:, None] * pts).flatten()                                             # exact products
    s_at = grid[:, None].expand(-1, 7).flatten()
    p = torch.cat([at, at.nextafter(torch.tensor(0.0)), at.nextafter(torch.tensor(1e9)),
                   grid[:, None].mul(torch.rand(126, 20) * 7).flatten()])
    s = torch.cat([s_at, s_at, s_at, grid[:, None].expand(-1, 20).flatten()])
    sign = torch.where(torch.rand(p.shape) < 0.5, -1.0, 1.0)
    p, s = torch.cat([p * sign, torch.tensor([3.0, -1e-3])]), torch.cat([s, torch.tensor([0.0, 0.0])])
    # extremes for the saturating comparison: tiny, huge and infinite |p| against the smallest,
    # a middle and the largest scale
    ext = torch.tensor([1e-30, 2.0 ** -20, 2.0 ** -12, 1e30, float("inf")])
    s_ext = torch.tensor([2.0 ** -9, 1.0, 448.0])
    p = torch.cat([p, ext.repeat(3), -ext.repeat(3)])
    s = torch.cat([s, s_ext.repeat_interleave(5), s_ext.repeat_interleave(5)])
    y = torch.where(s > 0, p / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(p))
    idx = _run_probe(p, s)
    assert_exact(idx.to(torch.uint8), e2m1_encode(y) & 7, "E2M1 index without division")


@pytest.mark.skipif(not ON_GPU, reason="the GPU instructions (inline PTX, hardware E4M3 conversion) "
                                       "run only on a GPU; the interpreter runs the emulation")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", [None] + SWEEP_CONFIGS)
def test_gpu_instructions_match_their_emulation(cfg, dtype):
    """On a GPU the kernel takes the block amax with packed max.xorsign.abs and converts to E4M3 in
    hardware (emulate=False); the interpreter path (emulate=True) emulates both. Same bytes, and both
    equal the reference, for every tile shape the GPU uses."""
    x = make_x(300, 4096 + 80, dtype, seed=3)
    gs = global_scale_of(x)
    rc, rs = quantize_ref(x.cpu(), gs.cpu())
    for emulate in (False, True):
        codes, sf = nvfp4_quant(x, gs, config=cfg, emulate=emulate)
        assert_exact(codes.cpu(), rc, f"codes, emulate={emulate}, tile {cfg}")
        assert_exact(_u8(sf).cpu(), _u8(rs), f"scales, emulate={emulate}, tile {cfg}")


# --------------------------------------------------------------------------------------------------
# Kernel == reference, exactly
# --------------------------------------------------------------------------------------------------

# odd shapes: M = 1 (decode), 90/127/129/300 (not multiples of 128), 128 (exact); K/16 = 1, 3, 5
# (padded columns) and 256 (none). Larger and more shapes run on a GPU only (the interpreter is slow).
_SHAPES = [(1, 16, torch.bfloat16), (90, 80, torch.float16), (127, 48, torch.bfloat16),
           (128, 4096, torch.float16), (129, 48, torch.float16), (1, 4096, torch.bfloat16)]
if ON_GPU:
    _SHAPES += [(M, K, dt) for M in (1, 90, 127, 128, 129, 300) for K in (16, 48, 80, 4096)
                for dt in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("M,K,dtype", _SHAPES)
def test_quant_matches_reference(M, K, dtype):
    x = make_x(M, K, dtype, seed=M * 7 + K)
    gs = global_scale_of(x)
    for swizzled in (True, False):
        codes, sf = nvfp4_quant(x, gs, swizzled=swizzled)
        rc, rs = quantize_ref(x.cpu(), gs.cpu(), swizzled=swizzled)
        assert codes.shape == (M, K // 2) and codes.dtype == torch.uint8
        assert sf.dtype == torch.float8_e4m3fn
        assert tuple(sf.shape) == (padded_scale_shape(M, K) if swizzled else (M, K // 16))
        assert_exact(codes.cpu(), rc, f"codes {M}x{K} {dtype}")
        # the WHOLE scale storage, padding included
        assert_exact(_u8(sf).cpu(), _u8(rs), f"scales {M}x{K} swizzled={swizzled}")


def test_ties_and_saturation():
    """gs = 4 and a block amax of 6 give sf = 4 and y = x exactly, so every E2M1 decision point is hit
    as a tie; a huge global scale saturates the block scale at 448."""
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    row = torch.tensor(mids + [6.0] + [-m for m in mids] + [-6.0])
    x = row.repeat(3, 4).to(torch.bfloat16).to(DEVICE)
    gs = torch.tensor([4.0], device=DEVICE)
    codes, sf = nvfp4_quant(x, gs, swizzled=False)
    assert_exact(_u8(sf).cpu(), torch.full((3, 4), 0x48, dtype=torch.uint8), "sf = 4.0")  # 4.0 = 0x48
    rc, _ = quantize_ref(x.cpu(), gs.cpu(), swizzled=False)
    assert_exact(codes.cpu(), rc, "tie codes")
    lo = codes.cpu()[0, :8] & 0xF
    hi = codes.cpu()[0, :8] >> 4
    got = e2m1_decode(torch.stack([lo, hi], -1).flatten())
    assert_exact(got, torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0,
                                    -0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, -6.0]), "ties to even")
    big = torch.tensor([1e30], device=DEVICE)
    _, sf = nvfp4_quant(x, big, swizzled=False)
    assert bool((_u8(sf).cpu() == 0x7E).all()), "block scale must saturate at 448 (0x7E), never NaN"


def test_nibble_order():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 6.0, -0.5
    codes, _ = nvfp4_quant(x.to(torch.float16).to(DEVICE), torch.tensor([4.0], device=DEVICE))
    assert int(codes[0, 0]) == 0x7 | (0x9 << 4), "element 0 goes to the low nibble, element 1 high"


# --------------------------------------------------------------------------------------------------
# Round trip and the global-scale direction
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 1e3])   # global scale >> 1, ~ 1e3, << 1
def test_round_trip_within_nvfp4_error(magnitude):
    x = (torch.randn(64, 256) * magnitude).to(torch.bfloat16).to(DEVICE)
    gs = global_scale_of(x)
    codes, sf = nvfp4_quant(x, gs)
    deq = dequantize_ref(codes.cpu(), sf.cpu(), gs.cpu())
    xf = x.float().cpu()
    # per element: half the widest E2M1 gap (1 at |y| in [4, 6]) times sf/gs, plus the clamp when sf
    # rounded below amax/6 (at most 1/16 relative): <= amax_block * (1.0625/6 + 1/16)
    amax = xf.view(64, 16, 16).abs().amax(-1, keepdim=True).expand(64, 16, 16).reshape(64, 256)
    assert bool(((deq - xf).abs() <= amax * (1.0625 / 6 + 1 / 16)).all())
    assert_rel_close(deq, xf, 0.13, "round trip")   # Gaussian data: ~0.09 measured
    # the direction trap: multiplying by the global scale on the way back is off by gs^2
    wrong = deq * gs.cpu() * gs.cpu()
    assert not torch.allclose(wrong, xf, rtol=0.5), "this test must notice a swapped direction"


# --------------------------------------------------------------------------------------------------
# Coverage: every byte written (two poisons), the consumer, the regression
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K", [(1, 16), (90, 80), (129, 48), (64, 512)]
                         + ([(300, 4096), (256, 1024)] if ON_GPU else []))
@pytest.mark.parametrize("swizzled", [True, False])
def test_whole_storage_written(M, K, swizzled):
    x = make_x(M, K, torch.bfloat16)
    gs = global_scale_of(x)
    cov_c, cov_s = quant_coverage(x, gs, swizzled=swizzled)
    assert cov_c.storage_fully_written, cov_c.report()
    assert cov_s.storage_fully_written, cov_s.report()
    # the same claim through the generic assertion, on the launcher as it ships
    assert_fully_written(lambda x, g: [t.view(torch.uint8) for t in nvfp4_quant(x, g, swizzled=swizzled)],
                         x, gs, scope="storage")


@pytest.mark.parametrize("shape", ["straddling", "one_wrap", "exact"])
@pytest.mark.parametrize("cfg", SWEEP_CONFIGS)
def test_every_tile_size_writes_everything(cfg, shape):
    """Each tile size the sweep times (every one the launch rule can pick among them) must write every
    byte and give the reference's bytes: tiles wider than a row (K/16 = 5 of 8 padded scale columns,
    M = 3 of 128 padded rows: the general row arithmetic, a partial last tile, both paddings), tiles
    narrower than a row (K/16 = BLOCK_S + 4, M = 5: at most one row boundary per tile, padded rows),
    and tiles that cover the input exactly with no padding (linear scales: the unmasked path alone)."""
    bs = cfg["BLOCK_S"]
    if not ON_GPU and bs > 64:
        pytest.skip("wide tiles run on the GPU (in the interpreter one such case takes a minute); the "
                    "interpreter covers the tile sizes up to 64 blocks, which take the same paths")
    # exact: linear scales (no padding) and M * K/16 a multiple of BLOCK_S, so no tile is masked
    M, K, swizzled = {"straddling": (3, 80, True), "one_wrap": (5, 16 * (bs + 4), True),
                      "exact": (2, 16 * bs, False)}[shape]
    x = make_x(M, K, torch.bfloat16, seed=5)
    gs = global_scale_of(x)
    cov_c, cov_s = quant_coverage(x, gs, config=cfg, swizzled=swizzled)
    assert cov_c.storage_fully_written, cov_c.report()
    assert cov_s.storage_fully_written, cov_s.report()
    codes, sf = nvfp4_quant(x, gs, config=cfg, swizzled=swizzled)
    rc, rs = quantize_ref(x.cpu(), gs.cpu(), swizzled=swizzled)
    assert_exact(codes.cpu(), rc, f"codes {cfg}")
    assert_exact(_u8(sf).cpu(), _u8(rs), f"scales {cfg}")


@pytest.mark.parametrize("n", [1, 3, 5, 64, 320, 448, 896, 4093, 65535, (1 << 21) - 2048])
@pytest.mark.parametrize("bs", [32, 512, 2048])
def test_row_and_column_arithmetic_is_exact(n, bs):
    """The kernel's (row, column) of a block without an integer division, mirrored in fp32 here: the
    tile's first block (r0 from fp32, one correction step each way) and, for every offset a < n + BLOCK_S
    of the tile, q = floor((a + 1/2) * RN(1/n)) == a // n. Exhaustive in a for each n, across the whole
    range the launcher allows (K/16 + BLOCK_S <= 2^21, M < 2^22)."""
    if n + bs > 1 << 21:
        pytest.skip("outside what the launcher allows")
    inv_n = torch.tensor(1.0 / n, dtype=torch.float32)
    a = torch.arange(n + bs, dtype=torch.int64)
    q = ((a.to(torch.float32) + 0.5) * inv_n).to(torch.int64)
    assert torch.equal(q, a // n)
    # tile starts over every row count up to M < 2^22 (sampled densely at the top of the range)
    rows = torch.cat([torch.arange(0, 4096), torch.randint(0, (1 << 22) - 1, (20000,)),
                      torch.arange((1 << 22) - 4096, 1 << 22)])
    start = rows * n + torch.randint(0, n, rows.shape)
    start = start[start + bs < (1 << 31)]
    r0 = (start.to(torch.float32) * inv_n).to(torch.int64)
    c0 = start - r0 * n
    r0 = torch.where(c0 < 0, r0 - 1, r0)
    c0 = torch.where(c0 < 0, c0 + n, c0)
    r0 = torch.where(c0 >= n, r0 + 1, r0)
    c0 = torch.where(c0 >= n, c0 - n, c0)
    assert torch.equal(r0, start // n) and torch.equal(c0, start % n)


def test_launch_rule():
    """The GPU's default tile is a rule of the input's size (no per-shape table): wide tiles for large
    inputs whatever K is, narrower ones when the grid would not give every SM enough programs, always
    one of the tile sizes the tests run; and the recorded heatmap used that rule."""
    from workbook.nvfp4 import launch_rule

    tiles = {(c["BLOCK_S"], c["num_warps"]) for c in SWEEP_CONFIGS}
    for M in (1, 3, 128, 3000, 4096, 12288, 16384):
        for K in (16, 2048, 4096, 5120, 7168, 8192, 14336):
            assert launch_rule(M, K, 132) in tiles
    assert launch_rule(16384, 8192, 132) == launch_rule(12288, 7168, 132) == launch_rule(3000, 14336, 132) == (512, 4)
    assert launch_rule(1, 4096, 132)[0] < launch_rule(512, 4096, 132)[0] <= launch_rule(8192, 4096, 132)[0]
    rec = load_record("nvfp4")
    for r in rec["results"].get("heatmap", []):
        assert tuple(r["config"]) == launch_rule(r["M"], r["K"], rec["machine"]["sm_count"]), r


@pytest.mark.parametrize("M,K", [(90, 80), (5, 48), (200, 208)])
def test_consumer_reads_only_written_bytes(M, K):
    x = make_x(M, K, torch.float16, seed=3)
    gs = global_scale_of(x)
    w = torch.randn(24, K, device=DEVICE)
    chk = consumer_differential(nvfp4_quant, lambda c, s: nvfp4_gemm_ref(c, s, gs, w), x, gs)
    assert chk.identical, chk.report()
    codes, sf = nvfp4_quant(x, gs)
    out = nvfp4_gemm_ref(codes, sf, gs, w)
    ref = dequantize_ref(codes, sf, gs) @ w.T
    assert_rel_close(out, ref, 1e-5, "consumer vs dequantize @ w.T")


@pytest.mark.parametrize("M,K", [(90, 80), (130, 48)])
def test_regression_is_invisible_to_a_sliced_test_but_caught(M, K):
    """The real bug: padded scale entries skipped. A test on the unpadded view passes; coverage of the
    whole storage and the consumer differential catch it."""
    x = make_x(M, K, torch.bfloat16, seed=5)
    gs = global_scale_of(x)
    codes, sf = nvfp4_quant(x, gs, write_padding=False)
    rc, rs = quantize_ref(x.cpu(), gs.cpu())
    n = K // 16
    assert_exact(codes.cpu(), rc, "codes")
    assert_exact(_u8(unswizzle_scales(sf))[:M, :n].cpu(), _u8(unswizzle_scales(rs))[:M, :n], "sliced scales")
    _, cov_s = quant_coverage(x, gs, write_padding=False)
    log = logical_scale_coverage(cov_s)
    Mp, Kp = padded_scale_shape(M, K)
    expect_written = torch.zeros(Mp, Kp, dtype=torch.bool)
    expect_written[:M, :n] = True
    assert torch.equal(log.written, expect_written), "exactly the real entries are written"
    with pytest.raises(AssertionError, match="not fully written"):
        assert_fully_written(lambda x, g: [t.view(torch.uint8) for t in nvfp4_quant(x, g, write_padding=False)],
                             x, gs, scope="storage")
    w = torch.randn(8, K, device=DEVICE)
    chk = consumer_differential(lambda x, g: nvfp4_quant(x, g, write_padding=False),
                                lambda c, s: nvfp4_gemm_ref(c, s, gs, w), x, gs)
    assert not chk.identical and chk.n_differ == M * 8, chk.report()


def test_swizzle_layout():
    M, n = 200, 7
    sf = torch.randint(1, 0x7E, (M, n), dtype=torch.uint8)
    sw = swizzle_scales(sf)
    Mp, Kp = sw.shape
    assert (Mp, Kp) == (256, 8)
    r = torch.arange(M)[:, None].expand(M, n)
    c = torch.arange(n)[None, :].expand(M, n)
    assert torch.equal(sw.flatten()[swizzle_offset(r, c, Kp)], sf)
    full = unswizzle_scales(sw)
    assert torch.equal(full[:M, :n], sf) and int(full[M:].sum()) == 0 and int(full[:, n:].sum()) == 0
    assert swizzle_offset(0, 0, 8) == 0 and swizzle_offset(32, 0, 8) == 4 and swizzle_offset(1, 0, 8) == 16
    assert swizzle_offset(0, 4, 8) == 512 and swizzle_offset(128, 0, 8) == 1024


# --------------------------------------------------------------------------------------------------
# Graders accept the reference and reject wrong answers
# --------------------------------------------------------------------------------------------------

def _stub(*args):
    raise NotImplementedError


def _swz(tile=lambda r, c, Kp: r // 128 * (Kp // 4) + c // 4, inner=lambda r, c: (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4,
         unit=1):
    """The swizzled offset with one of its parts replaced: the tile number, the offset inside it, the unit."""
    return lambda r, c, Kp: (tile(r, c, Kp) * 512 + inner(r, c)) // unit


def _e2m1_sign_by_division(y):
    return e2m1_round_brute(y.abs()) * (y / y.abs())      # 0 / 0 at zero


E2M1_WRONG = {
    "ties away from zero": (lambda y: e2m1_round_brute(y + torch.sign(y) * 1e-4), "EVEN"),
    "ties to the smaller": (lambda y: torch.tensor(E2M1_VALUES)[(y.abs().clamp(max=6)[:, None]
                                                                 - torch.tensor(E2M1_VALUES)).abs().argmin(1)]
                            * torch.sign(y), "EVEN"),
    "no clamp": (lambda y: torch.where(y.abs() > 6, y, e2m1_round_brute(y)), "saturate"),
    "magnitude only": (lambda y: e2m1_round_brute(y).abs(), "sign is kept"),
    "a uniform grid of step 0.5": (lambda y: (y.clamp(-6, 6) * 2).round() / 2, "NEAREST"),
    "the code, not its value": (lambda y: e2m1_encode(y).float(), "you returned the 4-bit CODE"),
    "sign by y / |y|": (_e2m1_sign_by_division, "y / |y| is 0 / 0 at zero"),
}


def test_grader_e2m1_round_passes_the_solution():
    check_e2m1_round(lambda y: e2m1_decode(e2m1_encode(y)))
    with pytest.raises(NotImplementedError):
        check_e2m1_round(_stub)


@pytest.mark.parametrize("which", list(E2M1_WRONG))
def test_grader_e2m1_round_fails_wrong_answers_with_the_intended_message(which):
    fn, match = E2M1_WRONG[which]
    with pytest.raises(AssertionError, match=match):
        check_e2m1_round(fn)


SWIZZLE_WRONG = {
    "tile row-major inside": (_swz(inner=lambda r, c: (r % 128) * 4 + c % 4), "32 lines of 16 bytes"),
    "slab and line swapped": (_swz(inner=lambda r, c: ((r % 128) // 32) * 128 + (r % 32) * 4 + c % 4),
                              "32 lines of 16 bytes"),
    "tiles column-major": (_swz(tile=lambda r, c, Kp: c // 4 * ((int(r.max()) + 1) // 128) + r // 128),
                           "tiles are stored row-major"),
    "Kp tiles per row of tiles": (_swz(tile=lambda r, c, Kp: r // 128 * Kp + c // 4), "tiles are stored row-major"),
    "c, not c % 4, inside the tile": (_swz(inner=lambda r, c: (r % 32) * 16 + ((r % 128) // 32) * 4 + c),
                                      r"(?s)grid \[256, 8\].*32 lines of 16 bytes"),
    "offsets in 4-byte words": (_swz(unit=4), "offset counts BYTES"),
    "a list": (lambda r, c, Kp: swizzle_offset(r, c, Kp).tolist(), "return an integer tensor"),
}


def test_grader_swizzle_offset_passes_the_solution():
    check_swizzle_offset(swizzle_offset)
    with pytest.raises(NotImplementedError):
        check_swizzle_offset(_stub)


@pytest.mark.parametrize("which", list(SWIZZLE_WRONG))
def test_grader_swizzle_offset_fails_wrong_answers_with_the_intended_message(which):
    fn, match = SWIZZLE_WRONG[which]
    with pytest.raises(AssertionError, match=match):
        check_swizzle_offset(fn)


def _nan_padding(x, g):
    from workbook.graders.nvfp4 import quant_with_nan_padding

    codes, sf = quant_with_nan_padding(x, g)
    # the helper does what it says: real entries as the kernel's, every padded entry 0xFF
    rc, rs = nvfp4_quant(x, g)
    M, n = x.shape[0], x.shape[1] // 16
    log, ref = unswizzle_scales(sf.view(torch.uint8)), unswizzle_scales(rs.view(torch.uint8))
    assert torch.equal(log[:M, :n], ref[:M, :n]) and torch.equal(codes, rc)
    assert int((log == 0xFF).sum()) == log.numel() - M * n
    return codes, sf


def _reswizzle(log):
    Mp, Kp = log.shape
    return log.view(Mp // 128, 4, 32, Kp // 4, 4).permute(0, 3, 2, 1, 4).reshape(Mp, Kp)


def _swapped_nibbles(x, g):
    codes, sf = nvfp4_quant(x, g)
    return (codes >> 4) | (codes << 4), sf


def _truncated_scales(x, g):
    """E4M3 scales rounded toward zero instead of to nearest even."""
    codes, sf = nvfp4_quant_plain(x, g)
    M, K = x.shape
    amax = x.float().view(M, K // 16, 16).abs().amax(-1)
    want = torch.clamp(g.float() * amax / torch.full_like(amax, 6.0), max=448.0)
    b = want.to(torch.float8_e4m3fn)
    b = torch.where(b.float() > want, (b.view(torch.uint8) - 1).view(torch.float8_e4m3fn), b)
    return codes, swizzle_scales(b)


def _plain_launcher(x, g, *, codes_shape=None, scales_shape=None, alloc=torch.empty, zero_after=None, K_arg=None):
    """Exercise 3's reference launcher (``nvfp4_quant_plain``'s kernel) with one mistake switched on: a
    wrong allocation size (``codes_shape``, ``scales_shape``), a zero-filled scale buffer (``alloc``,
    ``zero_after``: 'zero_' or 'fill_'), a wrong K given to the kernel (``K_arg``). The kernel is the
    reference's, so it stores the whole padded grid whatever was allocated."""
    from workbook.kernels.nvfp4 import nvfp4_quant_plain_kernel

    M, K = x.shape
    Mp, Kp = padded_scale_shape(M, K)
    codes = torch.empty(codes_shape or (M, K // 2), dtype=torch.uint8, device=x.device)
    sf = alloc(scales_shape or (Mp, Kp), dtype=torch.uint8, device=x.device)
    if zero_after == "zero_":
        sf.zero_()
    elif zero_after == "fill_":
        sf.fill_(0)
    nvfp4_quant_plain_kernel[(triton.cdiv(Mp, 128), Kp)](x, g, codes, sf, M, K_arg or K, Mp, Kp, BLOCK_M=128)
    return codes, sf.view(torch.float8_e4m3fn)


def test_grader_quant_passes_both_solutions():
    check_quant(nvfp4_quant)
    check_quant(nvfp4_quant_plain)
    check_quant(_plain_launcher)            # the test table's launcher, with no mistake switched on
    with pytest.raises(NotImplementedError):
        check_quant(_stub)
    from workbook.check import grade

    assert grade("Exercise 3", lambda: check_quant(_stub)).status == "not attempted"
    assert grade("Exercise 3", lambda: check_quant(nvfp4_quant_plain)).status == "passed"


def test_grader_quant_zero_fills_give_the_reference_bytes():
    """The zero-filled answers of the table below are wrong by their allocation alone: their bytes
    equal the reference's (so only the allocation check can catch them)."""
    x = make_x(90, 80, torch.bfloat16)
    g = global_scale_of(x)
    rc, rs = nvfp4_quant_plain(x, g)
    for wrong in (lambda: _plain_launcher(x, g, alloc=torch.zeros), lambda: _plain_launcher(x, g, zero_after="fill_"),
                  lambda: nvfp4_quant(x, g, alloc="zeros")):
        c, s = wrong()
        assert torch.equal(c, rc) and torch.equal(_u8(s), _u8(rs))


_STORED_PAST = "your kernel stored past the end of `{}` .*guard zone"


@pytest.mark.parametrize("wrong,message", [
    # zero fills of a buffer the statement says to allocate with torch.empty (the bytes are right)
    (lambda x, g: _plain_launcher(x, g, alloc=torch.zeros),
     r"`scales` was zero-filled \(torch.zeros\): that is the extra memset kernel this workbook removes. "
     "Allocate it with torch.empty"),
    (lambda x, g: _plain_launcher(x, g, zero_after="zero_"), r"`scales` was zero-filled \(Tensor.zero_\(\)\)"),
    (lambda x, g: _plain_launcher(x, g, zero_after="fill_"), r"`scales` was zero-filled \(Tensor.fill_\(0\)\)"),
    (lambda x, g: nvfp4_quant(x, g, alloc="zeros", write_padding=False), r"`scales` was zero-filled"),
    # wrong allocation sizes: the kernel stores past the end (in the interpreter: host memory)
    (lambda x, g: _plain_launcher(x, g, scales_shape=(x.shape[0], x.shape[1] // 16)),
     _STORED_PAST.format("scales") .replace(".*", r"\(allocated \[1, 4\] uint8 = 4 bytes; the swizzled layout "
                                              r"needs \[round_up\(M, 128\), round_up\(K/16, 4\)\] = \[128, 4\] = "
                                              r"512 bytes\).*")),
    (lambda x, g: _plain_launcher(x, g, codes_shape=(x.shape[0], x.shape[1] // 4)),
     _STORED_PAST.format("codes").replace(".*", r"\(allocated \[1, 16\] uint8 = 16 bytes; the codes need "
                                             r"\[M, K/2\] = \[1, 32\] uint8.*")),
    (lambda x, g: nvfp4_quant(x, g, write_padding=False), "padded entries of the .* were never written"),
    (_nan_padding, r"padded scale entries hold nonzero bytes \(0xFF"),
    (_swapped_nibbles, "nibble order"),
    (lambda x, g: nvfp4_quant(x, g, swizzled=False), "must be the swizzled storage"),
    (_truncated_scales, "real scale entries"),
])
def test_grader_quant_rejects_wrong_answers(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_quant(wrong)


@pytest.mark.skipif(ON_GPU, reason="bounds_checked checks the interpreter's addresses; on a GPU this stray "
                    "load is an illegal memory access")
def test_grader_quant_reports_a_stray_access_past_every_guard():
    """An offset far past every buffer (here a wrong K given to the kernel): bounds_checked stops it
    before it happens, and the grader reports it instead of the interpreter crashing."""
    with pytest.raises(AssertionError, match="your kernel tried a (load|store) outside every tensor it was given"):
        check_quant(lambda x, g: _plain_launcher(x, g, K_arg=x.shape[1] * 100000))


def test_grader_quant_nan_padding_names_the_consumers():
    """The decode shape (M = 1, K/16 = 4: only rows padded): the K-padding consumer is unharmed, the
    small-M model turns the one real row into NaN, and the message says both."""
    with pytest.raises(AssertionError) as e:
        check_quant(_nan_padding, shapes=((1, 64),))
    msg = str(e.value)
    assert "K-padding reader (nvfp4_gemm_ref): 0 of 1 real output rows wrong" in msg, msg
    assert "row-mixing model (nvfp4_gemm_small_m_model): 1 of 1 real output rows wrong (1 of them NaN)" in msg, msg


# --------------------------------------------------------------------------------------------------
# The plain kernel (notebook 02's exercise solution) and the second consumer
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,dtype", [(1, 16, torch.bfloat16), (3, 80, torch.float16), (129, 48, torch.bfloat16)])
def test_plain_kernel_matches_reference_and_writes_everything(M, K, dtype):
    x = make_x(M, K, dtype, seed=M + K)
    if dtype == torch.bfloat16:   # the interpreter loses bf16 subnormals on .to(tl.float32) (SPECS.md 2)
        x = torch.where(x.float().abs() < 2.0 ** -126, torch.zeros_like(x), x)
    gs = global_scale_of(x)
    rc, rs = quantize_ref(x.cpu(), gs.cpu())
    assert_fully_written(lambda a, b: [t.view(torch.uint8) for t in nvfp4_quant_plain(a, b)], x, gs,
                         scope="storage")
    codes, sf = nvfp4_quant_plain(x, gs)
    assert_exact(codes.cpu(), rc, f"plain codes {M}x{K}")
    assert_exact(_u8(sf).cpu(), _u8(rs), f"plain scales {M}x{K}")


def test_decode_shape_padded_rows_reach_real_rows_only_through_consumer_2():
    """The incident's shape: M = 1 and K/16 a multiple of 4, so only rows are padded. With the padding
    unwritten, consumer 1 (padded rows feed dropped output rows) cannot tell, consumer 2 can."""
    x = make_x(1, 64, torch.bfloat16, seed=11)
    gs = global_scale_of(x)
    w = torch.randn(8, 64, device=DEVICE)
    skip = lambda x, g: nvfp4_quant(x, g, write_padding=False)  # noqa: E731
    assert consumer_differential(skip, lambda c, s: nvfp4_gemm_ref(c, s, gs, w), x, gs).identical
    chk = consumer_differential(skip, lambda c, s: nvfp4_gemm_small_m_model(c, s, gs, w), x, gs)
    assert not chk.identical and chk.n_differ == 8, chk.report()
    # the shipped kernel writes the padding: both consumers read only written bytes
    for consumer in (nvfp4_gemm_ref, nvfp4_gemm_small_m_model):
        assert consumer_differential(nvfp4_quant, lambda c, s: consumer(c, s, gs, w), x, gs).identical


def test_small_m_model_on_zero_padding_equals_the_product():
    """With zero padding the model adds exactly nothing: it equals dequantize @ w.T (and consumer 1)."""
    x = make_x(37, 80, torch.float16, seed=2)
    gs = global_scale_of(x)
    w = torch.randn(5, 80, device=DEVICE)
    codes, sf = nvfp4_quant(x, gs)
    out = nvfp4_gemm_small_m_model(codes, sf, gs, w)
    assert_exact(out, nvfp4_gemm_ref(codes, sf, gs, w), "model vs consumer 1 on zero padding")
    assert_rel_close(out, dequantize_ref(codes, sf, gs) @ w.T, 1e-5, "model vs dequantize @ w.T")
    # a finite garbage byte in a padded row of the last 8-row tile changes rows 32..36 only
    log = unswizzle_scales(sf.view(torch.uint8)).clone()
    log[39, 0] = 0x38                                                  # 1.0 in E4M3
    sf2 = _reswizzle(log).contiguous().view(torch.float8_e4m3fn)
    diff = (nvfp4_gemm_small_m_model(codes, sf2, gs, w) != out).any(1)
    assert diff.nonzero().flatten().tolist() == [32, 33, 34, 35, 36]
    assert torch.equal(nvfp4_gemm_ref(codes, sf2, gs, w), out), "consumer 1 drops padded rows"


# --------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------

def _ok():
    return torch.randn(4, 32).to(torch.float16).to(DEVICE), torch.tensor([1.0], device=DEVICE)


def test_bad_inputs():
    x, gs = _ok()
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quant(torch.randn(4, 40).half().to(DEVICE), gs)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quant(torch.randn(4, 0).half().to(DEVICE), gs)
    with pytest.raises(TypeError, match=r"x must have dtype in \(float16, bfloat16\)"):
        nvfp4_quant(x.float(), gs)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        nvfp4_quant(x.tolist(), gs)
    with pytest.raises(ValueError, match="x must be 2-D"):
        nvfp4_quant(x.view(2, 2, 32), gs)
    with pytest.raises(ValueError, match="x must be contiguous"):
        nvfp4_quant(torch.randn(64, 32).half().to(DEVICE).T, gs)
    with pytest.raises(ValueError, match="x is on meta"):
        nvfp4_quant(torch.empty(4, 32, dtype=torch.float16, device="meta"), gs)
    with pytest.raises(TypeError, match=r"global_scale must have dtype in \(float32\)"):
        nvfp4_quant(x, gs.half())
    with pytest.raises(TypeError, match="global_scale must be a torch.Tensor"):
        nvfp4_quant(x, "1.0")
    with pytest.raises(ValueError, match="global_scale must hold exactly one fp32 value"):
        nvfp4_quant(x, torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="global_scale must hold exactly one fp32 value"):
        nvfp4_quant(x, torch.ones(1, 1, device=DEVICE))
    with pytest.raises(ValueError, match="global_scale is on meta"):
        nvfp4_quant(x, torch.empty(1, device="meta"))
    with pytest.raises(ValueError, match="alloc must be"):
        nvfp4_quant(x, gs, alloc="ones")
    with pytest.raises(TypeError, match="config must be a dict"):
        nvfp4_quant(x, gs, config=(16, 8, 4))
    with pytest.raises(ValueError, match="must name BLOCK_S"):
        nvfp4_quant(x, gs, config={"num_warps": 4})
    with pytest.raises(ValueError, match="power of two"):
        nvfp4_quant(x, gs, config={"BLOCK_S": 24})
    with pytest.raises(ValueError, match="too large for this kernel"):
        nvfp4_quant(torch.empty(1, 16 << 21, dtype=torch.bfloat16, device=DEVICE), gs)
    if not ON_GPU:
        with pytest.raises(ValueError, match="emulate=False needs a GPU"):
            nvfp4_quant(x, gs, emulate=False)
    codes, sf = nvfp4_quant(x, gs)
    with pytest.raises(ValueError, match="expected the padded grid"):
        nvfp4_gemm_ref(codes, torch.zeros(256, 4, dtype=torch.uint8, device=DEVICE), gs,
                       torch.randn(3, 32, device=DEVICE))
    with pytest.raises(ValueError, match=r"w must be \[N, K=32\]"):
        nvfp4_gemm_ref(codes, sf, gs, torch.randn(3, 16, device=DEVICE))
    with pytest.raises(ValueError, match="multiple of 128"):
        unswizzle_scales(sf[:100])


def test_odd_storage_offset():
    """A contiguous view that starts at an odd element cannot be read as int32 pairs in place: the
    launcher copies it first, and the result is the same."""
    base = torch.randn(1 + 5 * 48).to(torch.bfloat16).to(DEVICE)
    x = base[1:].view(5, 48)
    assert x.is_contiguous() and x.storage_offset() == 1
    gs = global_scale_of(x)
    codes, sf = nvfp4_quant(x, gs)
    rc, rs = quantize_ref(x.cpu(), gs.cpu())
    assert_exact(codes.cpu(), rc, "codes from an odd offset")
    assert_exact(_u8(sf).cpu(), _u8(rs), "scales from an odd offset")


def test_empty_batch():
    codes, sf = nvfp4_quant(torch.empty(0, 64, dtype=torch.bfloat16, device=DEVICE),
                            torch.tensor([1.0], device=DEVICE))
    assert codes.shape == (0, 32) and tuple(sf.shape) == (0, 4)


# --------------------------------------------------------------------------------------------------
# Bad values: an error where the value is on the host, an opt-in check where reading it would sync
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), -0.0])
@pytest.mark.parametrize("launcher", [nvfp4_quant, nvfp4_quant_plain])
def test_bad_global_scale_on_the_host_raises(bad, launcher):
    x, _ = _ok()
    with pytest.raises(ValueError, match="global_scale must be a finite positive number"):
        launcher(x, bad)                                                 # a Python number
    if launcher is nvfp4_quant or not ON_GPU:   # a GPU-resident scale is read only with check_finite
        with pytest.raises(ValueError, match="global_scale must be a finite positive number"):
            launcher(x, torch.tensor([bad], device=DEVICE), **({"check_finite": True} if launcher is nvfp4_quant else {}))
    if DEVICE == "cpu" or str(DEVICE) == "cpu":                          # a CPU tensor: checked always
        with pytest.raises(ValueError, match="global_scale must be a finite positive number"):
            launcher(x, torch.tensor([bad]))


def test_python_number_global_scale_equals_the_tensor():
    x = make_x(5, 48, torch.bfloat16)
    gs = global_scale_of(x)
    a = nvfp4_quant(x, float(gs))
    b = nvfp4_quant(x, gs)
    assert torch.equal(a[0], b[0]) and torch.equal(_u8(a[1]), _u8(b[1]))


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_x_raises_with_check_finite(bad):
    x = make_x(4, 32, torch.float16)
    x[2, 5] = bad
    with pytest.raises(ValueError, match=r"x holds inf or NaN \(first at \[\[2, 5\]\]"):
        nvfp4_quant(x, torch.tensor([1.0], device=DEVICE), check_finite=True)
    # and global_scale_of such an x gives a global scale the host check refuses (0 for inf, NaN for NaN)
    with pytest.raises(ValueError, match="global_scale must be a finite positive number"):
        nvfp4_quant(x, global_scale_of(x).cpu().item())


@pytest.mark.skipif(not ON_GPU, reason="a device-resident global scale exists only on a GPU")
def test_device_global_scale_is_not_read_unless_asked():
    """On the GPU the default reads nothing back (no sync, capturable in a CUDA graph): a zero global
    scale quantizes without an error; check_finite=True refuses it, and refuses inside a capture."""
    x = make_x(4, 32, torch.bfloat16)
    zero = torch.zeros(1, device=DEVICE)
    nvfp4_quant(x, zero)
    with pytest.raises(ValueError, match="finite positive"):
        nvfp4_quant(x, zero, check_finite=True)
    gs = global_scale_of(x)
    nvfp4_quant(x, gs)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="CUDA graph capture forbids"):
        with torch.cuda.graph(g):
            nvfp4_quant(x, gs, check_finite=True)


def test_record_names_the_timer_of_each_figure():
    """nvfp4.json (schema 2): every time figure's key names its timer; the compiled reference's graph
    time is absent exactly where its eager time stands in; the derived figures are the keyed ones."""
    from workbook.benchmarks.nvfp4 import TIMERS, bytes_moved, compiled_ref_timer

    rec = load_record("nvfp4")
    res, ceiling = rec["results"], rec["ceilings"]["copy_GBps"]
    assert set(TIMERS) <= set(rec["timers"]) and "ncu" in rec["timers"]
    for r in res["sizes"]:
        assert r["bytes"] == bytes_moved(r["M"], r["K"])
        assert r["triton_graph_us"] > 0 and r["triton_eager_us"] > 0 and r["compiled_ref_eager_us"] > 0
        t_ref = r["compiled_ref_graph_us"] if compiled_ref_timer(r) == "graph" else r["compiled_ref_eager_us"]
        assert r["triton_GBps"] == pytest.approx(r["bytes"] / r["triton_graph_us"] / 1e3)
        assert r["speedup_vs_compiled"] == pytest.approx(t_ref / r["triton_graph_us"])
    for r in res["zeros_vs_empty"]:
        assert {"zeros_eager_us", "empty_eager_us", "zeros_graph_us", "empty_graph_us", "memset_alone_eager_us"} <= set(r)
    assert all(r["graph_us"] > 0 for r in res["config_sweep"])
    for r in res["heatmap"]:
        assert r["frac_of_copy"] == pytest.approx(r["bytes"] / r["graph_us"] / 1e3 / ceiling)
        assert r["frac_of_same_size_copy"] == pytest.approx(r["copy_same_bytes_graph_us"] / r["graph_us"])
    assert all(r["graph_us"] > 0 for r in res["small_m"]["rows"]) and res["small_m"]["empty_kernel_graph_us"] > 0
    assert all(r["ncu_us"] > 0 for r in res["profile"]["rows"])
    # the target line of the record counts what the rows say
    large = [r for r in res["heatmap"] if r["input_bytes"] >= 64 << 20]
    assert res["targets"]["large_inputs"] == len(large)
    assert res["targets"]["large_inputs_at_85pct"] == sum(r["frac_of_copy"] >= 0.85 for r in large)


def test_table_and_record_plots_read_the_record():
    """What the notebook shows without a GPU: the benchmark's table and every record plot, drawn from
    nvfp4.json; a compiled reference timed eagerly is labelled so."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbook.benchmarks.nvfp4 import table
    from workbook.plots import nvfp4 as nvfp4_plots

    rec = load_record("nvfp4")
    text = table(rec)
    assert "copy ceiling" in text and "16384x8192" in text and "graph" in text, text
    for plot in (nvfp4_plots.plot_benchmark, nvfp4_plots.plot_heatmap, nvfp4_plots.plot_small_m,
                 nvfp4_plots.plot_zeros_vs_empty):
        plt.close(plot(rec, label="test"))
    eager = {**rec, "results": {**rec["results"], "sizes": [dict(r) for r in rec["results"]["sizes"]]}}
    del eager["results"]["sizes"][0]["compiled_ref_graph_us"]
    assert table(eager).splitlines()[2].split()[5] == "eager"
    plt.close(nvfp4_plots.plot_benchmark(eager))


def test_benchmark_contract_without_a_gpu():
    from workbook import benchmarks
    from workbook.benchmarks import nvfp4 as nvfp4_bench

    assert benchmarks.module("nvfp4") is nvfp4_bench
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="measures a GPU"):
            nvfp4_bench.run(smoke=True)


@pytest.mark.skipif(not ON_GPU, reason="the benchmark measures a GPU")
def test_smoke_run_on_the_gpu():
    """run(smoke=True): the two sizes notebook 02 times live, a valid record, a table."""
    from workbook.benchmarks.nvfp4 import SMOKE_SIZES, run, table
    from workbook.records import save_record

    m = run(smoke=True)
    assert [(r["M"], r["K"]) for r in m.results["sizes"]] == SMOKE_SIZES
    assert all(r["exact_vs_ref"] and r["compiled_ref_mismatched_bytes"] == 0 for r in m.results["sizes"])
    assert "16384x8192" in table({"results": m.results, "ceilings": m.ceilings})
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        assert load_record("nvfp4", save_record("nvfp4", m, Path(d)).parent)["results"]["sizes"]


@pytest.mark.skipif(not ON_GPU, reason="SASS exists only for a compiled GPU kernel")
def test_sass_counts_on_the_gpu():
    from workbook.benchmarks.nvfp4 import sass_counts

    c = sass_counts()
    if c is None:
        pytest.skip("this Triton cannot disassemble to SASS here (cuobjdump missing)")
    assert c["instructions"] > c["ffma"] > 0 and c["per_element"] > 0, c


def test_cast_probe_and_instruction_budget():
    """The notebook's two computed figures: the cast-error count (0 on a GPU, whose cast is RNE; the
    examples it lists really are wrong) and the instruction budget from the record."""
    from workbook.benchmarks.nvfp4 import instruction_budget
    from workbook.nvfp4 import e4m3_cast_errors

    c = e4m3_cast_errors(n=2048)
    assert c["n"] == 2048 and 0 <= c["wrong"] <= 2048
    if ON_GPU:
        assert c["wrong"] == 0, c
    for v, got, want in c["examples"]:
        assert got != want and want == int(torch.tensor([v]).to(torch.float8_e4m3fn).view(torch.uint8))
    rec = load_record("nvfp4")
    b = instruction_budget(rec, clock_GHz=1.0, bytes_per_element=2.0)
    assert b["instructions_per_element"] == pytest.approx(
        rec["machine"]["sm_count"] * 128 * 1e9 / (rec["ceilings"]["copy_GBps"] * 1e9 / 2.0))


# ------------------------------------------------------------------------------------------------
# Our bytes against an engine's (issue #32 item 7): torchao's nvfp4_quantize, an optional peer
# ------------------------------------------------------------------------------------------------

def _check_peer_rows(peer: dict) -> None:
    """What notebook 02 states about the comparison, as assertions: scale bytes nearly all equal and,
    at each differing scale, ours the exactly rounded RNE_e4m3(gs * amax / 6) (the peer's too, for its
    own per-tensor scale); code bytes nearly all equal, differing only at quotients closer to an E2M1
    rounding threshold than one fp32 ulp, where the order of the fp32 operations decides."""
    for r in peer["rows"]:
        differing = r["scale_bytes"] - r["scale_bytes_equal"]
        assert r["scale_bytes_equal"] >= 0.99 * r["scale_bytes"], r
        assert r["scales_differing_ours_exact"] == differing, r
        assert r["scales_differing_peer_exact_own_scale"] == differing, r
        assert r["code_bytes_equal"] >= 0.995 * r["code_bytes"], r
        if r["codes_differing_same_scale"]:
            assert r["max_rel_distance_to_threshold"] < 2.0 ** -23, r   # closer than one fp32 ulp


def test_bytes_against_torchao_and_the_record():
    """Recomputes the CPU comparison that notebook 02 prints from the record and checks both agree and
    say what the notebook says (skipped without torchao: ``pip install torchao==0.18.0``)."""
    pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    from workbook.benchmarks.nvfp4 import measure_peer_bytes

    live = measure_peer_bytes("cpu")
    _check_peer_rows(live)
    recorded = load_record("nvfp4")["results"]["peer_bytes"]["cpu"]
    assert [r["input"] for r in recorded["rows"]] == [r["input"] for r in live["rows"]]
    for got, want in zip(live["rows"], recorded["rows"]):
        assert {k: v for k, v in got.items() if k != "max_rel_distance_to_threshold"} == \
            {k: v for k, v in want.items() if k != "max_rel_distance_to_threshold"}, "re-record the peer bytes"
    if ON_GPU:
        _check_peer_rows(measure_peer_bytes("cuda"))


def test_recorded_peer_bytes_say_what_the_notebook_says():
    """The recorded figures alone (no torchao needed): the claims of notebook 02 hold for every device
    the record holds."""
    peer = load_record("nvfp4")["results"]["peer_bytes"]
    assert "cpu" in peer
    for by_device in peer.values():
        _check_peer_rows(by_device)
