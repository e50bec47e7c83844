"""Gated DeltaNet: the Triton kernels against the naive fp32 recurrence, poisoned outputs, bad inputs.

Bounds (relative error ||out - ref|| / ||ref|| against the fp32 naive recurrence, fp32 inputs):
2e-3 for the recurrent kernel, 5e-3 for the chunked kernel, final states included. bf16 inputs keep
w, u, v', h in bf16 (as flash-linear-attention does) and are held to a looser, stated bound.
"""
import inspect

import pytest
import torch

from workbook import gdn
from workbook.check import assert_rel_close
from workbook.coverage import assert_fully_written, consumer_differential, find_redundant_zero_fills, poison_
from workbook.device import DEVICE, ON_GPU

REC_BOUND, CHUNK_BOUND = 2e-3, 5e-3
KERNELS = {"recurrent": (gdn.fused_recurrent_gated_delta_rule, REC_BOUND),
           "chunk": (gdn.chunk_gated_delta_rule, CHUNK_BOUND)}

# (T, D, gate, initial state, H, HV): every T and D of the issue, gates from ~0 to strongly decaying,
# with and without an initial state, value heads outnumbering key heads in some.
CASES = [
    (1, 128, "near0", True, 1, 2),
    (63, 64, "strong", False, 1, 1),
    (64, 128, "mixed", True, 1, 2),
    (65, 64, "near0", True, 2, 2),
    (300, 128, "strong", True, 1, 1),
    (300, 64, "medium", False, 1, 2),
]


def _ref(x, **kw):
    return gdn.naive_recurrent_gated_delta_rule(**x, output_final_state=True, **kw)


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("T,D,gate,h0,H,HV", CASES)
def test_matches_naive_recurrence(kind, T, D, gate, h0, H, HV):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(1 if T > 64 else 2, T, H, D, HV=HV, gate=gate, initial_state=h0, seed=T + D)
    ro, rh = _ref(x)
    o, ht = fn(**x, output_final_state=True)
    assert o.dtype == x["v"].dtype and ht.dtype == torch.float32
    assert_rel_close(o, ro, bound, f"{kind} o")
    assert_rel_close(ht, rh, bound, f"{kind} final state")


@pytest.mark.parametrize("kind", list(KERNELS))
def test_varlen_matches_per_sequence(kind):
    fn, bound = KERNELS[kind]
    cu = torch.tensor([0, 15, 100, 300], device=DEVICE)
    x = gdn.make_inputs(1, 300, 1, 64, HV=2, gate="mixed", seed=3)
    x["initial_state"] = torch.randn(3, 2, 64, 64, device=DEVICE) * 0.5
    o, ht = fn(**x, output_final_state=True, cu_seqlens=cu)
    ro, rh = _ref(x, cu_seqlens=cu)
    assert_rel_close(o, ro, bound, f"{kind} varlen o")
    assert_rel_close(ht, rh, bound, f"{kind} varlen final state")
    # sequence 1 alone gives the same numbers: no state leaks across a cu_seqlens boundary
    one = {n: (t[:, 15:100] if n != "initial_state" else t[1:2]) for n, t in x.items()}
    o1, h1 = fn(**{n: t.contiguous() for n, t in one.items()}, output_final_state=True)
    assert_rel_close(o[:, 15:100], o1, 1e-5, "sequence 1 inside the batch vs alone")
    assert_rel_close(ht[1], h1[0], 1e-5, "final state of sequence 1")


