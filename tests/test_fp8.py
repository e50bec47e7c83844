"""Fused SiLU-mul + FP8 group quant with packed UE8M0 scales: exact against the pure-torch reference,
in Triton's interpreter on the CPU and compiled on a GPU; whole-storage poison; every bad input."""
import pytest
import torch

import workbook  # noqa: F401  (device choice before triton)
import triton
import triton.language as tl
from workbook import fp8
from workbook.graders import fp8 as graders
from workbook.check import assert_exact, assert_rel_close
from workbook.coverage import (
    assert_fully_written, consumer_differential, coverage, poisoned_allocations,
)
from workbook.device import DEVICE, ON_GPU

BF16 = torch.bfloat16


def make_x(m: int, n: int, seed: int = 0) -> torch.Tensor:
    """[m, 2n] bf16 with per-group magnitudes from 2^-12 to 2^10: exponent bytes vary and some
    groups have amax > 448 (scale > 1, exponent byte >= 128: the top byte sets the int32 sign)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2 * n, generator=g)
    mag = 2.0 ** torch.randint(-12, 11, (m, 2 * n // 128), generator=g).float()
    return (x * mag.repeat_interleave(128, dim=1)).to(BF16).to(DEVICE)


def check_against_reference(codes, scales, q_ref, s_ref, m, n):
    p = fp8.num_packed_words(n // 128)
    tm = fp8.tma_aligned_rows(m)
    assert codes.dtype == torch.float8_e4m3fn and tuple(codes.shape) == (m, n)
    assert scales.dtype == torch.int32 and tuple(scales.shape) == (m, p)
    assert scales.stride() == (1, tm), f"scales must be MN-major with stride (1, {tm}), got {scales.stride()}"
    assert scales.untyped_storage().nbytes() == p * tm * 4, "storage must be int32 [P, round_up(M, 4)]"
    assert_exact(codes, q_ref, "codes", hint="E4M3 bytes, round to nearest even")
    assert_exact(scales, s_ref, "packed scales")


# M = 1 (decode), not multiples of 4 (storage padding), a multiple of 4 (none), several row blocks;
# N with 1, 3, 5 (a half-used last word) and 16 groups
@pytest.mark.parametrize("m,n", [(1, 128), (1, 2048), (3, 640), (4, 384), (5, 640), (127, 2048), (300, 384)])
def test_fused_exact(m, n):
    x = make_x(m, n, seed=m * 7919 + n)
    codes, scales = fp8.silu_mul_quant_fp8_packed(x)
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    check_against_reference(codes, scales, q_ref, s_ref, m, n)
    # the exponent bytes themselves, unpacked through the view
    _, e_ref = fp8.quant_fp8_group_reference(fp8.silu_mul_reference(x))
    assert_exact(fp8.unpack_ue8m0(scales, n // 128), e_ref, "exponent bytes")


@pytest.mark.parametrize("m,n", [(1, 128), (5, 640), (33, 1152)])
def test_quant_only_exact(m, n):
    mag = 2.0 ** torch.randint(-10, 12, (m, n // 128)).repeat_interleave(128, 1)
    y = (torch.randn(m, n) * mag).to(BF16).to(DEVICE)
    codes, scales = fp8.quant_fp8_packed(y)
    q_ref, e_ref = fp8.quant_fp8_group_reference(y)
    check_against_reference(codes, scales, q_ref, fp8.pack_ue8m0_reference(e_ref), m, n)


def test_strided_rows_of_a_larger_buffer():
    """x may be a row slice of a bigger buffer (contiguous itself): the kernel uses x's row stride."""
    big = make_x(9, 256, seed=3)
    x = big[2:7]
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    codes, scales = fp8.silu_mul_quant_fp8_packed(x)
    check_against_reference(codes, scales, q_ref, s_ref, 5, 256)


