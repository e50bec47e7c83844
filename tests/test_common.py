"""The device helpers shared by topics (kernels/common.py), each tested once and exhaustively where
the input space allows, against torch, on whichever device the kernels run (interpreter or GPU)."""
import pytest
import torch

import workbook  # noqa: F401  (before triton)
import triton
import triton.language as tl

from workbook.check import assert_exact
from workbook.device import DEVICE, ON_GPU
from workbook.kernels.common import bf16_to_fp32, div6_rn, e4m3_rne, round_to_bf16, unpack_pairs


@triton.jit
def _e4m3_probe(v, byte, val, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    b_byte, b_val = e4m3_rne(tl.clamp(tl.load(v + o, mask=m, other=0.0), -448.0, 448.0))
    tl.store(byte + o, b_byte, mask=m)
    tl.store(val + o, b_val, mask=m)


def test_e4m3_rne_every_value_tie_and_neighbour():
    """Every E4M3 value, every tie between neighbours, one fp32 ulp either side of every tie, tiny and
    subnormal values, values beyond 448 (saturate after the clamp), both signs and -0.0, against
    torch's round-to-nearest-even cast."""
    grid = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    mids = (grid[1:] + grid[:-1]) / 2                                              # every tie, exact
    up = mids.nextafter(torch.full_like(mids, 1e9))
    down = mids.nextafter(torch.zeros_like(mids))
    extra = torch.tensor([1e-30, 2.0 ** -10, 2.0 ** -10 * 0.999, 2.0 ** -6 * 0.99999, 2.0 ** -6,
                          448.0001, 449.0, 464.0, 1e4, 3.4e38, float("inf")])
    v = torch.cat([grid, mids, up, down, extra, torch.rand(3000) * 448, torch.rand(1000) * 2 ** -6])
    v = torch.cat([v, -v, torch.tensor([-0.0])])
    byte = torch.full(v.shape, -1, dtype=torch.int32, device=DEVICE)
    val = torch.full(v.shape, float("nan"), device=DEVICE)
    _e4m3_probe[(triton.cdiv(v.numel(), 1024),)](v.to(DEVICE), byte, val, v.numel(), BLOCK=1024)
    want = v.clamp(-448, 448).to(torch.float8_e4m3fn)
    assert_exact(byte.cpu().to(torch.uint8), want.view(torch.uint8), "e4m3_rne byte")
    assert_exact(val.cpu(), want.float(), "e4m3_rne value")
    assert (byte.cpu() >= 0).all() and (byte.cpu() <= 255).all()


@triton.jit
def _div6_kernel(y, q, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    tl.store(q + o, div6_rn(tl.load(y + o, mask=m, other=1.0)), mask=m)


def test_div6_rn_is_ieee_division():
    """div6_rn (three FP32 operations) equals IEEE y / 6 for every fp32 mantissa in two binades (the
    quotient's last bit depends only on the mantissa of y while it is a normal number), and for
    random y across the whole normal range."""
    mant = torch.arange(1 << 23, dtype=torch.int32)
    y = torch.cat([(mant | (127 << 23)).view(torch.float32), (mant | (128 << 23)).view(torch.float32),
                   torch.randint(1, 1 << 23, (100_000,), dtype=torch.int32).bitwise_or(
                       torch.randint(1, 255, (100_000,), dtype=torch.int32) << 23).view(torch.float32),
                   torch.tensor([0.0, 6.0, 2688.0, 448.0 * 6, 3.4e38])])
    y = y[y / 6 >= 2.0 ** -126]                       # normal quotients (smaller ones give the scale 0)
    q = torch.full_like(y, float("nan"), device=DEVICE)
    block = 1024 if ON_GPU else 1 << 20
    _div6_kernel[(triton.cdiv(y.numel(), block),)](y.to(DEVICE), q, y.numel(), BLOCK=block)
    assert_exact(q.cpu().view(torch.int32), (y / 6).view(torch.int32), "div6_rn bits")


@triton.jit
def _unpack_kernel(w, lo, hi, N, IS_BF16: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    b_lo, b_hi = unpack_pairs(tl.load(w + o, mask=m, other=0), IS_BF16)
    tl.store(lo + o, b_lo, mask=m)
    tl.store(hi + o, b_hi, mask=m)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_unpack_pairs_every_16_bit_pattern(dtype):
    """Every 16-bit pattern (subnormals, infinities and NaNs included) in both halves of a word."""
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    x = torch.stack([bits, bits.roll(12345)], dim=1).contiguous().view(dtype)       # [65536, 2]
    words = x.view(torch.int32).flatten()
    lo = torch.full(words.shape, 7.0, device=DEVICE)
    hi = torch.full(words.shape, 7.0, device=DEVICE)
    _unpack_kernel[(triton.cdiv(words.numel(), 4096),)](words.to(DEVICE), lo, hi, words.numel(),
                                                        IS_BF16=dtype == torch.bfloat16, BLOCK=4096)
    assert_exact(lo.cpu(), x[:, 0].float(), "low halves")
    assert_exact(hi.cpu(), x[:, 1].float(), "high halves")


@triton.jit
def _bf16_kernel(b, up, rounded, factor, N, EMULATE: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < N
    tl.store(up + o, bf16_to_fp32(tl.load(b + o, mask=m, other=0.0)), mask=m)
    tl.store(rounded + o, round_to_bf16(tl.load(up + o, mask=m, other=0.0) * factor, EMULATE), mask=m)


# 1 + 2^-8 puts a normal bf16 value exactly on a tie (half its ulp), 1 + 2^-8 + 2^-9 above one
# (truncation would round it down), 1 + 2^-10 below one
@pytest.mark.parametrize("factor", [1.00390625, 1.005859375, 1.0009765625])
@pytest.mark.parametrize("emulate", [True, False] if ON_GPU else [True])
def test_bf16_up_and_round_trip(emulate, factor):
    """bf16 -> fp32 for every finite bf16 value (subnormals included), and fp32 -> bf16 rounding of
    x * factor (ties, above and below a tie) against torch."""
    b = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    b = b[torch.isfinite(b.float()) & (b.float().abs() < 3e38)]
    up = torch.full(b.shape, float("nan"), device=DEVICE)
    rounded = torch.full(b.shape, float("nan"), device=DEVICE)
    _bf16_kernel[(triton.cdiv(b.numel(), 4096),)](b.to(DEVICE), up, rounded, factor, b.numel(), EMULATE=emulate,
                                                 BLOCK=4096)
    assert_exact(up.cpu(), b.float(), "bf16 -> fp32")
    assert_exact(rounded.cpu(), (b.float() * factor).to(torch.bfloat16).float(), "fp32 -> bf16")