@pytest.mark.parametrize("kind", list(KERNELS))
def test_empty_sequence_keeps_its_state(kind):
    fn, _ = KERNELS[kind]
    cu = torch.tensor([0, 20, 20, 70], device=DEVICE)
    x = gdn.make_inputs(1, 70, 1, 32, gate="medium", seed=4)
    x["initial_state"] = torch.randn(3, 1, 32, 32, device=DEVICE)
    _, ht = fn(**x, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(ht[1], x["initial_state"][1]), "a zero-length sequence must hand back its initial state"


@pytest.mark.parametrize("kind", list(KERNELS))
def test_l2norm_in_kernel(kind):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(2, 70, 2, 64, HV=4, gate="mixed", initial_state=True, normalize_qk=False, seed=5)
    ro, rh = _ref(x, use_qk_l2norm_in_kernel=True)
    o, ht = fn(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, scale=0.3)
    ro2, rh2 = _ref(x, use_qk_l2norm_in_kernel=True, scale=0.3)
    assert_rel_close(o, ro2, bound, f"{kind} o with l2norm + scale")
    assert_rel_close(ht, rh2, bound, f"{kind} state with l2norm")
    assert not torch.allclose(ro, ro2), "scale must change the output"


@pytest.mark.parametrize("kind", list(KERNELS))
def test_inplace_final_state(kind):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(2, 65, 1, 64, HV=2, gate="medium", initial_state=True, seed=6)
    _, rh = _ref(x)
    h = x.pop("initial_state").clone()
    o, ht = fn(**x, initial_state=h, inplace_final_state=True)
    assert ht is h, "inplace_final_state must return the initial_state tensor itself"
    assert_rel_close(h, rh, bound, f"{kind} state updated in place")


@pytest.mark.parametrize("kind,bound", [("recurrent", 1e-2), ("chunk", 3e-2)])
def test_bf16_inputs(kind, bound):
    fn, _ = KERNELS[kind]
    x = gdn.make_inputs(1, 130, 2, 64, dtype=torch.bfloat16, gate="mixed", initial_state=True, seed=7)
    ro, rh = _ref(x)
    o, ht = fn(**x, output_final_state=True)
    assert o.dtype == torch.bfloat16
    assert_rel_close(o, ro, bound, f"{kind} bf16 o")
    assert_rel_close(ht, rh, bound, f"{kind} bf16 state")


def test_chunked_torch_reference_matches_recurrence():
    cu = torch.tensor([0, 15, 100, 200], device=DEVICE)
    x = gdn.make_inputs(1, 200, 1, 32, HV=2, gate="mixed", seed=8)
    x["initial_state"] = torch.randn(3, 2, 32, 32, device=DEVICE)
    co, ch = gdn.chunk_gated_delta_rule_ref(**x, output_final_state=True, cu_seqlens=cu)
    ro, rh = _ref(x, cu_seqlens=cu)
    assert_rel_close(co, ro, 1e-5, "chunked torch reference o")
    assert_rel_close(ch, rh, 1e-5, "chunked torch reference state")


def test_reference_is_the_delta_rule():
    # one token, zero state: o = beta * (q . k) * v * scale, final state = beta k v^T
    x = gdn.make_inputs(1, 1, 1, 8, gate="near0", seed=9)
    o, h = _ref(x)
    qk = float((x["q"][0, 0, 0] * x["k"][0, 0, 0]).sum())
    b = float(x["beta"][0, 0, 0])
    torch.testing.assert_close(o[0, 0, 0], b * qk * x["v"][0, 0, 0] * 8 ** -0.5)
    torch.testing.assert_close(h[0, 0], b * torch.outer(x["k"][0, 0, 0], x["v"][0, 0, 0]))


# --------------------------------------------------------------------------------------------------
# Poison: every element of every output (whole storages) is written
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(KERNELS))
def test_outputs_fully_written_under_poison(kind):
    fn, _ = KERNELS[kind]
    cu = torch.tensor([0, 15, 100, 130], device=DEVICE)
    x = gdn.make_inputs(1, 130, 1, 48, V=40, HV=2, gate="mixed", seed=10)   # K, V not powers of two
    x["initial_state"] = torch.randn(3, 2, 48, 40, device=DEVICE)
    small = ({"BV": 16} if kind == "recurrent"   # several value blocks, masked edges
             else {"state": {"BV": 16}, "output": {"BV": 16}})
    covs = assert_fully_written(lambda: fn(**x, output_final_state=True, cu_seqlens=cu, config=small),
                                names=["o", "final_state"])
    assert all(c.storage_fully_written for c in covs)


def test_chunk_intermediates_fully_written_under_poison():
    cu = torch.tensor([0, 15, 100, 130], device=DEVICE)
    x = gdn.make_inputs(1, 130, 1, 32, HV=2, gate="mixed", seed=11)

    def run():
        o, _, inter = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, return_intermediates=True)
        return (o, *inter.values())

    assert_fully_written(run, names=["o", "G", "w", "u", "v_new", "h"])