def test_all_zero_group_gives_0x5E():
    m, n = 3, 640
    x = make_x(m, n, seed=11)
    x[0, 128:256] = 0.0  # gate of group 1, row 0 is zero: y = silu(0) * up = +-0
    x[1, n + 512:n + 640] = 0.0  # up of group 4, row 1 is zero: y = silu(gate) * 0 = +-0
    x[2, :n] = 0.0  # a whole row of zero gates
    codes, scales = fp8.silu_mul_quant_fp8_packed(x)
    e = fp8.unpack_ue8m0(scales, n // 128).cpu()
    assert e[0, 1] == 0x5E and e[1, 4] == 0x5E and (e[2] == 0x5E).all(), (
        f"all-zero groups must get exponent byte 0x5E (= ceil(log2(1e-10)) + 127), got {e.tolist()}")
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    check_against_reference(codes, scales, q_ref, s_ref, m, n)
    # signed zeros: the codes of -0.0 are 0x80, as torch's cast gives them
    assert (codes[2].view(torch.uint8).cpu() & 0x7F == 0).all()


def _e4m3_values() -> torch.Tensor:
    """All finite non-negative E4M3 values, ascending (0, 2^-9, ..., 448)."""
    v = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return v


def test_ties_subnormals_and_values_beyond_448():
    """Groups built so that y / s sits exactly on rounding ties (normal and subnormal range), next to
    them, and groups whose amax is beyond 448 (scale > 1)."""
    v = _e4m3_values()
    mids = (v[:-1] + v[1:]) / 2  # ties: 4 significant bits, exact in bf16
    group = torch.cat([mids, -mids[:1]])  # 126 + 1 values
    group = torch.cat([group, torch.tensor([448.0])])  # amax = 448 exactly -> s = 1, byte 127
    assert group.numel() == 128
    rows = [group, -group.flip(0)]
    for big in (450.0, 464.0, 512.0, 1000.0, 57344.0, 3.0e38):  # all exact in bf16 except the last
        rows.append(torch.cat([torch.tensor([big]), group[:127] * (big / 448.0)]))
    y = torch.stack(rows).to(BF16)
    # four groups per row, rotated: every row has groups with scale > 1 somewhere in its word
    y = torch.cat([y.roll(k, 0) for k in range(4)], dim=1).to(DEVICE)
    codes, scales = fp8.quant_fp8_packed(y)
    q_ref, e_ref = fp8.quant_fp8_group_reference(y)
    check_against_reference(codes, scales, q_ref, fp8.pack_ue8m0_reference(e_ref), y.shape[0], 512)
    e = fp8.unpack_ue8m0(scales, 4).cpu()
    # 448 -> s = 1; 450, 464, 512 -> s = 2; 1000 -> 4; 57344 = 448 * 2^7 -> 2^7
    assert e[:, 0].tolist()[:7] == [127, 127, 128, 128, 128, 129, 134], e[:, 0].tolist()
    assert e[7, 0] > 127 + 100
    assert (scales[:, 0].cpu() < 0).any(), "an exponent byte >= 128 in bits 24..31 makes the int32 negative"
    q = codes[0].view(torch.uint8).cpu()
    assert q[0] == 0x00 and q[1] == 0x02 and q[2] == 0x02 and q[126] == 0x80 and q[127] == 0x7E


def test_e4m3_round_wrapper():
    """The notebook's e4m3_round (common.e4m3_rne, tested exhaustively in test_common.py) through
    its fp8 wrapper: the interpreter's known bad case, ties, subnormals, and the clamp at 448."""
    vals = torch.tensor([-124.5, 124.5, 248.0, 3 * 2.0 ** -10, 2.0 ** -10, 0.0, -0.0, 500.0, -1e30])
    got = fp8.e4m3_round(vals.to(DEVICE)).cpu()
    assert_exact(got, vals.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8), "E4M3 bytes")


@pytest.mark.skipif(not ON_GPU, reason="the interpreter's .to(tl.float8e4nv) is known to mis-round")
def test_direct_cast_is_right_on_the_gpu():
    vals = torch.linspace(-448, 448, 8191, device=DEVICE)
    got = fp8.e4m3_direct_cast(vals)
    assert_exact(got, vals.to(torch.float8_e4m3fn), "tl.float8e4nv cast on the GPU")


