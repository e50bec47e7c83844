"""Buffers block fusion: the pass's replacement counts (0 with buffer passing, one per attention site
with the return style), both styles equal, the fused add + RMSNorm kernel against the unfused chain,
tensor parallel TP=2 over gloo against TP=1, bad input.

torch.compile is slow on a small CPU: the decoder is tiny and each style compiles once per process
(module fixture); the TP=2 run compiles both styles once in each of its two spawned ranks.
"""
import pytest
import torch

from workbook import fusion as fu
from workbook.check import assert_rel_close
from workbook.coverage import assert_fully_written, poisoned_allocations
from workbook.device import DEVICE, ON_GPU

T_PAD, N = 12, 9          # a batch padded to 12 rows, 9 real tokens


def _hidden(cfg, T=T_PAD, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(T, cfg.hidden, generator=gen).to(DEVICE, cfg.dtype)


# --------------------------------------------------------------------------------------------------
# The fused kernel
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,D", [(1, 1), (7, 33), (65, 100), (3, 257)])
def test_add_rmsnorm_matches_unfused_chain(M, D, dtype):
    gen = torch.Generator().manual_seed(M * 1000 + D)
    x, r = (torch.randn(M, D, generator=gen).to(DEVICE, dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(D, generator=gen)).to(DEVICE, dtype)
    out, h = fu.add_rmsnorm(x, r, w)
    ref_out, ref_h = fu.add_rmsnorm_ref(x, r, w)
    # the new residual is one rounded add: exact
    assert torch.equal(h, ref_h)
    assert_rel_close(out.float(), ref_out.float(), 1e-6 if dtype == torch.float32 else 8e-3, "normed")
    # empty is right for both outputs: every element is written (poisoned two ways, whole storage)
    assert_fully_written(fu.add_rmsnorm, x, r, w, names=["out", "residual_out"])


@pytest.mark.skipif(not ON_GPU, reason="emulate=False runs the hardware bf16 casts: GPU only")
def test_add_rmsnorm_both_paths_on_gpu():
    x, r = (torch.randn(33, 2049, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(2049, device=DEVICE, dtype=torch.bfloat16)
    a, b = fu.add_rmsnorm(x, r, w, emulate=True), fu.add_rmsnorm(x, r, w, emulate=False)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_fused_op_equals_unfused_chain_with_one_rank():
    x, r = (torch.randn(5, 48, device=DEVICE) for _ in range(2))
    w = torch.randn(48, device=DEVICE)
    out, h = torch.ops.workbook.fused_all_reduce_add_rmsnorm(x, r, w, fu.EPS)
    ref_out, ref_h = fu.add_rmsnorm_ref(fu.all_reduce(x), r, w)
    assert torch.equal(h, ref_h)
    assert_rel_close(out, ref_out, 1e-6, "normed")


def test_add_rmsnorm_bad_input():
    x = torch.randn(4, 8, device=DEVICE)
    w = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        fu.add_rmsnorm(x, torch.randn(4, 9, device=DEVICE), w)
    with pytest.raises(TypeError, match="share one dtype"):
        fu.add_rmsnorm(x, x.double().float().half(), w)
    with pytest.raises(ValueError, match="weight must be"):
        fu.add_rmsnorm(x, x, torch.ones(7, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        fu.add_rmsnorm(x.t(), x.t(), torch.ones(4, device=DEVICE))
    with pytest.raises(ValueError, match=r"unknown keys \[.BLOCK_N.\]"):
        fu.add_rmsnorm(x, x, w, config={"BLOCK_N": 4})
    if not ON_GPU:
        with pytest.raises(ValueError, match="emulate=False needs a GPU"):
            fu.add_rmsnorm(x, x, w, emulate=False)


# --------------------------------------------------------------------------------------------------
# The decoder, eager
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo():
    cfg = fu.DEMO
    return cfg, fu.make_decoder_weights(cfg)


def test_styles_equal_eager(demo):
    cfg, w = demo
    h = _hidden(cfg)
    with torch.no_grad():
        a = fu.MiniDecoder(cfg, w, "buffer")(h, N)[:N]
        b = fu.MiniDecoder(cfg, w, "return")(h, N)[:N]
    assert_rel_close(a, b, 1e-5, "buffer vs return")


def test_buffer_padding_rows_never_reach_real_rows(demo):
    """``output = torch.empty_like(x)`` leaves rows [num_tokens:] unwritten: poisoned two ways, the
    real rows of the decoder's output do not change (nobody reads the padding rows into them)."""
    cfg, w = demo
    h = _hidden(cfg)
    m = fu.MiniDecoder(cfg, w, "buffer")
    outs = []
    for which in (0, 1):
        with torch.no_grad(), poisoned_allocations(which) as mode:
            outs.append(m(h, N))
        assert mode.count > 0
    assert torch.equal(outs[0][:N], outs[1][:N])
    assert torch.isfinite(outs[0][:N]).all()
    assert torch.isnan(outs[0][N:]).any()    # the padding rows did hold the poison


def test_decoder_bad_input(demo):
    cfg, w = demo
    m = fu.MiniDecoder(cfg, w, "buffer")
    h = _hidden(cfg)
    with pytest.raises(ValueError, match="num_tokens must be an int in \\[1, T_pad = 12\\]"):
        m(h, T_PAD + 1)
    with pytest.raises(ValueError, match="num_tokens"):
        m(h, 0)
    with pytest.raises(ValueError, match="num_tokens"):
        m(h, 3.0)
    with pytest.raises(ValueError, match="hidden must be"):
        m(torch.randn(4, cfg.hidden + 1, device=DEVICE), 2)
    with pytest.raises(TypeError, match="hidden must have dtype"):
        m(h.double(), 2)
    with pytest.raises(ValueError, match="style must be"):
        fu.MiniDecoder(cfg, w, "buffers")
    with pytest.raises(ValueError, match="gdn_k_heads=2 must be divisible by world_size=3"):
        fu.shard_weights(cfg, w, 0, 3)
    with pytest.raises(ValueError, match="rank"):
        fu.shard_weights(cfg, w, 2, 2)


# --------------------------------------------------------------------------------------------------
# Compiled: the headline counts
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled(demo):
    cfg, w = demo
    h = _hidden(cfg)
    res = {}
    for style in ("buffer", "return"):
        fusion = fu.FusionPass(cfg.dtype)
        before, after = [], []
        fn = fu.compile_decoder(fu.MiniDecoder(cfg, w, style), fusion, before=before, after=after)
        with torch.no_grad():
            out = fn(h, N)
            out_full = fn(_hidden(cfg, 16, seed=2), 16)   # another size, num_tokens == T_pad: no recompile
        res[style] = dict(fusion=fusion, before=before, after=after, out=out, out_full=out_full)
    return res


def test_replacement_counts_0_then_2(demo, compiled):
    cfg, _ = demo
    assert compiled["buffer"]["fusion"].log == ["Replaced 0 patterns"]
    assert compiled["return"]["fusion"].log == ["Replaced 2 patterns"]
    for style in ("buffer", "return"):
        e = fu.expected_sites(cfg, style)
        assert compiled[style]["fusion"].counts == [e["attention"] + e["mlp"]]


def test_graphs_show_why(compiled):
    b0, b1 = (fu.count_ops(compiled["buffer"][k][0]) for k in ("before", "after"))
    r0, r1 = (fu.count_ops(compiled["return"][k][0]) for k in ("before", "after"))
    assert b0.get("slice_scatter") == 2 and b0.get("all_reduce") == 2
    assert b1 == b0                                   # nothing replaced
    assert "slice_scatter" not in r0 and r0.get("all_reduce") == 2
    assert r1.get("fused_all_reduce_add_rmsnorm") == 2 and "all_reduce" not in r1


def test_compiled_equals_eager_and_styles_equal(demo, compiled):
    cfg, w = demo
    with torch.no_grad():
        ref = fu.MiniDecoder(cfg, w, "return")(_hidden(cfg), N)[:N]
        ref16 = fu.MiniDecoder(cfg, w, "return")(_hidden(cfg, 16, seed=2), 16)
    for style in ("buffer", "return"):
        assert_rel_close(compiled[style]["out"][:N], ref, 1e-5, f"compiled {style}")
        assert_rel_close(compiled[style]["out_full"], ref16, 1e-5, f"compiled {style}, num_tokens == T_pad")


# --------------------------------------------------------------------------------------------------
# Tensor parallel: TP=2 (gloo, two spawned processes) equals TP=1, same counts
# --------------------------------------------------------------------------------------------------

@pytest.mark.skipif(ON_GPU, reason="the spawned ranks run on the CPU (gloo, Triton interpreter); on GPUs the "
                                   "NCCL run is `torchrun --nproc-per-node 2 -m workbook.fusion --bench`")
def test_tp2_gloo_equals_tp1():
    cfg = fu.SMOKE          # shard_mlp=True: the MLP sites are all-reduce sites too
    weights = fu.make_decoder_weights(cfg, device="cpu")
    h = _hidden(cfg).cpu()
    with torch.no_grad():
        ref = fu.MiniDecoder(cfg, {**weights}, "return").to("cpu")(h, N)[:N]
    ranks = fu.run_tp(cfg, h, N, world_size=2, compiled=True, timeout_s=300)
    for r, res in enumerate(ranks):
        for style in ("buffer", "return"):
            e = fu.expected_sites(cfg, style)
            assert res[style]["counts"] == [e["attention"] + e["mlp"]], (r, style, res[style]["counts"])
            assert_rel_close(res[style]["out"], ref, 1e-5, f"TP=2 rank {r} {style}")
    assert ranks[0]["buffer"]["counts"] == [2] and ranks[0]["return"]["counts"] == [4]