def test_caller_poisoned_state_is_overwritten_in_place():
    x = gdn.make_inputs(1, 10, 1, 32, gate="medium", seed=12)
    h = torch.randn(1, 1, 32, 32, device=DEVICE)
    ref = h.clone()
    _, rh = _ref({**x, "initial_state": ref})
    gdn.chunk_gated_delta_rule(**x, initial_state=h, inplace_final_state=True)
    assert_rel_close(h, rh, CHUNK_BOUND, "in-place state")


def test_consumer_reads_only_written_bytes():
    x = gdn.make_inputs(1, 70, 1, 32, HV=2, gate="mixed", seed=13)
    z = torch.randn(1, 70, 2, 32, device=DEVICE)
    w = torch.randn(32, device=DEVICE)
    chk = consumer_differential(lambda: gdn.chunk_gated_delta_rule(**x)[0],
                                lambda o: gdn.gated_rmsnorm(o, z, w))
    assert chk.identical, chk.report()


# --------------------------------------------------------------------------------------------------
# Gated RMSNorm and the block
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
def test_gated_rmsnorm(dtype, bound):
    x = torch.randn(3, 5, 4, 48, device=DEVICE).to(dtype)
    z = torch.randn(3, 5, 4, 48, device=DEVICE).to(dtype)
    w = (1 + 0.1 * torch.randn(48, device=DEVICE)).to(dtype)
    y = gdn.gated_rmsnorm(x, z, w)
    xf = x.float()
    ref = w.float() * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * z.float() * torch.sigmoid(z.float())
    assert_rel_close(y, ref, bound, "gated rmsnorm")
    assert_rel_close(gdn.gated_rmsnorm_ref(x, z, w), ref, bound, "gated rmsnorm reference")
    assert_fully_written(lambda: gdn.gated_rmsnorm(x, z, w), names=["y"])


def test_block_returns_output_and_matches_reference():
    p = gdn.make_block_params(hidden=48, num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=16)
    hidden = torch.randn(2, 70, 48, device=DEVICE)
    ref = gdn.qwen3_next_linear_attention(hidden, p, kernel="reference")
    for kernel in ("chunk", "recurrent"):
        out = gdn.qwen3_next_linear_attention(hidden, p, kernel=kernel)
        assert out.shape == hidden.shape
        assert_rel_close(out, ref, 5e-3, f"block with the {kernel} kernel")
    assert_fully_written(lambda: gdn.qwen3_next_linear_attention(hidden, p), names=["out"])


def test_zero_fill_before_full_copy_is_redundant():
    p = gdn.make_block_params(hidden=32, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)
    hidden = torch.randn(1, 20, 32, device=DEVICE)
    rep = find_redundant_zero_fills(gdn.qwen3_next_linear_attention, hidden, p, legacy_z_zero_fill=True)
    lines, start = inspect.getsourcelines(gdn.z_handoff_zero_then_copy)
    line = start + next(i for i, s in enumerate(lines) if "z_out.zero_()" in s)
    assert rep.verdict(f"gdn.py:{line}") == "redundant", rep.report()
    out_a = gdn.qwen3_next_linear_attention(hidden, p, legacy_z_zero_fill=True)
    out_b = gdn.qwen3_next_linear_attention(hidden, p)
    assert torch.equal(out_a, out_b)


def test_zero_fill_detector_can_see_a_necessary_fill():
    def partial(z):
        out = torch.zeros(z.shape[0] + 2, *z.shape[1:], dtype=z.dtype, device=z.device)
        out[:-2] = z          # the last two rows rely on the zero fill
        return out
    rep = find_redundant_zero_fills(partial, torch.randn(4, 3, device=DEVICE))
    assert rep.necessary and not rep.redundant


# --------------------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------------------