@pytest.mark.parametrize("emulate", [None, True] if ON_GPU else [None])
def test_overflow_to_inf_saturates(emulate):
    """silu(gate) * up beyond bf16's range is +-inf in y (the unfused torch path gives inf too). That
    group's exponent is the largest finite fp32 value's, e = 120 (byte 247), and its inf elements
    saturate to +-448 (0x7E / 0xFE) like the GPU's FP8 cast, in the kernel (both paths) and in the
    reference; the group's finite elements scale to (nearly) zero; other groups are untouched."""
    m, n = 3, 256
    x = make_x(m, n, seed=11)
    big = torch.tensor(3.0e38, dtype=BF16)
    x[0, 5], x[0, n + 5] = big, big                 # silu(3e38) * 3e38 = +inf
    x[1, 130], x[1, n + 130] = big, -big            # -> -inf, in the second group
    x[2, 7], x[2, n + 7] = -big, big                # silu(-3e38) = -0.0: -0.0 * big = -0, finite
    y = fp8.silu_mul_reference(x).float().cpu()
    assert y[0, 5] == float("inf") and y[1, 130] == float("-inf") and y[2, 7] == 0.0
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    b = q_ref.view(torch.uint8).cpu()
    assert int(b[0, 5]) == 0x7E and int(b[1, 130]) == 0xFE, "inf saturates to +-448"
    e = fp8.unpack_ue8m0(s_ref.cpu(), n // 128)
    assert int(e[0, 0]) == 247 and int(e[1, 1]) == 247, "the exponent of the largest finite value"
    assert int(e[0, 1]) != 247 and int(e[2, 0]) != 247
    codes, scales = fp8.silu_mul_quant_fp8_packed(x, emulate=emulate)
    check_against_reference(codes, scales, q_ref, s_ref, m, n)


def test_silu_mul_every_bf16_gate():
    """y = silu(gate) * up for every finite bf16 gate with a random up (the product's rounding),
    bit-equal to the unfused torch path. (up = 1, the silu rounding alone, is what
    silu_impl_mismatches counts: test_silu_impl_choice_is_proven.)"""
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(BF16)
    g = g[torch.isfinite(g.float())]
    up = (torch.randn(g.shape, generator=torch.Generator().manual_seed(1)) * 4).to(BF16)
    gd, ud = g.to(DEVICE), up.to(DEVICE)
    y = fp8.silu_mul_bf16(gd, ud)
    ref = fp8.silu_mul_reference(torch.cat([gd[None], ud[None]], dim=1))[0]
    assert_exact(y, ref, "silu(gate) * up", hint=f"SILU_IMPL {fp8.silu_impl()}")


def test_silu_impl_choice_is_proven():
    impl = fp8.silu_impl()
    assert fp8.silu_impl_mismatches(impl) == 0
    # torch's own sequence (libdevice expf + IEEE division on a GPU) is exact by construction
    assert fp8.silu_impl_mismatches(0 if ON_GPU else 2) == 0
    with pytest.raises(ValueError, match="impl must be one of"):
        fp8.silu_mul_bf16(torch.ones(4, dtype=BF16, device=DEVICE), torch.ones(4, dtype=BF16, device=DEVICE), impl=7)


@pytest.mark.parametrize("m,n", [(5, 640), (130, 1152)])
def test_emulated_path_exact(m, n):
    """EMULATE=True (the integer roundings) with torch's own silu sequence, as the benchmark's
    integer-roundings peer runs it: compiled on a GPU, interpreted here."""
    x = make_x(m, n, seed=42)
    codes, scales = fp8.silu_mul_quant_fp8_packed(x, emulate=True, config={"SILU_IMPL": fp8.SILU_IMPL_TORCH})
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    check_against_reference(codes, scales, q_ref, s_ref, m, n)


@pytest.mark.skipif(not ON_GPU, reason="emulate=False (the hardware casts) needs a GPU")
@pytest.mark.parametrize("m,n", [(1, 128), (5, 640), (300, 2048), (4093, 7168)])
def test_both_paths_give_identical_bytes_on_the_gpu(m, n):
    """The GPU's conversion instructions (emulate=False) and the exact emulation (emulate=True):
    the same codes and packed words, byte for byte, for the fused and the quant-only kernel, and the
    same bf16 silu for every finite gate."""
    x = make_x(m, n, seed=m + n)
    for f, arg in ((fp8.silu_mul_quant_fp8_packed, x), (fp8.quant_fp8_packed, fp8.silu_mul_reference(x))):
        hw_q, hw_s = f(arg, emulate=False)
        em_q, em_s = f(arg, emulate=True)
        assert_exact(hw_q.view(torch.uint8), em_q.view(torch.uint8), "codes, hardware vs emulated")
        assert_exact(hw_s, em_s, "packed scales, hardware vs emulated")
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(BF16)
    g = g[torch.isfinite(g.float())].to(DEVICE)
    u = (torch.randn(g.shape) * 4).to(BF16).to(DEVICE)
    assert_exact(fp8.silu_mul_bf16(g, u, emulate=False), fp8.silu_mul_bf16(g, u, emulate=True), "silu-mul")


@pytest.mark.skipif(ON_GPU, reason="on a GPU emulate=False is the default path")
def test_emulate_false_needs_a_gpu():
    with pytest.raises(ValueError, match="emulate=False .* no GPU here"):
        fp8.silu_mul_quant_fp8_packed(make_x(1, 128), emulate=False)


def test_config_and_emulate_arguments():
    """Any power-of-two BLOCK_M tiles the rows exactly (same bytes); bad configs are named."""
    x = make_x(9, 128, seed=8)
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    for cfg in ({"BLOCK_M": 1}, {"BLOCK_M": 4, "num_warps": 2}, triton.Config({"BLOCK_M": 16}, num_warps=8)):
        codes, scales = fp8.silu_mul_quant_fp8_packed(x, config=cfg)
        check_against_reference(codes, scales, q_ref, s_ref, 9, 128)
    f = fp8.silu_mul_quant_fp8_packed
    with pytest.raises(ValueError, match=r"unknown keys \['BLOCK_N'\]"):
        f(x, config={"BLOCK_N": 4})
    with pytest.raises(ValueError, match=r"config\['BLOCK_M'\] must be a positive power of two"):
        f(x, config={"BLOCK_M": 6})
    with pytest.raises(ValueError, match=r"config\['SILU_IMPL'\] must be one of"):
        f(x, config={"SILU_IMPL": 7})
    with pytest.raises(TypeError, match="config must be a dict or a triton.Config"):
        f(x, config=[("BLOCK_M", 4)])
    with pytest.raises(TypeError, match="emulate must be None, True or False"):
        f(x, emulate=1)


def test_one_config_dict_and_its_size_rule():
    """CONFIG is the one dict of defaults; launch_config fills BLOCK_M by M and SILU_IMPL by the proof."""
    assert fp8.CONFIG == {"BLOCK_M": None, "num_warps": 2, "SILU_IMPL": None}
    cap = 2 if ON_GPU else 64
    for m, bm in ((1, 1), (2, 2), (3, min(cap, 4)), (4096, cap)):
        assert fp8.launch_config(m) == {"BLOCK_M": bm, "num_warps": 2, "SILU_IMPL": fp8.silu_impl()}
    assert fp8.launch_config(4096, {"BLOCK_M": 8})["BLOCK_M"] == 8
    assert fp8.CONFIG["BLOCK_M"] is None, "resolving a config must not change the defaults"
    assert "interpreter" in fp8.EMULATE_WHY   # the one reason, given to device.resolve_emulate


# ------------------------------------------------------------------------------------------------
# Coverage: poison the whole storage
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 4, 5, 127])
def test_whole_storage_poison(m):
    n = 640  # 5 groups: the last packed word holds one used byte and three zero bytes
    x = make_x(m, n, seed=m + 100)
    covs = assert_fully_written(fp8.silu_mul_quant_fp8_packed, x, scope="view", names=["codes", "scales"])
    c_codes, c_scales = covs
    assert c_codes.storage_fully_written, c_codes.report()
    # exactly the view is written: storage rows M..round_up(M,4)-1 are outside it and untouched
    tm = fp8.tma_aligned_rows(m)
    assert c_scales.storage_shape == (2, tm)
    assert torch.equal(c_scales.written, c_scales.in_view), c_scales.report()
    assert int((~c_scales.written).sum()) == 2 * (tm - m)
    # and what was written under poison is right (also the zero bytes of the half-used last word)
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    for pattern in ("nan", "7f"):
        with poisoned_allocations(pattern):
            codes, scales = fp8.silu_mul_quant_fp8_packed(x)
        check_against_reference(codes, scales, q_ref, s_ref, m, n)
        assert (scales[:, 1].cpu() >> 8 == 0).all(), "unused exponent bytes of the last word must be 0"


def test_quant_only_whole_storage_poison():
    y = (torch.randn(6, 384) * 5).to(BF16).to(DEVICE)
    c_codes, c_scales = coverage(fp8.quant_fp8_packed, y, names=["codes", "scales"])
    assert c_codes.storage_fully_written and c_scales.view_fully_written, c_codes.report() + c_scales.report()
    assert torch.equal(c_scales.written, c_scales.in_view)


def test_consumer_reads_only_written_bytes():
    m, n = 5, 640
    x = make_x(m, n, seed=5)
    chk = consumer_differential(fp8.silu_mul_quant_fp8_packed, fp8.dequantize_fp8_packed, x)
    assert chk.identical, chk.report()
    # a consumer that reads the whole storage (rows M..tma_M-1 included) does see the poison
    def storage_reader(codes, scales):  # the whole [P, tma_M] storage behind the view
        return torch.as_strided(scales, (2, fp8.tma_aligned_rows(m)), (fp8.tma_aligned_rows(m), 1)).clone()
    bad = consumer_differential(fp8.silu_mul_quant_fp8_packed, storage_reader, x)
    assert not bad.identical and bad.n_differ == 2 * (fp8.tma_aligned_rows(m) - m)


def test_dequantize_through_the_view():
    m, n = 7, 384
    x = make_x(m, n, seed=9)
    codes, scales = fp8.silu_mul_quant_fp8_packed(x)
    y = fp8.silu_mul_reference(x).float()
    deq = fp8.dequantize_fp8_packed(codes, scales)
    # E4M3 keeps 3 mantissa bits: per element at most 2^-4 relative, far less in the RMS sense
    assert_rel_close(deq, y, 0.05, "dequantized y")
    q_ref, e_ref = fp8.quant_fp8_group_reference(y.to(BF16))
    ref = q_ref.float().view(m, 3, 128) * torch.exp2(e_ref.float() - 127)[..., None]
    assert_exact(deq, ref.view(m, n), "dequantized values")