def _good(**over):
    x = gdn.make_inputs(1, 8, 1, 16, HV=2, initial_state=False, seed=14)
    x.update(over)
    return x


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("over,exc,match", [
    ({"q": "not a tensor"}, TypeError, "q must be a torch.Tensor"),
    ({"q": torch.randn(1, 8, 16)}, ValueError, "q must be 4-D"),
    ({"k": torch.randn(1, 8, 1, 32)}, ValueError, "k must have q's shape"),
    ({"v": torch.randn(1, 9, 2, 16)}, ValueError, "v must be"),
    ({"q": torch.randn(1, 8, 2, 16), "k": torch.randn(1, 8, 2, 16), "v": torch.randn(1, 8, 3, 16),
      "g": -torch.rand(1, 8, 3), "beta": torch.rand(1, 8, 3)}, ValueError, "positive multiple"),
    ({"q": torch.randn(1, 8, 1, 16, dtype=torch.float64)}, TypeError, "q must have dtype"),
    ({"k": torch.randn(1, 8, 1, 16).bfloat16()}, TypeError, "share one dtype"),
    ({"q": torch.randn(1, 8, 1, 16, 2, device=DEVICE)[..., 0]}, ValueError, "contiguous"),  # .to() would densify
    ({"g": -torch.rand(1, 8, 1)}, ValueError, r"g must be \[B, T, HV\]"),
    ({"beta": torch.rand(1, 8, 2).int()}, TypeError, "beta must have dtype"),
    ({"scale": -1.0}, ValueError, "scale must be"),
    ({"initial_state": torch.randn(2, 2, 16, 16)}, ValueError, r"initial_state must be \[N, HV, K, V\]"),
    ({"q": torch.randn(1, 8, 1, 300), "k": torch.randn(1, 8, 1, 300)}, ValueError, "key head dim"),
])
def test_bad_inputs(kind, over, exc, match):
    fn, _ = KERNELS[kind]
    over = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in over.items()}
    with pytest.raises(exc, match=match):
        fn(**_good(**over))


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("cu,match", [
    ([0, 3, 9], "end at T=8"),
    ([1, 3, 8], "start at 0"),
    ([0, 5, 3, 8], "non-decreasing"),
    ([8], "at least 2"),
])
def test_bad_cu_seqlens(kind, cu, match):
    fn, _ = KERNELS[kind]
    with pytest.raises(ValueError, match=match):
        fn(**_good(), cu_seqlens=torch.tensor(cu, device=DEVICE))


@pytest.mark.parametrize("kind", list(KERNELS))
def test_bad_cu_seqlens_dtype_batch_and_inplace(kind):
    fn, _ = KERNELS[kind]
    with pytest.raises(TypeError, match="cu_seqlens must have dtype"):
        fn(**_good(), cu_seqlens=torch.tensor([0.0, 8.0], device=DEVICE))
    x = gdn.make_inputs(2, 8, 1, 16, seed=15)
    with pytest.raises(ValueError, match="batch size must be 1"):
        fn(**x, cu_seqlens=torch.tensor([0, 8], device=DEVICE))
    with pytest.raises(ValueError, match="inplace_final_state=True needs an initial_state"):
        fn(**_good(), inplace_final_state=True)
    x = _good()
    x["initial_state"] = torch.randn(2, 2, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"initial_state must be \[N, HV, K, V\] = \[1, 2, 16, 16\]"):
        fn(**x, cu_seqlens=torch.tensor([0, 8], device=DEVICE))


def test_wrong_device_is_named():
    other = "cpu" if ON_GPU else "meta"
    x = _good(q=torch.empty(1, 8, 1, 16, device=other))
    with pytest.raises(ValueError, match="q is on"):
        gdn.chunk_gated_delta_rule(**x)


def test_bad_norm_and_block_inputs():
    x = torch.randn(4, 32, device=DEVICE)
    w = torch.randn(32, device=DEVICE)
    with pytest.raises(ValueError, match="z must have x's shape"):
        gdn.gated_rmsnorm(x, torch.randn(4, 31, device=DEVICE), torch.randn(31, device=DEVICE))
    with pytest.raises(TypeError, match="z must have x's dtype"):
        gdn.gated_rmsnorm(x, x.bfloat16(), w)
    with pytest.raises(ValueError, match="weight must be"):
        gdn.gated_rmsnorm(x, x, torch.randn(16, device=DEVICE))
    with pytest.raises(ValueError, match="eps must be"):
        gdn.gated_rmsnorm(x, x, w, eps=0)
    p = gdn.make_block_params(hidden=32, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)
    with pytest.raises(ValueError, match="kernel must be"):
        gdn.qwen3_next_linear_attention(torch.randn(1, 4, 32, device=DEVICE), p, kernel="flash")
    with pytest.raises(ValueError, match="hidden's last dim"):
        gdn.qwen3_next_linear_attention(torch.randn(1, 4, 33, device=DEVICE), p)