def test_pack_and_unpack_round_trip():
    e = torch.randint(0, 256, (6, 7), dtype=torch.int32).to(torch.uint8)
    packed = fp8.pack_ue8m0_reference(e)
    assert packed.shape == (6, 2) and packed.dtype == torch.int32
    assert_exact(fp8.unpack_ue8m0(packed, 7), e, "unpacked bytes")
    assert (packed[:, 1] >> 24 == 0).all(), "group 7 does not exist: byte 3 of word 1 must be 0"
    w = int(fp8.pack_ue8m0_reference(torch.tensor([[0x78, 0x7A, 0x5E, 0x81]], dtype=torch.uint8))[0, 0])
    assert w & 0xFFFFFFFF == 0x815E7A78


def test_empty_batch():
    x = torch.empty(0, 512, dtype=BF16, device=DEVICE)
    codes, scales = fp8.silu_mul_quant_fp8_packed(x)
    assert codes.shape == (0, 256) and scales.shape == (0, 1)


# ------------------------------------------------------------------------------------------------
# Bad inputs
# ------------------------------------------------------------------------------------------------

def test_bad_inputs():
    good = make_x(2, 128)
    f = fp8.silu_mul_quant_fp8_packed
    with pytest.raises(ValueError, match="multiple of group_size=128"):
        f(torch.zeros(2, 2 * 192, dtype=BF16, device=DEVICE).normal_())
    with pytest.raises(ValueError, match="must be even"):
        f(torch.randn(2, 257, device=DEVICE).to(BF16))
    with pytest.raises(ValueError, match="must be even and positive"):
        f(torch.empty(2, 0, dtype=BF16, device=DEVICE))
    with pytest.raises(TypeError, match=r"x must have dtype in \(bfloat16\)"):
        f(good.float())
    with pytest.raises(TypeError, match=r"x must have dtype in \(bfloat16\)"):
        f(good.half())
    with pytest.raises(ValueError, match="x is on meta but must be on"):
        f(torch.empty(2, 256, dtype=BF16, device="meta"))
    with pytest.raises(ValueError, match="x must be contiguous"):
        f(make_x(128, 128).T)  # [256, 128] with strides (1, 256)
    with pytest.raises(ValueError, match="x must be contiguous"):
        f(make_x(2, 256)[:, :256])
    with pytest.raises(ValueError, match="x must be 2-D"):
        f(good[None])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        f(good.tolist())
    with pytest.raises(ValueError, match="group_size must be 128"):
        f(good, group_size=64)
    with pytest.raises(TypeError, match="group_size must be an int"):
        f(good, group_size=128.0)
    with pytest.raises(ValueError, match="y's last dimension must be a positive multiple"):
        fp8.quant_fp8_packed(torch.randn(2, 200, device=DEVICE).to(BF16))
    with pytest.raises(TypeError, match="y must have dtype"):
        fp8.quant_fp8_packed(torch.randn(2, 128, device=DEVICE))
    codes, scales = f(good)
    with pytest.raises(ValueError, match=r"needs ceil\(3/4\) = 1"):
        fp8.unpack_ue8m0(torch.zeros(2, 2, dtype=torch.int32, device=DEVICE), 3)
    with pytest.raises(ValueError, match="num_groups must be a non-negative int"):
        fp8.unpack_ue8m0(scales, -1)
    with pytest.raises(TypeError, match="scales must have dtype in"):
        fp8.unpack_ue8m0(scales.float(), 1)
    with pytest.raises(TypeError, match="codes must have dtype in"):
        fp8.dequantize_fp8_packed(codes.view(torch.uint8), scales)
    with pytest.raises(ValueError, match=r"scales must be \[M=2, P\]"):
        fp8.dequantize_fp8_packed(codes, scales[:1])
    with pytest.raises(ValueError, match="gate and up must have the same shape"):
        fp8.silu_mul_bf16(good[0], good[1, :10])
    with pytest.raises(TypeError, match="v must have dtype"):
        fp8.e4m3_round(torch.ones(4, dtype=torch.float64, device=DEVICE))


@pytest.mark.parametrize("m,g", [(1, 1), (5, 5), (9, 8), (130, 13)])
def test_pack_kernel_mn_major(m, g):
    e = torch.randint(0, 256, (m, g), dtype=torch.int32).to(torch.uint8).to(DEVICE)
    covs = assert_fully_written(fp8.pack_ue8m0_mn_major, e, scope="view")
    assert torch.equal(covs[0].written, covs[0].in_view)
    with poisoned_allocations("a5"):
        s = fp8.pack_ue8m0_mn_major(e)
    assert s.stride() == (1, fp8.tma_aligned_rows(m))
    assert_exact(s, fp8.pack_ue8m0_reference(e), "packed words")
    with pytest.raises(TypeError, match="exp_bytes must have dtype in"):
        fp8.pack_ue8m0_mn_major(e.to(torch.int32))


# ------------------------------------------------------------------------------------------------
# Exercise graders: pass the solution, "not attempted" on the stub, fail wrong answers with the
# message that teaches
# ------------------------------------------------------------------------------------------------

def _stub(*args):
    raise NotImplementedError


def _fails(check, answer, *phrases):
    with pytest.raises(AssertionError) as err:
        check(answer)
    for phrase in phrases:
        assert phrase in str(err.value), f"expected {phrase!r} in the grader's message:\n{err.value}"
    return str(err.value)


def test_graders_pass_the_solutions_and_report_the_stubs_not_attempted():
    from workbook.check import grade

    graders.check_exponent_byte(graders.solution_exponent_byte)
    graders.check_pack(graders.solution_pack)
    graders.check_pack(fp8.pack_ue8m0_reference)
    graders.check_pack_kernel(fp8.pack_ue8m0_mn_major)
    graders.check_pack_kernel(_learner_pack())
    # writing zeros into the TMA padding rows is allowed (not required): it passes
    graders.check_pack_kernel(_learner_pack(store_rows="tma"))
    for check in (graders.check_exponent_byte, graders.check_pack, graders.check_pack_kernel):
        assert grade("stub", lambda: check(_stub)).status == "not attempted"


def _log2(a):
    return torch.log2(torch.clamp(a / 448, min=1e-10))


EXPONENT_BYTE_WRONG = {
    "floor": (lambda a: torch.floor(_log2(a)) + 127, ["round UP (ceil)", "amax = 223.99998 "]),
    "round": (lambda a: torch.round(_log2(a)) + 127, ["round UP (ceil)"]),
    "no bias": (lambda a: torch.ceil(_log2(a)), ["e + 127"]),
    "no floor: log2(0)": (lambda a: torch.ceil(torch.log2(a / 448)) + 127, ["log2(0) = -inf"]),
    "exponent clamped instead": (lambda a: torch.ceil(torch.log2(a / 448)).clamp(-127, 128) + 127,
                                 ["all-zero group"]),
    "int8 wraps": (lambda a: torch.ceil(_log2(a)).to(torch.int8) + 127, ["int8 wraps"]),
    "log2(448) subtracted as 9": (lambda a: torch.ceil(torch.log2(torch.clamp(a, min=1e-10))) - 9 + 127,
                                  ["is not ceil(log2(amax / 448))", "Divide first"]),
    "frexp's exponent": (lambda a: torch.frexp(torch.clamp(a / 448, min=1e-10))[1] + 127,
                         ["exactly where amax/448 is a power of two"]),
    "divided by 224": (lambda a: torch.ceil(torch.log2(torch.clamp(a / 224, min=1e-10))) + 127,
                       ["one too large", "448"]),
    "a list": (lambda a: [int(v) for v in graders.solution_exponent_byte(a)], ["return a tensor of shape"]),
}


@pytest.mark.parametrize("which", list(EXPONENT_BYTE_WRONG))
def test_grader_exponent_byte_fails_wrong_answers_with_the_intended_message(which):
    fn, phrases = EXPONENT_BYTE_WRONG[which]
    msg = _fails(graders.check_exponent_byte, fn, *phrases)
    if which == "floor":   # the values a hair around 224 = 448/2 are printed apart, not both as 224
        assert "224.00002" not in msg.replace("amax = 224.00002 (amax/448 = 0.50000006)", "")