def test_poison_helpers_see_an_unwritten_row():
    # the tests above can fail: a launcher that skips the last chunk's rows is caught
    x = gdn.make_inputs(1, 70, 1, 16, seed=16)

    def broken():
        o, ht = gdn.chunk_gated_delta_rule(**x)
        bad = torch.empty_like(o)
        bad[:, :64] = o[:, :64]
        return bad

    with pytest.raises(AssertionError, match="not fully written"):
        assert_fully_written(broken, names=["o"])
    o = gdn.chunk_gated_delta_rule(**x)[0]
    poison_(o)
    with pytest.raises(AssertionError, match="NaN"):
        assert_rel_close(o, gdn.naive_recurrent_gated_delta_rule(**x)[0], CHUNK_BOUND)


# --------------------------------------------------------------------------------------------------
# flash-linear-attention's calling conventions
# --------------------------------------------------------------------------------------------------

def test_recurrent_takes_fla_positional_order():
    # fla: fused_recurrent_gated_delta_rule(q, k, v, g, gk, gv, beta, scale, initial_state, output_final_state)
    x = gdn.make_inputs(1, 20, 1, 32, HV=2, gate="medium", initial_state=True, seed=17)
    ro, rh = _ref(x)
    o, ht = gdn.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], None, None, x["beta"], None,
                                                 x["initial_state"], True)
    assert_rel_close(o, ro, REC_BOUND, "positional o")
    assert_rel_close(ht, rh, REC_BOUND, "positional state")
    # chunk: (q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel)
    o, ht = gdn.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True)
    assert_rel_close(o, ro, CHUNK_BOUND, "positional chunk o")


@pytest.mark.parametrize("kind", list(KERNELS))
def test_fla_gate_options(kind):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(1, 70, 1, 32, HV=2, gate="medium", initial_state=True, seed=18)
    raw_a = torch.randn(1, 70, 2, device=DEVICE)
    raw_b = torch.randn(1, 70, 2, device=DEVICE)
    A_log = torch.tensor([0.3, -0.5], device=DEVICE)
    dt_bias = torch.tensor([0.1, 0.7], device=DEVICE)
    g = -A_log.exp() * torch.nn.functional.softplus(raw_a + dt_bias)
    for neg in (False, True):
        beta = torch.sigmoid(raw_b) * (2 if neg else 1)
        ro, rh = _ref({**x, "g": g, "beta": beta})
        o, ht = fn(**{**x, "g": raw_a, "beta": raw_b}, output_final_state=True, use_gate_in_kernel=True,
                   A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)
        assert_rel_close(o, ro, bound, f"{kind} gate in kernel (neg eig {neg})")
        assert_rel_close(ht, rh, bound, f"{kind} state, gate in kernel")


def test_recurrent_defaults_g_and_beta_like_fla():
    x = gdn.make_inputs(1, 9, 1, 16, seed=19)
    ro, _ = _ref({**x, "g": torch.zeros_like(x["g"]), "beta": torch.ones_like(x["beta"])})
    o, _ = gdn.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"])
    assert_rel_close(o, ro, REC_BOUND, "g=None (no decay), beta=None (ones)")


@pytest.mark.parametrize("kw,match", [
    ({"gk": "x"}, "gk / gv"),
    ({"state_v_first": True}, "state_v_first"),
    ({"allow_neg_eigval": True}, "requires use_beta_sigmoid_in_kernel"),
    ({"use_gate_in_kernel": True}, "needs the raw gate input g and A_log"),
    ({"use_gate_in_kernel": True, "A_log": torch.zeros(3)}, r"A_log must be \[HV\]"),
    ({"use_gate_in_kernel": True, "A_log": torch.zeros(2), "dt_bias": torch.zeros(3)}, r"dt_bias must be \[HV\]"),
])
def test_unsupported_or_bad_fla_options(kw, match):
    kw = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    x = _good()
    if "gk" in kw:
        with pytest.raises(ValueError, match=match):
            gdn.fused_recurrent_gated_delta_rule(**x, **kw)
        return
    for fn in (gdn.fused_recurrent_gated_delta_rule, gdn.chunk_gated_delta_rule):
        with pytest.raises(ValueError, match=match):
            fn(**x, **kw)


def test_cu_seqlens_cpu_must_agree():
    x = gdn.make_inputs(1, 8, 1, 16, seed=20)
    cu = torch.tensor([0, 3, 8], device=DEVICE)
    o1, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    o2, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu)
    assert torch.equal(o1, o2)
    with pytest.raises(ValueError, match="cu_seqlens_cpu must hold the same offsets"):
        gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 4, 8]))