def _words(e, shifts, n_words=None, dtype=torch.int32):
    m, g = e.shape
    p = n_words or fp8.num_packed_words(g)
    padded = torch.zeros(m, 4 * p, dtype=torch.int64)
    padded[:, :min(g, 4 * p)] = e[:, :4 * p].to(torch.int64)
    w = (padded.view(m, p, 4) << torch.tensor(shifts)).sum(-1)
    return w if dtype == torch.int64 else (w - ((w >> 31) << 32)).to(torch.int32)


def _uint8_shifts(e):  # shifting uint8 bytes: everything above bit 7 falls off
    m, g = e.shape
    padded = torch.zeros(m, 4 * fp8.num_packed_words(g), dtype=torch.uint8)
    padded[:, :g] = e
    return (padded.view(m, -1, 4) << torch.tensor([0, 8, 16, 24], dtype=torch.uint8)).sum(-1).to(torch.int32)


def _garbage_past_g(e):  # the missing groups of the last word filled with 0xFF
    m, g = e.shape
    padded = torch.full((m, 4 * fp8.num_packed_words(g)), 0xFF, dtype=torch.uint8)
    padded[:, :g] = e
    return padded.view(torch.int32)


PACK_WRONG = {
    "bytes reversed": (lambda e: _words(e, [24, 16, 8, 0]), ["bytes are reversed"]),
    "floor(G / 4) words": (lambda e: _words(e, [0, 8, 16, 24], n_words=e.shape[1] // 4), ["need ceil("]),
    "uint8 shifts": (_uint8_shifts, ["Byte 0 is right"]),
    "bytes past G not zero": (_garbage_past_g, ["past G) must leave their bytes 0"]),
    "int64 words": (lambda e: _words(e, [0, 8, 16, 24], dtype=torch.int64), ["return an int32 tensor, got torch.int64"]),
}


@pytest.mark.parametrize("which", list(PACK_WRONG))
def test_grader_pack_fails_wrong_answers_with_the_intended_message(which):
    fn, phrases = PACK_WRONG[which]
    _fails(graders.check_pack, fn, *phrases)


@triton.jit
def _learner_pack_kernel(e, s, M, G, stride_e, stride_s, STORE_ROWS, BLOCK_M: tl.constexpr,
                         REVERSED: tl.constexpr, ACCUMULATE: tl.constexpr, MASK_GROUPS: tl.constexpr):
    """Exercise 3 as a learner might write it, with switches for the variants the grader judges."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_j = tl.arange(0, 4)
    m_g = tl.program_id(1) * 4 + o_j < (G if MASK_GROUPS else 4 * G)
    b = tl.load(e + o_m[:, None] * stride_e + tl.program_id(1) * 4 + o_j[None, :],
                mask=(o_m < M)[:, None] & m_g[None, :], other=0).to(tl.int32)
    shifts = 24 - 8 * o_j if REVERSED else 8 * o_j
    w = tl.sum(b << shifts[None, :], axis=1)
    p_s = s + tl.program_id(1) * stride_s + o_m
    m_store = o_m < STORE_ROWS       # M, or the TMA rows (padding rows get 0 words: loads masked), or M + 1
    if ACCUMULATE:
        tl.store(p_s, tl.load(p_s, mask=m_store, other=0) | w, mask=m_store)
    else:
        tl.store(p_s, w, mask=m_store)


def _learner_pack(store_rows="m", reversed_bytes=False, alloc=torch.empty, one_block=False, alloc_rows="tma",
                  accumulate=False, mask_groups=True, stride="storage"):
    """A launcher for ``_learner_pack_kernel``: ``store_rows`` 'm', 'tma' or 'm+1' (the store mask),
    ``alloc_rows`` 'tma' or 'm' (the storage's rows), ``stride`` 'storage' (its stride) or 'tma'
    (round_up(M, 4) whatever was allocated)."""
    def launch(e):
        m, g = e.shape
        p, tm = fp8.num_packed_words(g), fp8.tma_aligned_rows(m)
        storage = alloc(p, tm if alloc_rows == "tma" else m, dtype=torch.int32, device=e.device)
        block = 16
        grid = (1 if one_block else triton.cdiv(tm, block), p)
        rows = {"m": m, "tma": tm, "m+1": m + 1}[store_rows]
        _learner_pack_kernel[grid](e, storage, m, g, e.stride(0), storage.stride(0) if stride == "storage" else tm,
                                   rows, BLOCK_M=block, REVERSED=reversed_bytes, ACCUMULATE=accumulate,
                                   MASK_GROUPS=mask_groups)
        return storage.T[:m, :]
    return launch


_ZERO_FILLED = ("M=1, G=1: `scales` was zero-filled (torch.zeros): that is the extra memset kernel this workbook "
                "removes. Allocate it with torch.empty")

PACK_KERNEL_WRONG = {
    "row-major words": (lambda e: _words(e.cpu(), [0, 8, 16, 24]).to(DEVICE), ["strides (1, "]),
    "one row block": (_learner_pack(one_block=True), ["never written", "ceil(M / BLOCK_M)"]),
    "bytes reversed": (_learner_pack(reversed_bytes=True), ["bytes are reversed"]),
    "zero-filled storage": (_learner_pack(store_rows="tma", alloc=torch.zeros), [_ZERO_FILLED]),
    "storage not TMA-aligned": (_learner_pack(alloc_rows="m"), ["M=1, G=1: the view must be storage.T[:M, :]",
                                                                "strides (1, 4)"]),
    # rows M..round_up(M, 4) stored into a [P, M] storage: the last word runs past its end
    "padding stored into an unpadded storage": (
        _learner_pack(alloc_rows="m", store_rows="tma", stride="tma"),
        ["M=1, G=1: your kernel stored past the end of `scales` (allocated [1, 1] int32 = 4 bytes; the layout "
         "needs int32 [P, round_up(M, 4)] = [1, 4] = 16 bytes", "guard zone"]),
    # m <= M: at M = 8 (no padding rows) row M of word p is token 0 of word p + 1, and past the last word
    "store mask m <= M": (_learner_pack(store_rows="m+1"), ["M=8, G=9: your kernel stored past the end of `scales`"]),
    "accumulated into the storage": (_learner_pack(accumulate=True), ["depend on what torch.empty left there",
                                                                      "store it once"]),
    # in the interpreter bounds_checked stops the load past the last row; on a GPU it reads stray bytes
    "groups past G loaded from the next row": (_learner_pack(mask_groups=False), [
        "groups past G loaded as 0" if ON_GPU else "M=1, G=1: your kernel tried a load outside every tensor"]),
}


@pytest.mark.parametrize("which", list(PACK_KERNEL_WRONG))
def test_grader_pack_kernel_fails_wrong_answers_with_the_intended_message(which):
    fn, phrases = PACK_KERNEL_WRONG[which]
    _fails(graders.check_pack_kernel, fn, *phrases)


# ------------------------------------------------------------------------------------------------
# The benchmark and its record (workbook/benchmarks/fp8.py, workbook/data/fp8.json)
# ------------------------------------------------------------------------------------------------

def test_recorded_benchmark_table_and_plot():
    import matplotlib
    matplotlib.use("Agg")
    from workbook.benchmarks import fp8 as bench
    from workbook.plots import fp8 as plots
    from workbook.records import load_record

    rec = load_record("fp8")
    rows = rec["results"]["rows"]
    assert [r["M"] for r in rows] == list(bench.BENCH_M) and {r["N"] for r in rows} == {bench.BENCH_N}
    for r in rows:
        assert r["bytes"] == bench.bytes_moved(r["M"], r["N"])
        for peer in bench.PEERS:
            assert r[f"{peer}_graph_us"] > 0 and r[f"{peer}_eager_us"] > 0 and r[f"{peer}_GBps"] > 0
    assert set(rec["timers"]) == {"graph", "eager"} and "bytes_model" in rec["results"]["notes"]
    assert all("graph_us" in s for s in rec["results"]["config_sweep"])
    text = bench.table(rec)
    assert len(text.splitlines()) == 2 + len(rows) and "fused graph us" in text
    assert plots.plot_bandwidth(rec) is not None
    assert bench.bytes_moved(1, 7168) == 35896


@pytest.mark.skipif(not ON_GPU, reason="the benchmark measures a GPU")
def test_benchmark_measures_a_valid_record():
    from workbook.benchmarks import fp8 as bench
    from workbook.records import validate_record

    m = bench.measure((1, 64), 256, ())
    rec = {"schema": 2, "name": "fp8", "recorded": "2026-01-01", "timers": m.timers, "ceilings": m.ceilings,
           "results": m.results, "machine": {"device": "cuda", "gpu": "gpu", "torch": "", "triton": "", "python": ""}}
    validate_record(rec)
    assert [r["M"] for r in m.results["rows"]] == [1, 64]
    assert all(r["exact"] and r["exact_integer_roundings"] for r in m.results["rows"])
    assert len(bench.table(rec).splitlines()) == 4
