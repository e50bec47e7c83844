"""Gated DeltaNet: the Triton kernels against the naive fp32 recurrence, poisoned outputs, bad inputs.

Bounds (relative error ||out - ref|| / ||ref|| against the fp32 naive recurrence, fp32 inputs):
2e-3 for the recurrent kernel, 5e-3 for the chunked kernel, final states included. bf16 inputs keep
w, u, v', h in bf16 (as flash-linear-attention does) and are held to a looser, stated bound.
"""
import contextlib
import inspect

import pytest
import torch

from workbook import device, gdn, timing
from workbook.benchmarks import gdn as bench
from workbook.check import assert_rel_close
from workbook.coverage import (assert_fully_written, bounds_checked, consumer_differential, find_redundant_zero_fills,
                               poison_, poisoned_allocations)
from workbook.device import DEVICE, ON_GPU
from workbook.graders import gdn as graders
from workbook.plots import gdn as plots
from workbook.records import DATA_DIR, Measurement, carry_over, load_record

REC_BOUND, CHUNK_BOUND = 2e-3, 5e-3
KERNELS = {"recurrent": (gdn.fused_recurrent_gated_delta_rule, REC_BOUND),
           "chunk": (gdn.chunk_gated_delta_rule, CHUNK_BOUND)}

# (T, D, gate, initial state, H, HV): T = 1, 63, 64, 65, 70, 130 and D = 64, 128, gates from ~0 to strongly decaying,
# with and without an initial state, value heads outnumbering key heads in some.
CASES = [
    (1, 128, "near0", True, 1, 2),
    (63, 64, "strong", False, 1, 1),
    (64, 128, "mixed", True, 1, 2),
    (65, 64, "near0", True, 2, 2),
    (130, 128, "strong", True, 1, 1),
    (70, 64, "medium", False, 1, 2),
]


def _ref(x, **kw):
    return gdn.naive_recurrent_gated_delta_rule(**x, output_final_state=True, **kw)


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("T,D,gate,h0,H,HV", CASES)
def test_matches_naive_recurrence(kind, T, D, gate, h0, H, HV):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(1 if T >= 64 else 2, T, H, D, HV=HV, gate=gate, initial_state=h0, seed=T + D)
    ro, rh = _ref(x)
    o, ht = fn(**x, output_final_state=True)
    assert o.dtype == x["v"].dtype and ht.dtype == torch.float32
    assert_rel_close(o, ro, bound, f"{kind} o")
    assert_rel_close(ht, rh, bound, f"{kind} final state")


@pytest.mark.parametrize("kind", list(KERNELS))
def test_varlen_matches_per_sequence(kind):
    fn, bound = KERNELS[kind]
    cu = torch.tensor([0, 5, 70, 76], device=DEVICE)   # sequence 1 (65 tokens) spans two chunks
    x = gdn.make_inputs(1, 76, 1, 32, gate="mixed", seed=3)
    x["initial_state"] = torch.randn(3, 1, 32, 32, device=DEVICE) * 0.5
    o, ht = fn(**x, output_final_state=True, cu_seqlens=cu)
    ro, rh = _ref(x, cu_seqlens=cu)
    assert_rel_close(o, ro, bound, f"{kind} varlen o")
    assert_rel_close(ht, rh, bound, f"{kind} varlen final state")
    # sequence 1 alone gives the same numbers: no state leaks across a cu_seqlens boundary
    one = {n: (t[:, 5:70] if n != "initial_state" else t[1:2]) for n, t in x.items()}
    o1, h1 = fn(**{n: t.contiguous() for n, t in one.items()}, output_final_state=True)
    assert_rel_close(o[:, 5:70], o1, 1e-5, "sequence 1 inside the batch vs alone")
    assert_rel_close(ht[1], h1[0], 1e-5, "final state of sequence 1")


@pytest.mark.parametrize("kind", list(KERNELS))
def test_empty_sequence_keeps_its_state(kind):
    fn, _ = KERNELS[kind]
    cu = torch.tensor([0, 20, 20, 70], device=DEVICE)
    x = gdn.make_inputs(1, 70, 1, 32, gate="medium", seed=4)
    x["initial_state"] = torch.randn(3, 1, 32, 32, device=DEVICE)
    _, ht = fn(**x, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(ht[1], x["initial_state"][1]), "a zero-length sequence must hand back its initial state"
    for cu in ([0, 0], [0, 0, 0]):   # every sequence empty (no token at all): nothing to launch but the states
        x = gdn.make_inputs(1, 0, 1, 32, HV=2, seed=4)
        x["initial_state"] = torch.randn(len(cu) - 1, 2, 32, 32, device=DEVICE)
        for seg in ((None, 3) if kind == "chunk" else (None,)):
            kw = {"segments": seg} if kind == "chunk" else {}
            o, ht = fn(**x, output_final_state=True, cu_seqlens=torch.tensor(cu, device=DEVICE), **kw)
            assert o.shape == (1, 0, 2, 32) and torch.equal(ht, x["initial_state"]), (cu, seg)


@pytest.mark.parametrize("kind", list(KERNELS))
def test_l2norm_in_kernel(kind):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(1, 40, 1, 32, HV=2, gate="mixed", initial_state=True, normalize_qk=False, seed=5)
    ro, rh = _ref(x, use_qk_l2norm_in_kernel=True)
    o, ht = fn(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, scale=0.3)
    ro2, rh2 = _ref(x, use_qk_l2norm_in_kernel=True, scale=0.3)
    assert_rel_close(o, ro2, bound, f"{kind} o with l2norm + scale")
    assert_rel_close(ht, rh2, bound, f"{kind} state with l2norm")
    assert not torch.allclose(ro, ro2), "scale must change the output"


@pytest.mark.parametrize("kind", list(KERNELS))
def test_inplace_final_state(kind):
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(2, 20, 1, 64, HV=2, gate="medium", initial_state=True, seed=6)
    _, rh = _ref(x)
    h = x.pop("initial_state").clone()
    o, ht = fn(**x, initial_state=h, inplace_final_state=True)
    assert ht is h, "inplace_final_state must return the initial_state tensor itself"
    assert_rel_close(h, rh, bound, f"{kind} state updated in place")


@pytest.mark.parametrize("kind,bound", [("recurrent", 1e-2), ("chunk", 3e-2)])
def test_bf16_inputs(kind, bound):
    fn, _ = KERNELS[kind]
    x = gdn.make_inputs(1, 70, 2, 64, dtype=torch.bfloat16, gate="mixed", initial_state=True, seed=7)
    ro, rh = _ref(x)
    o, ht = fn(**x, output_final_state=True)
    assert o.dtype == torch.bfloat16
    assert_rel_close(o, ro, bound, f"{kind} bf16 o")
    assert_rel_close(ht, rh, bound, f"{kind} bf16 state")


def test_chunked_torch_reference_matches_recurrence():
    cu = torch.tensor([0, 15, 85, 100], device=DEVICE)
    x = gdn.make_inputs(1, 100, 1, 32, HV=2, gate="mixed", seed=8)
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
    # chunk: sequence 1 crosses a chunk boundary; recurrent (no chunks): a short batch is enough
    cu = torch.tensor([0, 5, 70] if kind == "chunk" else [0, 3, 12], device=DEVICE)
    x = gdn.make_inputs(1, int(cu[-1]), 1, 48, V=40, HV=2, gate="mixed", seed=10)   # K, V not powers of two
    x["initial_state"] = torch.randn(2, 2, 48, 40, device=DEVICE)
    small = ({"BV": 16} if kind == "recurrent"   # several value blocks, masked edges
             else {"state": {"BV": 16}, "output": {"BV": 16}})
    covs = assert_fully_written(lambda: fn(**x, output_final_state=True, cu_seqlens=cu, config=small),
                                names=["o", "final_state"])
    assert all(c.storage_fully_written for c in covs)


@pytest.mark.parametrize("form", ["fuse_wu", "split", "from_a"])
def test_chunk_intermediates_fully_written_under_poison(form):
    # two sequences, the second over two chunks (3 = the chunk-count bound: h has no spare rows); the
    # in-kernel L2 norm adds kn, written by one of the two value heads of its key head; w and u written by
    # kernel 1 (FUSE_WU) or by kernel 2; with FROM_A neither exists and the state pass reads A's whole rows
    cu = torch.tensor([0, 5, 70], device=DEVICE)
    x = gdn.make_inputs(1, 70, 1, 32, HV=2, gate="mixed", normalize_qk=False, seed=11)
    assert gdn.chunk_count_bound(70, 2) == 3
    cfg = {"solve": {"FUSE_WU": form == "fuse_wu"}, "state": {"FROM_A": form == "from_a"}}

    def run():
        o, _, inter = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                                 return_intermediates=True, config=cfg)
        assert (inter["w"] is None) == (inter["u"] is None) == (form == "from_a")
        return (o, *(t for t in inter.values() if t is not None))

    names = ["o", "G", "A", "w", "u", "v_new", "h", "kn"]
    assert_fully_written(run, names=[n for n in names if form != "from_a" or n not in ("w", "u")])


@pytest.mark.parametrize("dtype,K,V", [(torch.float32, 48, 40), (torch.bfloat16, 48, 40), (torch.bfloat16, 16, 64)])
def test_state_pass_forms_v_from_A(dtype, K, V):
    # FROM_A: no kernel 2; the state pass forms v' = A diag(beta) (V - exp(G) K h) from A, the values and the keys,
    # outputs folded in or not: the four-kernel form's numbers up to where they round (fp32: rounding only), and
    # the recurrence's; a varlen batch with a one-token sequence and one over a chunk boundary, K != V (not powers
    # of two; and the narrowest key tile with a value width where the rule can pick FROM_A), several value blocks,
    # keys and queries normalised in the kernel; o and the final state poisoned twice
    cu = torch.tensor([0, 1, 70, 76], device=DEVICE)
    x = gdn.make_inputs(1, 76, 2, K, V=V, HV=4, gate="mixed", normalize_qk=False, seed=61, dtype=dtype)
    x["initial_state"] = torch.randn(3, 4, K, V, device=DEVICE) * 0.5
    kw = dict(output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    o1, h1 = gdn.chunk_gated_delta_rule(**x, **kw, config={"state": {"BV": 16, "FUSE_O": False, "FROM_A": False}})
    ro, rh = _ref(x, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    fp32, full = dtype == torch.float32, (dtype, K) == (torch.bfloat16, 48)   # the other cases: the default pairing
    for fuse_o in (False, True) if full else (True,):
        cfg = {"state": {"BV": 16, "FUSE_O": fuse_o, "FROM_A": True}}
        runs = []   # the results of the coverage check's runs (each fully written)
        assert_fully_written(lambda: runs.append(gdn.chunk_gated_delta_rule(**x, **kw, config=cfg)) or runs[-1],
                             names=["o", "final_state"])
        o2, h2 = runs[-1]
        for got, want, ref, name in ((o2, o1, ro, "o"), (h2, h1, rh, "final state")):
            assert_rel_close(got, want, 1e-5 if fp32 else 2e-2, f"{name}: FROM_A (FUSE_O {fuse_o}) vs four kernels")
            assert_rel_close(got, ref, CHUNK_BOUND if fp32 else 2e-2, f"{name}: FROM_A (FUSE_O {fuse_o}) vs recurrence")
    if not full:
        return
    *_, inter = gdn.chunk_gated_delta_rule(**x, **kw, config={"state": {"FROM_A": True}}, return_intermediates=True)
    assert inter["w"] is None and inter["u"] is None and inter["A"] is not None
    # segments: the [B | M] pass and the last pass both form v' from A (values [v, 0_K] in the first)
    o3, h3 = gdn.chunk_gated_delta_rule(**x, **kw, segments=1, config={"state": {"FROM_A": True}})
    assert_rel_close(o3, o1, 1e-5 if fp32 else 2e-2, "o: segments with FROM_A vs four kernels")
    assert_rel_close(h3, h1, 1e-5 if fp32 else 2e-2, "final state: segments with FROM_A vs four kernels")


def test_state_pass_with_outputs_folded_in():
    # FUSE_O: the state pass computes the outputs itself (h and v' never stored): the same numbers as the
    # four kernels, on a varlen batch (a sequence over a chunk boundary), K and V not powers of two,
    # several value blocks, q and k normalised in the kernel; every element of o written (poisoned twice).
    cu = torch.tensor([0, 5, 70, 76], device=DEVICE)
    x = gdn.make_inputs(1, 76, 1, 48, V=40, HV=2, gate="mixed", normalize_qk=False, seed=28)
    x["initial_state"] = torch.randn(3, 2, 48, 40, device=DEVICE) * 0.5
    kw = dict(output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, scale=0.3)
    fused = {"state": {"BV": 16, "FUSE_O": True}}
    runs = []   # the fused call's results from the coverage check's runs (each fully written)
    assert_fully_written(lambda: runs.append(gdn.chunk_gated_delta_rule(**x, **kw, config=fused)) or runs[-1],
                         names=["o", "final_state"])
    o2, h2 = runs[-1]
    o1, h1 = gdn.chunk_gated_delta_rule(**x, **kw, config={"state": {"BV": 16}})
    assert_rel_close(o2, o1, 1e-6, "o, FUSE_O vs four kernels")
    assert_rel_close(h2, h1, 1e-6, "final state, FUSE_O vs four kernels")
    ro, rh = _ref(x, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, scale=0.3)
    assert_rel_close(o2, ro, CHUNK_BOUND, "o, FUSE_O vs the recurrence")
    x1 = gdn.make_inputs(1, 1, 1, 16, seed=28)   # one token: the smallest call that shows the form
    *_, inter = gdn.chunk_gated_delta_rule(**x1, config=fused, return_intermediates=True)
    assert {"h", "v_new"} <= set(inter), "return_intermediates runs the four-kernel form, which has h and v'"


@pytest.mark.parametrize("dtype,gv", [(torch.float32, 1), (torch.bfloat16, 2)])
def test_solve_with_w_u_folded_in(dtype, gv):
    # FUSE_WU: kernel 1 computes w and u from A in its registers, kernel 2 is not launched: the same bits as
    # the two kernels (A rounded to the storage dtype as kernel 2 reads it back), on a varlen batch with a
    # one-token sequence and one over a chunk boundary, K != V not powers of two, two value heads per
    # program; w and u written in full (poisoned twice) and A neither allocated nor stored when nobody keeps it.
    cu = torch.tensor([0, 1, 70, 76], device=DEVICE)
    x = gdn.make_inputs(1, 76, 2, 48, V=40, HV=4, gate="mixed", normalize_qk=False, seed=29, dtype=dtype)
    kw = dict(output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    fused = {"solve": {"GV": gv, "FUSE_WU": True}}

    def run():
        o, ht, inter = gdn.chunk_gated_delta_rule(**x, **kw, config=fused, return_intermediates=True)
        return o, ht, inter["w"], inter["u"]

    assert_fully_written(run, names=["o", "final_state", "w", "u"])
    o2, h2, w2, u2 = run()
    o1, h1, inter = gdn.chunk_gated_delta_rule(**x, **kw, config={"solve": {"GV": gv, "FUSE_WU": False}},
                                               return_intermediates=True)
    for got, want, name in ((w2, inter["w"], "w"), (u2, inter["u"], "u"), (o2, o1, "o"), (h2, h1, "final state")):
        if ON_GPU:   # two compiled kernels: allow a differently ordered fp32 sum
            assert_rel_close(got, want, 1e-5, f"{name}: FUSE_WU vs kernels 1 + 2")
        else:
            assert torch.equal(got, want), f"{name}: FUSE_WU differs from kernels 1 + 2"
    args = [t.reshape(1, 76, *t.shape[2:]) for t in (x["k"], x["v"], x["g"], x["beta"])]
    assert gdn._intermediates(gdn._chunk_config(fused), *args, cu, 3, l2=True, emulate=not ON_GPU)["A"] is None


def _chunk_inverse_ref(kk, beta, G, cu, chunk=gdn.CHUNK):
    """A as the solve kernel stores it ([T, HV, chunk]): per chunk and value head, rows of
    (I + strict_lower(beta_i k_i.k_j exp(G_i - G_j)))^-1 from torch's triangular solve, zeros to the right."""
    T, HV = beta.shape
    H = kk.shape[1]
    A = torch.zeros(T, HV, chunk, dtype=torch.float64)
    bounds = cu.tolist()
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        for t0 in range(bos, eos, chunk):
            n = min(chunk, eos - t0)
            for hv in range(HV):
                kc = kk[t0:t0 + n, hv // (HV // H)].double()
                Gc = G[t0:t0 + n, hv].double()
                low = torch.tril(torch.ones(n, n, dtype=torch.bool), -1)
                L = torch.where(low, beta[t0:t0 + n, hv].double()[:, None] * (kc @ kc.T)
                                * torch.exp(torch.where(low, Gc[:, None] - Gc[None, :], 0.)), 0.)
                eye = torch.eye(n, dtype=torch.float64)
                A[t0:t0 + n, hv, :n] = torch.linalg.solve_triangular(eye + L, eye, upper=False)
    return A


@pytest.mark.parametrize("solve", [{}, {"BC": 2}, {"BC": 4, "GV": 2}, {"BC": 64}, {"PREC": "tf32x3", "GV": 2}])
def test_solve_variants_store_the_chunk_inverse(solve):
    # Every launch variant of kernel 1 (diagonal blocks of BC rows by substitution, then merges; GV value
    # heads per program sharing K K^T) stores the same (I + L)^-1, whole rows, on a varlen batch whose
    # second sequence ends inside its second chunk; the in-kernel L2 norm makes the program that stores kn matter.
    cu = torch.tensor([0, 5, 80], device=DEVICE)
    x = gdn.make_inputs(1, 80, 1, 32, HV=2, gate="strong", normalize_qk=False, seed=26)
    _, _, inter = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                             return_intermediates=True, config={"solve": solve})
    kk = gdn.l2norm(x["k"][0].float()).cpu()
    assert_rel_close(inter["kn"].cpu(), kk, 1e-6, "kn")
    G = inter["G"].cpu()
    ref = _chunk_inverse_ref(kk, x["beta"][0].cpu(), G, cu.cpu())
    assert ref[:, :, 1:].abs().max() > 0.1, "a test of the inverse needs off-diagonal weight"
    assert_rel_close(inter["A"].cpu().double(), ref, 1e-5, f"A with solve config {solve}")


def test_solve_config_is_checked():
    x = gdn.make_inputs(1, 8, 1, 16, seed=27)
    for bad in ({"BC": 1}, {"BC": 3}, {"BC": 128}, {"GV": 0}, {"PREC": "ieee"}):
        with pytest.raises(ValueError, match=r"config\['solve'\] needs BC a power of two"):
            gdn.chunk_gated_delta_rule(**x, config={"solve": bad})


@pytest.mark.parametrize("lens", [[1], [63, 64, 65], [0, 5, 0, 130], [200]])
def test_chunk_table_is_fully_written_and_right(lens):
    # the device-built chunk table (empty storage, written by the table kernel alone): every row of
    # chunk_indices up to the bound and every entry of chunk_offsets, against a plain Python count;
    # empty sequences own no chunk, and rows past the true count say sequence -1
    N, T = len(lens), sum(lens)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(N)], device=DEVICE)
    assert_fully_written(lambda: gdn._chunk_table(cu, N, T)[:2], names=["chunk_indices", "chunk_offsets"])
    idx, off, nt_max = gdn._chunk_table(cu, N, T)
    chunks = [(n, c) for n, L in enumerate(lens) for c in range(-(-L // gdn.CHUNK))]
    offsets = [0] + [sum(-(-L // gdn.CHUNK) for L in lens[:i + 1]) for i in range(N)]
    assert nt_max == gdn.chunk_count_bound(T, N) >= len(chunks)
    assert idx[:len(chunks)].tolist() == [list(c) for c in chunks]
    assert (idx[len(chunks):, 0] == -1).all()
    assert off.tolist() == offsets


def test_caller_poisoned_state_is_overwritten_in_place():
    x = gdn.make_inputs(1, 10, 1, 32, gate="medium", seed=12)
    h = torch.randn(1, 1, 32, 32, device=DEVICE)
    ref = h.clone()
    _, rh = _ref({**x, "initial_state": ref})
    gdn.chunk_gated_delta_rule(**x, initial_state=h, inplace_final_state=True)
    assert_rel_close(h, rh, CHUNK_BOUND, "in-place state")


def test_consumer_reads_only_written_bytes():
    x = gdn.make_inputs(1, 40, 1, 32, HV=2, gate="mixed", seed=13)
    z = torch.randn(1, 40, 2, 32, device=DEVICE)
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
    p = gdn.make_block_params(hidden=32, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)
    hidden = torch.randn(1, 20, 32, device=DEVICE)
    ref = gdn.qwen3_next_linear_attention(hidden, p, kernel="reference")
    for kernel in ("chunk", "recurrent"):
        out = gdn.qwen3_next_linear_attention(hidden, p, kernel=kernel)
        assert out.shape == hidden.shape
        assert_rel_close(out, ref, 5e-3, f"block with the {kernel} kernel")
    assert_fully_written(lambda: gdn.qwen3_next_linear_attention(hidden, p), names=["out"])


def test_zero_fill_before_full_copy_is_redundant():
    p = gdn.make_block_params(hidden=32, num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)
    hidden = torch.randn(1, 8, 32, device=DEVICE)
    # the recurrent kernel: the fill is in the block around it, whichever kernel runs (and this one is
    # the faster of the two in Triton's interpreter)
    rep = find_redundant_zero_fills(gdn.qwen3_next_linear_attention, hidden, p, legacy_z_zero_fill=True,
                                    kernel="recurrent")
    lines, start = inspect.getsourcelines(gdn.z_handoff_zero_then_copy)
    line = start + next(i for i, s in enumerate(lines) if "z_out.zero_()" in s)
    assert rep.verdict(f"gdn.py:{line}") == "redundant", rep.report()
    out_a = gdn.qwen3_next_linear_attention(hidden, p, legacy_z_zero_fill=True, kernel="recurrent")
    out_b = gdn.qwen3_next_linear_attention(hidden, p, kernel="recurrent")
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
    # the values are checked from the host copy (cu_seqlens_cpu), never by reading the device tensor
    fn, _ = KERNELS[kind]
    with pytest.raises(ValueError, match=match):
        fn(**_good(), cu_seqlens=torch.tensor(cu, device=DEVICE), cu_seqlens_cpu=torch.tensor(cu))


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
    x = gdn.make_inputs(1, 20, 1, 32, HV=2, gate="medium", initial_state=True, seed=18)
    raw_a = torch.randn(1, 20, 2, device=DEVICE)
    raw_b = torch.randn(1, 20, 2, device=DEVICE)
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


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("inplace", [False, True])
def test_state_v_first_takes_and_returns_v_first_states(kind, inplace):
    """fla's state_v_first=True: initial and final states are [N, HV, V, K]. The same call on the K-first states
    gives the same output and the transposed final state; with inplace_final_state the caller's V-first tensor is
    overwritten by it (K != V, so a layout mix-up cannot pass)."""
    fn, bound = KERNELS[kind]
    x = gdn.make_inputs(1, 67, 1, 32, HV=2, V=16, gate="medium", initial_state=True, seed=41)
    ro, rh = _ref(x)
    h0_vk = x["initial_state"].transpose(-1, -2).contiguous()
    before = h0_vk.clone()
    o, ht = fn(**{**x, "initial_state": h0_vk}, state_v_first=True, output_final_state=not inplace,
               inplace_final_state=inplace)
    assert_rel_close(o, ro, bound, f"{kind} o, V-first states")
    assert ht.shape == (1, 2, 16, 32) and ht.is_contiguous()
    assert_rel_close(ht.transpose(-1, -2), rh, bound, f"{kind} final state, V-first")
    if inplace:
        assert ht is h0_vk and not torch.equal(h0_vk, before)
    else:
        assert torch.equal(h0_vk, before)   # the caller's initial state is read, never written
    o2, ht2 = fn(**{**x, "initial_state": before.clone()}, state_v_first=True)   # no final state asked for
    assert ht2 is None and torch.equal(o2, o)
    with pytest.raises(ValueError, match=r"must be \[N, HV, V, K\] = \[1, 2, 16, 32\] .*state_v_first=True\), got \[1, 2, 32, 16\]"):
        fn(**x, state_v_first=True)   # a K-first state passed as V-first: named in the caller's layout


@pytest.mark.parametrize("kw,match", [
    ({"gk": "x"}, "gk / gv"),
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


@pytest.mark.parametrize("kind", list(KERNELS))
def test_raw_fla_inputs_are_checked_as_given(kind):
    """The inputs an fla option transforms before the kernels (the raw gate, raw beta, a V-first state) are checked
    as the caller gave them: a wrong g is named as g (not as A_log, which the transform would compare it with), a
    broadcastable one is refused rather than broadcast, and a V-first state must be contiguous like any state (an
    expanded one would otherwise reach the in-place copy back). A numpy scale is a number like any other."""
    fn, _ = KERNELS[kind]
    A_log = torch.zeros(2, device=DEVICE)
    with pytest.raises(ValueError, match=r"g must be \[B, T, HV\] = \[1, 8, 2\] \(raw"):
        fn(**_good(g=torch.randn(1, 8, 1, device=DEVICE)), use_gate_in_kernel=True, A_log=A_log)
    with pytest.raises(TypeError, match="g must have dtype"):
        fn(**_good(g=torch.zeros(1, 8, 2, dtype=torch.int32, device=DEVICE)), use_gate_in_kernel=True, A_log=A_log)
    with pytest.raises(ValueError, match="beta must be contiguous"):
        fn(**_good(beta=torch.randn(1, 2, 8, device=DEVICE).transpose(1, 2)), use_beta_sigmoid_in_kernel=True)
    h0 = torch.randn(1, 2, 16, 16, device=DEVICE).expand(1, 2, 16, 16).transpose(-1, -2)
    with pytest.raises(ValueError, match="initial_state must be contiguous"):
        fn(**_good(initial_state=h0), state_v_first=True, inplace_final_state=True)
    np = pytest.importorskip("numpy")
    o1, _ = fn(**_good(), scale=np.float32(0.5))
    o2, _ = fn(**_good(), scale=0.5)
    assert torch.equal(o1, o2)


@pytest.mark.skipif(ON_GPU, reason="the launchers run on the GPU there, with cu_seqlens on the device")
@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("cu,match", [([0, 5, 3, 8], "non-decreasing"), ([0, 3, 7], "end at T=8"),
                                      ([0, 3, 9], "end at T=8"), ([2, 8], "start at 0")])
def test_host_offsets_are_checked_on_the_host(kind, cu, match):
    """cu_seqlens on the host (a CPU run): its values are checked without a host copy, as reading
    them costs nothing there; on a GPU only cu_seqlens_cpu is read (test_bad_cu_seqlens)."""
    fn, _ = KERNELS[kind]
    with pytest.raises(ValueError, match=match):
        fn(**_good(), cu_seqlens=torch.tensor(cu))
    # a valid host copy that differs from the host tensor it copies: refused (the copy alone passes the checks)
    with pytest.raises(ValueError, match="cu_seqlens_cpu must be cu_seqlens' host copy"):
        copy = torch.tensor({4: [0, 3, 5, 8], 3: [0, 3, 8], 2: [0, 8]}[len(cu)])
        fn(**_good(), cu_seqlens=torch.tensor(cu), cu_seqlens_cpu=copy)


@pytest.mark.parametrize("kind", list(KERNELS))
def test_forward_only_inputs_and_scale_checked(kind):
    """The kernels have no backward: an input that requires a gradient, with grad mode on, is refused (else the
    output would silently carry none); under no_grad it runs. A bool scale is refused like any non-number."""
    fn, _ = KERNELS[kind]
    x = _good()
    x["q"] = x["q"].clone().requires_grad_()
    with pytest.raises(ValueError, match="forward only"):
        fn(**x)
    with torch.no_grad():
        fn(**x)
    with pytest.raises(ValueError, match="scale must be"):
        fn(**_good(), scale=True)


@pytest.mark.parametrize("kind", list(KERNELS))
@pytest.mark.parametrize("qk,v", [(torch.float32, torch.float16), (torch.bfloat16, torch.float16),
                                  (torch.float16, torch.float32)])
def test_mixed_dtypes_as_fla_accepts_them(kind, qk, v):
    """fla's own tests pass fp32 q/k with fp16 v and beta: computed in the wider dtype (compute_dtype), against the
    fp32 reference; o comes back as fla returns it: in v's dtype from the recurrent function, q's from the chunked."""
    fn, _ = KERNELS[kind]
    x = gdn.make_inputs(1, 67, 2, 32, HV=4, dtype=torch.float32, initial_state=True, seed=31)
    x["q"], x["k"], x["v"], x["beta"] = x["q"].to(qk), x["k"].to(qk), x["v"].to(v), x["beta"].to(v)
    assert gdn.compute_dtype(x["q"], x["v"]) == torch.promote_types(qk, v)
    o, ht = fn(**x, output_final_state=True)
    ref, ref_ht = gdn.naive_recurrent_gated_delta_rule(**x, output_final_state=True)
    assert o.dtype == (v if kind == "recurrent" else qk) and ht.dtype == torch.float32
    bound = 2e-2 if torch.float32 not in (qk, v) or qk == torch.float16 else 5e-3
    assert_rel_close(o, ref, bound, "o")
    assert_rel_close(ht, ref_ht, bound, "final state")


def test_cu_seqlens_cpu_is_checked():
    x = gdn.make_inputs(1, 8, 1, 16, seed=20)
    cu = torch.tensor([0, 3, 8], device=DEVICE)
    o1, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu())
    o2, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu)
    assert torch.equal(o1, o2)
    for fn in KERNELS.values():
        with pytest.raises(ValueError, match="cu_seqlens_cpu must hold the same 3 offsets"):
            fn[0](**x, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 8]))
        with pytest.raises(ValueError, match="give cu_seqlens too"):
            fn[0](**x, cu_seqlens_cpu=torch.tensor([0, 8]))
        with pytest.raises(ValueError, match="cu_seqlens_cpu is on"):
            fn[0](**x, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor([0, 3, 8], device="meta"))


# --------------------------------------------------------------------------------------------------
# Varlen without host syncs: what lets an engine hold these calls in a CUDA graph
# --------------------------------------------------------------------------------------------------

_HOST_READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__")


@contextlib.contextmanager
def no_host_reads(allow=()):
    """Any read of a tensor's values on the host inside the block fails (``.tolist()``, ``.item()``,
    ``.cpu()``, ``.numpy()``, ``bool``/``int``/``float`` of a tensor, ``.to("cpu")``, ``torch.equal``,
    ``torch.allclose``): on a GPU each is a device-to-host copy that waits for the device, which a
    CUDA graph cannot hold. Tensors in ``allow`` (host copies the caller gave) may be read. Triton's
    interpreter reads kernel arguments on the host to run a launch on the CPU; that stands for the
    launch itself and is let through."""
    import triton.runtime.interpreter as interp

    state = {"launch": 0}
    allowed = {id(t) for t in allow}

    def offend(what, t=None):
        if state["launch"] == 0 and (t is None or id(t) not in allowed):
            raise AssertionError(f"host read during the call: {what} (a device-to-host sync on a GPU)")

    def guard(name, real):
        def f(self, *a, **k):
            offend(f"Tensor.{name}()", self)
            return real(self, *a, **k)
        return f

    def to(self, *a, **k):
        if any(str(d).startswith("cpu") for d in (*a, k.get("device")) if isinstance(d, (str, torch.device))):
            offend("Tensor.to('cpu')", self)
        return real_to(self, *a, **k)

    def fn_guard(name, real):
        def f(*a, **k):
            offend(f"torch.{name}()")
            return real(*a, **k)
        return f

    def launch(self, *a, **k):
        state["launch"] += 1
        try:
            return real_call(self, *a, **k)
        finally:
            state["launch"] -= 1

    saved = {n: getattr(torch.Tensor, n) for n in _HOST_READS}
    real_to, real_call = torch.Tensor.to, interp.GridExecutor.__call__
    saved_fns = {n: getattr(torch, n) for n in ("equal", "allclose")}
    try:
        for n, real in saved.items():
            setattr(torch.Tensor, n, guard(n, real))
        torch.Tensor.to = to
        for n, real in saved_fns.items():
            setattr(torch, n, fn_guard(n, real))
        interp.GridExecutor.__call__ = launch
        yield
    finally:
        for n, real in saved.items():
            setattr(torch.Tensor, n, real)
        torch.Tensor.to = real_to
        for n, real in saved_fns.items():
            setattr(torch, n, real)
        interp.GridExecutor.__call__ = real_call


@pytest.mark.parametrize("kind", list(KERNELS))
def test_varlen_call_never_reads_device_values_on_the_host(kind):
    fn, bound = KERNELS[kind]
    cu = torch.tensor([0, 5, 40, 40, 48], device=DEVICE, dtype=torch.int32)   # an empty sequence too
    cu_cpu = cu.cpu()
    x = gdn.make_inputs(1, 48, 1, 32, gate="mixed", seed=24)
    x["initial_state"] = torch.randn(4, 1, 32, 32, device=DEVICE) * 0.5
    ro, rh = _ref(x, cu_seqlens=cu)
    with no_host_reads(allow=[cu_cpu]):
        o, ht = fn(**x, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
    assert_rel_close(o, ro, bound, f"{kind} varlen o, no host reads")
    assert_rel_close(ht, rh, bound, f"{kind} varlen final state, no host reads")
    # the guard can fail: the reference loops over the sequences on the host
    with pytest.raises(AssertionError, match=r"host read during the call: Tensor.tolist"):
        with no_host_reads():
            _ref(x, cu_seqlens=cu)
    with pytest.raises(AssertionError, match="host read"):    # ... and a host copy not allowed
        with no_host_reads():
            fn(**x, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)


@pytest.mark.skipif(ON_GPU, reason="checks the interpreter's addresses (on a GPU: compute-sanitizer)")
@pytest.mark.parametrize("kind", list(KERNELS))
def test_unchecked_bad_offsets_stay_inside_the_buffers(kind, monkeypatch):
    # Without a host copy the offsets are trusted (checking them would read the device tensor). A
    # malformed table then gives wrong rows, but every address stays inside the buffers: the kernels
    # clamp each sequence to [0, T] and the state pass to the NT_MAX rows of h.
    fn, _ = KERNELS[kind]
    x = gdn.make_inputs(1, 8, 1, 16, seed=25)
    # on the host the offsets are checked (test_host_offsets_are_checked_on_the_host); the GPU's
    # contract is to trust a device tensor without a host copy: emulate that here
    monkeypatch.setattr(gdn, "_host_offsets", lambda cu, cu_cpu: cu_cpu)
    with bounds_checked():
        for cu in ([0, 3, 70, 100], [5, 0, 8], [-40, 2, 8]):      # past T, decreasing, negative
            fn(**x, output_final_state=True, cu_seqlens=torch.tensor(cu, device=DEVICE))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_varlen_decode_and_prefill_replay_from_a_cuda_graph():
    # An engine captures the step once and replays it with new inputs and new offsets copied into the
    # same device tensors; the replay must give what an eager call on those inputs gives.
    def run_case(fn, T, N, HV, make_cu, **kw):
        x = gdn.make_inputs(1, T, 2, 64, HV=HV, dtype=torch.bfloat16, gate="mixed", seed=T)
        x["initial_state"] = torch.randn(N, HV, 64, 64, device=DEVICE) * 0.3
        cu = make_cu(0).to(DEVICE)
        torch.cuda.set_sync_debug_mode("error")    # any synchronising call raises
        try:
            fn(**x, cu_seqlens=cu, output_final_state=True, **kw)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(**x, cu_seqlens=cu, output_final_state=True, **kw)      # warm-up off the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, ht = fn(**x, cu_seqlens=cu, output_final_state=True, **kw)
        new = gdn.make_inputs(1, T, 2, 64, HV=HV, dtype=torch.bfloat16, gate="mixed", seed=T + 1)
        for name, t in new.items():
            x[name].copy_(t)
        x["initial_state"].copy_(torch.randn(N, HV, 64, 64, device=DEVICE) * 0.3)
        cu.copy_(make_cu(1).to(DEVICE))
        graph.replay()
        ro, rh = fn(**x, cu_seqlens=cu.clone(), output_final_state=True, **kw)
        assert_rel_close(o, ro, 1e-6, f"{fn.__name__} replayed o")
        assert_rel_close(ht, rh, 1e-6, f"{fn.__name__} replayed final state")
        eo, eh = _ref({n: t.float() for n, t in x.items()}, cu_seqlens=cu)
        assert_rel_close(o, eo, 3e-2, f"{fn.__name__} replayed o vs the fp32 recurrence")

    N = 6   # decode: one token per sequence, then a step where two sequences are idle (no token)
    run_case(gdn.fused_recurrent_gated_delta_rule, N, N, 4,
             lambda i: torch.arange(N + 1) if i == 0 else torch.tensor([0, 1, 1, 2, 4, 4, 6]))
    # prefill: 3 sequences over 300 tokens, replayed with other lengths (same T, same N)
    run_case(gdn.chunk_gated_delta_rule, 300, 3, 4,
             lambda i: torch.tensor([0, 70, 200, 300] if i == 0 else [0, 1, 129, 300]))


# --------------------------------------------------------------------------------------------------
# Graders of notebook 05: each passes its solution, reports the stub as not attempted, and fails
# plausible wrong answers with the message that teaches the mistake
# --------------------------------------------------------------------------------------------------

def _stub(*args):
    raise NotImplementedError


def _fails(check, fn, match):
    with pytest.raises(AssertionError, match=match):
        check(fn)


@pytest.mark.parametrize("check,solution", [
    (graders.check_decode_step, graders.solution_decode_step),
    (graders.check_ut_transform, graders.solution_ut_transform),
    (graders.check_chunk_spans, graders.solution_chunk_spans),
    (graders.check_state_pass, graders.solution_state_pass),
    (graders.check_compose_segments, graders.solution_compose_segments),
])
def test_grader_passes_solution_and_stub_is_not_attempted(check, solution):
    check(solution)
    with pytest.raises(NotImplementedError):
        check(_stub)
    from workbook.check import grade
    assert grade("solution", lambda: check(solution))
    assert not grade("stub", lambda: check(_stub))


def _decode(heads="group", order="decay_first", scale=True, read_old=False, inplace=True, out_k=False):
    def fn(h, q, k, v, g, beta):
        o, hn = graders._decode_step_torch(h, q, k, v, g, beta, heads=heads, order=order, scale=scale)
        if read_old:
            H, HV, K = q.shape[1], v.shape[1], q.shape[2]
            kh = torch.arange(HV) // (HV // H)
            o = torch.einsum("nhkv,nhk->nhv", h * g.exp()[:, :, None, None], q[:, kh] * K ** -0.5)
        if inplace:
            h.copy_(hn)
        if out_k:   # the output in key space: the K/V mix-up
            return torch.einsum("nhkv,nhv->nhk", hn, v)
        return o
    return fn


def _skips_heads(h, q, k, v, g, beta):       # writes only the first H value heads of o
    o_ref = _decode()(h, q, k, v, g, beta)
    o = torch.empty_like(o_ref)
    o[:, :q.shape[1]] = o_ref[:, :q.shape[1]]
    return o


def _g_not_exponentiated(h, q, k, v, g, beta):  # h * g: the log decay used as a factor
    o, hn = graders._decode_step_torch(h, q, k, v, torch.log(g.abs() + 1e-30), beta)
    h.copy_(hn)
    return o


def _decode_kernel_into_small_o(h, q, k, v, g, beta):
    import triton

    from workbook.kernels import gdn as kern

    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    o = torch.empty(N, HV, V // 2, dtype=torch.float32, device=h.device)
    kern.decode_step_solution_kernel[(N * HV,)](h, q, k, v, g, beta, o, K ** -0.5, H=H, HV=HV, K=K, V=V,
                                               BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V))
    return o


DECODE_WRONG = {
    "output in key space": (_decode(out_k=True), "VALUE space"),
    "value head hv % H": (_decode(heads="mod"), r"hv // \(HV // H\)"),
    "decay after the write": (_decode(order="decay_after"), "decay FIRST"),
    "a new state, not in place": (_decode(inplace=False), "not updated in place"),
    "o from the old state": (_decode(read_old=True), "BEFORE this token's write"),
    "no 1/sqrt(K)": (_decode(scale=False), "sqrt"),
    # h @ k contracts h's V axis with k: a shape error when K != V, reported, not raised
    "h @ k": (lambda h, q, k, v, g, beta: h @ k[:, :, :, None], "your decode step raised RuntimeError"),
    "only H value heads written": (_skips_heads, "still holds poison"),
    "g used without exp": (_g_not_exponentiated, r"the state is off by .*h <- exp\(g\) h"),
    # the solution's Triton kernel launched on an o of half the values: it stores past the end
    "o allocated too small (a Triton kernel)": (_decode_kernel_into_small_o,
                                                r"your kernel stored past the end of `o` \(allocated \[3, 4, 8\]"),
}


@pytest.mark.parametrize("which", list(DECODE_WRONG))
def test_decode_grader_fails_wrong_answers_with_the_intended_message(which):
    fn, match = DECODE_WRONG[which]
    _fails(graders.check_decode_step, fn, match)


def _ut(beta_side="row", strict=True, how="mask_first", inverse=True):
    def fn(k, beta, G):
        C = k.shape[0]
        low = torch.ones(C, C, dtype=torch.bool).tril(-1 if strict else 0)
        if how == "mask_first":
            gam = torch.where(low, G[:, None] - G[None, :], torch.zeros(())).exp()
        elif how == "exp_then_tril":
            gam = (G[:, None] - G[None, :]).exp().tril(-1 if strict else 0)
        else:  # exp times a float mask: inf * 0
            gam = (G[:, None] - G[None, :]).exp() * low
        b = beta[:, None] if beta_side == "row" else beta[None, :]
        L = torch.where(low, b * (k @ k.T) * gam, torch.zeros(()))
        eye = torch.eye(C)
        return torch.linalg.solve_triangular(eye + L, eye, upper=False) if inverse else eye - L
    return fn


def _ut_variant(change):
    """The solution's steps with one of them changed: 'reversed' exponent G_j - G_i, 'no_gamma',
    'inv_minus' (I - L)^-1."""
    def fn(k, beta, G):
        C = k.shape[0]
        low = torch.ones(C, C, dtype=torch.bool).tril(-1)
        diff = G[None, :] - G[:, None] if change == "reversed" else G[:, None] - G[None, :]
        gam = torch.where(low, diff, torch.zeros(())).exp() if change != "no_gamma" else torch.ones(C, C)
        L = torch.where(low, beta[:, None] * (k @ k.T) * gam, torch.zeros(()))
        eye = torch.eye(C)
        return torch.linalg.inv(eye - L) if change == "inv_minus" else torch.linalg.inv(eye + L)
    return fn


UT_WRONG = {
    "exp, then tril": (_ut(how="exp_then_tril"), "exponentiated a positive number"),
    "exp times a mask": (_ut(how="exp_times_mask"), "exponentiated a positive number"),
    "beta on the columns": (_ut(beta_side="col"), "wrong side"),
    "L with its diagonal": (_ut(strict=False), "STRICTLY lower"),
    "I - L, no inverse": (_ut(inverse=False), "I - L, the first terms"),
    "the exponent's sign reversed": (_ut_variant("reversed"), "its sign is reversed"),
    "(I - L)^-1": (_ut_variant("inv_minus"), r"you inverted I - L"),
    "no decay": (_ut_variant("no_gamma"), r"A \(I \+ L\) - I has entries up to"),
}


def test_ut_grader_passes_a_torch_solution():
    graders.check_ut_transform(_ut())


@pytest.mark.parametrize("which", list(UT_WRONG))
def test_ut_grader_fails_wrong_answers_with_the_intended_message(which):
    fn, match = UT_WRONG[which]
    _fails(graders.check_ut_transform, fn, match)


SPANS_WRONG = {
    # ignores the sequence boundaries
    "one grid over the batch": (lambda cu, C: [(s, min(s + C, cu[-1])) for s in range(0, cu[-1], C)],
                                "never spans two sequences"),
    # drops each sequence's partial tail
    "floor of L / chunk": (lambda cu, C: [(a + i * C, a + (i + 1) * C) for a, b in zip(cu, cu[1:])
                                          for i in range((b - a) // C)], r"ceil\(L / chunk\)"),
    # the last chunk keeps its full length
    "last chunk not cut": (lambda cu, C: [(s, s + C) for a, b in zip(cu, cu[1:]) for s in range(a, b, C)],
                           "runs past the end of its sequence"),
    "a chunk for an empty sequence": (lambda cu, C: [(s, min(s + C, b)) for a, b in zip(cu, cu[1:])
                                                     for s in (range(a, b, C) if b > a else [a])],
                                      "zero-length sequence has no chunks"),
    "off by one: range(bos, eos - 1, chunk)": (lambda cu, C: [(s, min(s + C, b)) for a, b in zip(cu, cu[1:])
                                                              for s in range(a, b - 1, C)],
                                               r"cu_seqlens = \[0, 1\], chunk = 64: rows 0..0 \(1 rows\) belong to no chunk"),
    "reversed": (lambda cu, C: list(reversed(graders.solution_chunk_spans(cu, C))), "not in order"),
}


@pytest.mark.parametrize("which", list(SPANS_WRONG))
def test_chunk_spans_grader_fails_wrong_answers_with_the_intended_message(which):
    fn, match = SPANS_WRONG[which]
    _fails(graders.check_chunk_spans, fn, match)


def _state_pass_variant(name):
    return lambda k, w, u, G, h0, cu, C: graders._state_pass_torch(k, w, u, G, h0, cu, C, variant=name)


def _state_pass_written(k, w, u, G, h0, cu, C, *, floor=False, decay_state=True, h0_of=lambda n: n):
    """The solution's loop with one change: ``floor`` (the partial last chunk never processed),
    ``decay_state`` False (h not multiplied by exp(G_C)), ``h0_of`` (which initial state a sequence uses)."""
    v_new, finals = torch.empty_like(u), []
    for n in range(len(cu) - 1):
        h = h0[h0_of(n)].clone()
        for s in range(cu[n], cu[n + 1] - (C - 1 if floor else 0), C):
            e = min(s + C, cu[n + 1])
            v_new[s:e] = u[s:e] - w[s:e] @ h
            h = h * (G[e - 1].exp() if decay_state else 1) + (k[s:e] * (G[e - 1] - G[s:e]).exp()[:, None]).T @ v_new[s:e]
        finals.append(h)
    return v_new, torch.stack(finals)


STATE_PASS_WRONG = {
    "state carried across sequences": (_state_pass_variant("carry"), "leaked from one sequence"),
    "chunk end past the sequence end": (_state_pass_variant("batch_end"), "SEQUENCE end"),
    "G_C at the chunk's first row": (_state_pass_variant("first"), "LAST row"),
    "no per-row decay weights": (_state_pass_variant("no_weights"), r"exp\(G_C - G\)"),
    "partial last chunk skipped": (lambda *a: _state_pass_written(*a, floor=True), "never written"),
    "state not decayed": (lambda *a: _state_pass_written(*a, decay_state=False),
                          r"rows 16..31 \(sequence 0, not its first chunk.*h <- exp\(G_C\) h"),
    "h0[0] for every sequence": (lambda *a: _state_pass_written(*a, h0_of=lambda n: 0),
                                 r"rows 5..20 \(sequence 1, its first chunk: the state there is h0\[n\]"),
}


@pytest.mark.parametrize("which", list(STATE_PASS_WRONG))
def test_state_pass_grader_fails_wrong_answers_with_the_intended_message(which):
    fn, match = STATE_PASS_WRONG[which]
    _fails(graders.check_state_pass, fn, match)


def test_benchmark_table_reads_the_record_and_new_rows():
    rec = load_record("gdn")
    text = bench.table(rec)
    if not bench.has_timing_methods(rec):
        assert "not recorded yet" in text and plots.plot_benchmark(rec) is None
    else:   # the record's per-kernel times (profiler) are printed under their rows
        assert "ours kernels, GPU time per call in us (torch.profiler): chunk_gdn_solve_kernel" in text, text
        assert set(rec["timers"]) == {"graph", "eager", "profiler"} and "state_rule" in rec["results"]["notes"]
    row = {"B": 1, "T": 64, "H": 1, "D": 16, "l2norm_in_kernel": False, "ours_graph_us": 10.0, "ours_eager_us": 30.0,
           "fla_graph_us": 8.0, "fla_eager_us": 60.0, "ratio_ours_over_fla_graph": 1.25, "ratio_ours_over_fla_eager": 0.5}
    drow = {"B": 2, "T": 1, "H": 1, "D": 16, "ours_graph_us": 5.0, "ours_eager_us": 20.0, "ours_graph_GBps": 100.0}
    rule, prev = {"BV": 16, "num_warps": 4, "num_stages": 3}, {"BV": 32, "num_warps": 4, "num_stages": 2}
    srows = [{"B": 1, "T": 64, "H": 1, "HV": 2, "rule": rule, "rule_graph_us": 6.0, "previous": prev,
              "previous_graph_us": 8.0, "ratio_rule_over_previous": 0.75,
              "grid": [{**prev, "graph_us": 8.0}, {**rule, "graph_error": "RuntimeError: X"}]},
             {"B": 1, "T": 64, "H": 1, "HV": 2, "cu_seqlens": [0, 1, 64], "rule": rule, "rule_graph_us": 7.0,
              "previous": "same as the rule's pick"}]
    new = {"results": {"chunk": [row], "state_alone": srows, "decode": [drow]}, "ceilings": {"copy_GBps": 200.0}}
    text = bench.table(new)
    assert bench.table(Measurement(new["results"], {}, new["ceilings"])) == text   # a live run's result reads alike
    assert "ours/fla on GPU time 1.25x" in text and "eager 0.50x" in text and "50% of the 200 GB/s" in text
    assert "launch rule BV16 ns3 nw4      6.0 us | previous default BV32 ns2 nw4      8.0 us | rule/previous 0.75x" \
        in text, text
    assert "BV32 ns2 8.0 us, BV16 ns3 n/a" in text and "varlen N=2 T=64" in text and "the same configuration" in text
    import matplotlib
    matplotlib.use("Agg")
    assert plots.plot_benchmark(new) is not None
    # a capture that failed is recorded as <who>_graph_error: the row is shown, its GPU time as n/a
    failed = {**row, "ours_graph_error": "RuntimeError: capture"}
    del failed["ours_graph_us"], failed["ratio_ours_over_fla_graph"]
    text = bench.table({"results": {"chunk": [failed], "decode": [drow]}})
    assert "ours graph      n/a   , eager     30.0 us" in text, text


def test_config_is_checked():
    x = gdn.make_inputs(1, 8, 1, 16, seed=21)
    with pytest.raises(ValueError, match=r"unknown keys \['rec_bv'\]"):
        gdn.fused_recurrent_gated_delta_rule(**x, config={"rec_bv": 16})
    with pytest.raises(ValueError, match=r"\['state'\] has unknown keys \['bv'\]"):
        gdn.chunk_gated_delta_rule(**x, config={"state": {"bv": 16}})
    if not ON_GPU:
        with pytest.raises(ValueError, match="emulate=False needs a GPU: " + gdn.EMULATE_WHY):
            gdn.chunk_gated_delta_rule(**x, emulate=False)


def test_state_launch_rule():
    """The state pass's launch rule: the widest BV that still gives STATE_FILL programs per SM (never
    below 16), three pipeline stages only while the programs each SM must hold fit its shared memory."""
    fill = gdn.STATE_FILL
    picks = {}
    for n_sm in (132, 78):
        for N in (1, 2, 3, 4, 8):
            for HV in (1, 4, 8, 16, 32, 64):
                for K, V in ((128, 128), (64, 64), (100, 72), (256, 256), (16, 16)):
                    for size in (2, 4):
                        c = gdn.state_launch(N, HV, K, V, size, n_sm=n_sm, smem_per_sm=228 << 10)
                        bv, progs = c["BV"], N * HV * -(-V // c["BV"])
                        assert c["num_warps"] == 4 and bv in (16, 32, 64) and bv <= max(16, V)
                        if bv > 16:     # wide enough to fill the SMs ...
                            assert progs >= fill * n_sm, (N, HV, V, c)
                        if bv < min(64, max(16, V)):    # ... and no wider one would
                            assert N * HV * -(-V // (2 * bv)) < fill * n_sm, (N, HV, V, c)
                        per_sm = -(-progs // n_sm)
                        tiles = 64 * (2 * max(16, 1 << (K - 1).bit_length()) + bv) * size
                        assert c["num_stages"] == (3 if per_sm * (3 * tiles + (8 << 10)) <= 228 << 10 else 2)
                        picks[(n_sm, N, HV, K, V, size)] = c
    # the benchmark's shapes on an H200 (132 SMs): few heads -> narrow slices, three stages;
    # many -> BV 64 and two stages (two programs per SM stay resident)
    h200 = {(N, HV): (picks[(132, N, HV, 128, 128, 2)]["BV"], picks[(132, N, HV, 128, 128, 2)]["num_stages"])
            for N, HV in ((1, 16), (1, 32), (2, 32), (4, 32))}
    assert h200 == {(1, 16): (16, 3), (1, 32): (32, 3), (2, 32): (64, 3), (4, 32): (64, 2)}
    # varlen: the same BV, and three stages whenever one program's fit (the long sequences set the time)
    for N, HV in ((1, 16), (2, 32), (4, 32), (8, 32), (64, 64)):
        u, vl = gdn.state_launch(N, HV, 128, 128, 2, n_sm=132), gdn.state_launch(N, HV, 128, 128, 2, n_sm=132, varlen=True)
        assert vl["BV"] == u["BV"] and vl["num_stages"] == 3, (N, HV, u, vl)
    assert gdn.state_launch(4, 32, 256, 256, 4, n_sm=132, varlen=True)["num_stages"] == 2   # 3 x 192 KB tiles do not fit
    # the GPU's figures by default (without a GPU: an H200's, as the recorded runs)
    assert gdn.state_launch(1, 16, 128, 128, 2) == gdn.state_launch(
        1, 16, 128, 128, 2, n_sm=device.sm_count(), smem_per_sm=device.shared_memory_per_sm())
    # the rule fills only what config['state'] leaves None
    cs = {**gdn.CONFIG["chunk"]["state"], "BV": None, "num_warps": None, "num_stages": None}
    assert gdn._state_cfg({**cs, "num_stages": 2}, 1, 16, 128, 128, 2)["num_stages"] == 2
    assert gdn._state_cfg({**cs, "BV": 256}, 1, 16, 128, 64, 2)["BV"] == 64
    # the default is the rule's pick; RULE False keeps the previous default
    assert cs["RULE"] is True
    assert gdn._state_cfg(cs, 1, 16, 128, 128, 2) == gdn.state_launch(1, 16, 128, 128, 2)
    assert gdn._state_cfg({**cs, "RULE": False}, 1, 16, 128, 128, 2) == gdn._previous_state_cfg(1, 16, 128)
    assert gdn._state_cfg(cs, 1, 16, 128, 128, 2) != gdn._previous_state_cfg(1, 16, 128)
    assert gdn._state_cfg(cs, 4, 32, 128, 128, 2, True)["num_stages"] == 3
    assert gdn._state_cfg(cs, 4, 32, 128, 128, 2)["num_stages"] == 2


def test_state_pass_alone_rewrites_the_call_state_and_previous_default():
    """The benchmark's state pass alone (launched as the launcher launches it, here with a BV and
    num_stages other than the rule's) rewrites the call's final state over a poisoned buffer, on a
    varlen batch; the previous default it is compared with is the >= 256-programs BV at two stages."""
    x = gdn.make_inputs(1, 90, 1, 32, HV=2, gate="mixed", seed=25)
    x["initial_state"] = torch.randn(3, 2, 32, 32, device=DEVICE)
    args = dict(**x, output_final_state=True, cu_seqlens=torch.tensor([0, 1, 70, 90], device=DEVICE))
    run = bench.state_pass_alone(args, {"BV": 16, "num_stages": 2})
    ht = run.call_outputs[1]   # the whole call's, at the default configuration (BV 128 in the interpreter)
    assert run.config == {"BV": 16, "num_warps": 4, "num_stages": 2}
    for pattern in ("nan", "7f"):
        poison_(run.final_state, pattern)
        run()
        assert_rel_close(run.final_state, ht, 1e-6, f"final state, state pass alone, poison {pattern}")
    prev = gdn._previous_state_cfg
    assert [prev(1, 16, 128)["BV"], prev(2, 32, 128)["BV"], prev(4, 32, 128)["BV"], prev(1, 32, 16)["BV"]] == \
        [16, 32, 64, 16]
    assert prev(4, 32, 128)["num_stages"] == 2
    # the compile warm-up's call for the varlen batch keeps what the kernels specialise on (heads,
    # flags, the number of sequences, none empty), at WARM_T tokens
    spec = bench._SPECS[-1]
    w = bench._bench_args(spec, warm=True)
    cu = w["cu_seqlens"].tolist()
    assert w["q"].shape[-2:] == (spec[2], spec[4]) and w["initial_state"].shape[:2] == (len(spec[6]), spec[3])
    assert len(cu) == len(spec[6]) + 1 and cu[-1] == bench.WARM_T and min(b - a for a, b in zip(cu, cu[1:])) >= 1


# --------------------------------------------------------------------------------------------------
# GPU only: both paths of the emulation switch, and the two timers of the benchmark
# --------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not ON_GPU, reason="emulate=False runs tl.dot on 16-bit operands: needs a GPU")
@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_chunk_emulate_paths_agree_on_gpu(dtype, bound):
    x = gdn.make_inputs(1, 130, 2, 64, HV=4, dtype=dtype, gate="mixed", initial_state=True, seed=22)
    o1, h1 = gdn.chunk_gated_delta_rule(**x, output_final_state=True, emulate=True)
    o2, h2 = gdn.chunk_gated_delta_rule(**x, output_final_state=True, emulate=False)
    assert_rel_close(o2, o1, bound, "o, emulate=False vs True")
    assert_rel_close(h2, h1, bound, "final state, emulate=False vs True")


@pytest.mark.skipif(not ON_GPU, reason="the launch rule's configurations (num_stages 3) compile on the GPU only")
@pytest.mark.parametrize("B,T,H,HV,dtype", [(1, 130, 2, 16, torch.bfloat16), (1, 130, 2, 16, torch.float32),
                                            (2, 70, 4, 32, torch.bfloat16), (4, 65, 8, 32, torch.float32)])
def test_chunk_state_launch_rule_on_gpu(B, T, H, HV, dtype):
    """Every configuration the rule picks at these head counts (BV 16/32/64, two or three stages) runs,
    agrees with a fixed configuration and with the fp32 recurrence, and writes every row of o."""
    x = gdn.make_inputs(B, T, H, 128, HV=HV, dtype=dtype, gate="mixed", initial_state=True, seed=24)
    o, h = gdn.chunk_gated_delta_rule(**x, output_final_state=True, config={"state": {"RULE": True}})
    fixed = {"state": {"BV": 32, "num_warps": 4, "num_stages": 2}}   # differs from every pick here
    o2, h2 = gdn.chunk_gated_delta_rule(**x, output_final_state=True, config=fixed)
    bound = 1e-5 if dtype == torch.float32 else 1e-2
    assert_rel_close(o, o2, bound, "o, rule vs BV32 ns2")
    assert_rel_close(h, h2, bound, "final state, rule vs BV32 ns2")
    ro, rh = _ref(x)
    tol = CHUNK_BOUND if dtype == torch.float32 else 3e-2   # the bf16 bound of test_bf16_inputs
    assert_rel_close(o, ro, tol, "o vs fp32 recurrence")
    assert_rel_close(h, rh, tol, "final state vs fp32 recurrence")


@pytest.mark.skipif(not ON_GPU, reason="CUDA-graph timing needs a GPU")
def test_time_both_times_graph_replay_and_eager():
    x = gdn.make_inputs(1, 256, 2, 64, dtype=torch.bfloat16, gate="mixed", initial_state=True, seed=23)
    for fn in (gdn.chunk_gated_delta_rule, gdn.fused_recurrent_gated_delta_rule):
        t = timing.time_both(lambda: fn(**x, output_final_state=True))
        assert "graph_error" not in t and isinstance(t["graph_us"], float) and t["graph_us"] > 0, t   # capturable
        assert t["eager_us"] > 0


@pytest.mark.skipif(not ON_GPU, reason="the benchmark measures a GPU")
def test_benchmark_smoke_run_fits_the_record_schema():
    """What notebook 05 times live: one chunk shape and the decode call, both timers, a valid record."""
    from workbook.records import validate_record

    m = bench.run(smoke=True)
    assert len(m.results["chunk"]) == 1 and len(m.results["decode"]) == 1 and set(m.timers) == {"graph", "eager"}
    validate_record({"schema": 2, "name": "gdn", "recorded": "2026-01-01", "machine": device.describe(),
                     "timers": m.timers, "ceilings": m.ceilings, "results": m.results})
    assert "ours graph" in bench.table(m)


# --------------------------------------------------------------------------------------------------
# Segments (issue #33): the chunked form parallel over the sequence, against the recurrence and the
# plain chunked path; its buffers fully written under poison; no segment without a token
# --------------------------------------------------------------------------------------------------

SEG_BOUND = 1e-5   # fp32: segmented vs plain chunked path (the same chunk products, regrouped)


@pytest.mark.parametrize("T", [1, 63, 65, 130, 200])
def test_segments_match_recurrence_and_plain_path(T):
    # K != V, two value heads per key head, an initial state; segments of 1, 2 and more chunks than T holds
    x = gdn.make_inputs(1, T, 1, 32, V=16, HV=2, gate="mixed", initial_state=True, seed=40 + T)
    ro, rh = _ref(x)
    po, ph = gdn.chunk_gated_delta_rule(**x, output_final_state=True)
    for seg in (1, 2, 8):
        o, ht = gdn.chunk_gated_delta_rule(**x, output_final_state=True, segments=seg)
        assert o.dtype == x["v"].dtype and ht.dtype == torch.float32 and o.shape == po.shape
        assert_rel_close(o, ro, CHUNK_BOUND, f"segments={seg} o vs recurrence (T={T})")
        assert_rel_close(ht, rh, CHUNK_BOUND, f"segments={seg} final state vs recurrence (T={T})")
        assert_rel_close(o, po, SEG_BOUND, f"segments={seg} o vs plain chunked (T={T})")
        assert_rel_close(ht, ph, SEG_BOUND, f"segments={seg} final state vs plain chunked (T={T})")


def test_segments_batch_without_cu_seqlens_and_no_initial_state():
    x = gdn.make_inputs(2, 130, 2, 32, HV=4, gate="strong", seed=41)   # B = 2: sequences laid end to end inside
    ro, rh = _ref(x)
    o, ht = gdn.chunk_gated_delta_rule(**x, output_final_state=True, segments=1)
    assert_rel_close(o, ro, CHUNK_BOUND, "B=2 segmented o")
    assert_rel_close(ht, rh, CHUNK_BOUND, "B=2 segmented final state")
    o2, none = gdn.chunk_gated_delta_rule(**x, segments=2)
    assert none is None
    assert_rel_close(o2, ro, CHUNK_BOUND, "B=2 segmented o, no final state asked")


@pytest.mark.parametrize("seg", [1, 2, 4])
def test_segments_varlen_with_empty_and_one_token_sequences(seg):
    cu = torch.tensor([0, 0, 1, 130, 130, 195, 200], device=DEVICE)   # empty, one token, 2+ chunks, empty, ...
    x = gdn.make_inputs(1, 200, 1, 32, V=48, HV=2, gate="mixed", seed=42)
    x["initial_state"] = torch.randn(6, 2, 32, 48, device=DEVICE) * 0.5
    ro, rh = _ref(x, cu_seqlens=cu)
    o, ht = gdn.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens=cu, segments=seg)
    assert_rel_close(o, ro, CHUNK_BOUND, f"varlen segments={seg} o")
    assert_rel_close(ht, rh, CHUNK_BOUND, f"varlen segments={seg} final state")
    for n in (0, 3):
        assert torch.equal(ht[n], x["initial_state"][n]), "an empty sequence hands back its initial state"
    po, ph = gdn.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens=cu)
    assert_rel_close(o, po, SEG_BOUND, f"varlen segments={seg} o vs plain")
    assert_rel_close(ht, ph, SEG_BOUND, f"varlen segments={seg} final state vs plain")


@pytest.mark.parametrize("dtype,bound", [(torch.float32, CHUNK_BOUND), (torch.bfloat16, 3e-2)])
def test_segments_dtypes_l2norm_and_inplace(dtype, bound):
    # K != V, HV = 2 H, q and k normalised in the kernel, a scale; the state updated in place
    x = gdn.make_inputs(1, 130, 2, 32, V=16, HV=4, dtype=dtype, gate="mixed", normalize_qk=False, seed=43)
    x["initial_state"] = torch.randn(1, 4, 32, 16, device=DEVICE) * 0.5
    kw = dict(use_qk_l2norm_in_kernel=True, scale=0.3)
    ro, rh = _ref(x, **kw)
    h = x.pop("initial_state").clone()
    o, ht = gdn.chunk_gated_delta_rule(**x, initial_state=h, inplace_final_state=True, segments=1, **kw)
    assert ht is h and o.dtype == dtype
    assert_rel_close(o, ro, bound, f"{dtype} segmented o, l2norm in kernel")
    assert_rel_close(h, rh, bound, f"{dtype} segmented state in place")
    if dtype == torch.float32:
        x["initial_state"] = torch.randn(1, 4, 32, 16, device=DEVICE) * 0.5
        po, ph = gdn.chunk_gated_delta_rule(**x, output_final_state=True, **kw)
        so, sh = gdn.chunk_gated_delta_rule(**x, output_final_state=True, segments=1, **kw)
        assert_rel_close(so, po, SEG_BOUND, "segmented vs plain, l2norm in kernel")
        assert_rel_close(sh, ph, SEG_BOUND, "segmented vs plain final state, l2norm in kernel")


def test_segment_pass_ends_each_segment_in_B_and_M():
    # the [B | M] pass by itself: one sequence of 130 tokens, segments of one chunk: segment j's final
    # state is [B_j | M_j], the recurrence over its tokens from [0 | I_K] with values [v, 0_K]
    x = gdn.make_inputs(1, 130, 1, 16, V=8, HV=2, gate="mixed", seed=44)
    _, _, inter = gdn.chunk_gated_delta_rule(**x, segments=1, return_intermediates=True)
    K, V = 16, 8
    assert inter["cu_seg"].tolist()[:4] == [0, 64, 128, 130] and inter["seg_offsets"].tolist() == [0, 3]
    eye = torch.cat([torch.zeros(K, V), torch.eye(K)], dim=1).to(DEVICE)
    for j, (s, e) in enumerate(((0, 64), (64, 128), (128, 130))):
        seg = {n: t[:, s:e].contiguous() for n, t in x.items()}
        seg["v"] = torch.nn.functional.pad(seg["v"], (0, K))
        _, bm = _ref({**seg, "initial_state": eye.expand(1, 2, K, V + K).contiguous()})
        assert_rel_close(inter["bm"][j], bm[0], 1e-5, f"[B | M] of segment {j}")
        # ... and the affine map it holds is the segment's: S_end = M S_start + B for any start
        S = torch.randn(2, K, V, device=DEVICE)
        _, end = _ref({**{n: t[:, s:e].contiguous() for n, t in x.items()}, "initial_state": S[None]})
        assert_rel_close(bm[0][..., V:] @ S + bm[0][..., :V], end[0], 1e-5, f"M S + B of segment {j}")


# (sequence lengths, chunks per segment): empty sequences, one-token sequences, T not a multiple of 64,
# segments of one chunk, a segment longer than every sequence
SEG_TABLES = [([1], 1), ([0, 1, 0], 1), ([63, 64, 65], 1), ([0, 5, 0, 130], 2), ([200], 1), ([200], 8),
              ([130, 1, 70], 2), ([0, 0, 0, 3], 3)]


@pytest.mark.parametrize("lens,seg", SEG_TABLES)
def test_segment_table_gives_no_segment_without_a_token(lens, seg):
    # The table kernel's segments, against a plain Python count: the real segments tile [0, T) in order,
    # each holds at least one token (offsets strictly increase over them: no segment writes nothing),
    # never crosses a sequence end; the rows past the true count are empty (offset T), within the bound.
    N, T, S = len(lens), sum(lens), seg * gdn.CHUNK
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(N)], device=DEVICE)
    assert_fully_written(lambda: gdn._chunk_table(cu, N, T, span=S, starts=True)[:2] + (
        gdn._chunk_table(cu, N, T, span=S, starts=True)[3],), names=["seg_indices", "seg_offsets", "cu_seg"])
    _, off, ns_max, starts = gdn._chunk_table(cu, N, T, span=S, starts=True)
    bounds = cu.tolist()
    segs = [(s, min(s + S, e)) for b, e in zip(bounds, bounds[1:]) for s in range(b, e, S)]
    n_true = len(segs)
    assert ns_max == gdn.chunk_count_bound(T, N, S) >= n_true and starts.numel() == ns_max + 1
    st = starts.tolist()
    assert st[:n_true] == [s for s, _ in segs] and all(t == T for t in st[n_true:])
    assert all(b > a for a, b in zip(st[:n_true + 1], st[1:n_true + 1])), "a real segment without a token"
    assert all(any(b <= s and e <= c for b, c in zip(bounds, bounds[1:])) for s, e in segs)
    assert off.tolist() == [0] + [sum(-(-L // S) for L in lens[:i + 1]) for i in range(N)]


@pytest.mark.parametrize("lens,seg", [([0, 1, 0], 1), ([63, 0, 65], 1), ([130, 1, 70], 2), ([5], 4)])
def test_segment_buffers_fully_written_under_poison(lens, seg):
    # every new buffer of the segmented call (the table, [B | M], the segment start states) and its
    # outputs: whole storages written under two poisons, padding rows past the true count included
    N, T = len(lens), sum(lens)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(N)], device=DEVICE)
    x = gdn.make_inputs(1, T, 1, 32, V=24, HV=2, gate="mixed", seed=45)
    x["initial_state"] = torch.randn(N, 2, 32, 24, device=DEVICE) * 0.5
    names = ["seg_indices", "seg_offsets", "cu_seg", "bm", "s0"]

    def run():
        o, ht, inter = gdn.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens=cu, segments=seg,
                                                  return_intermediates=True, config={"scan": {"BV": 16}})
        return (o, ht, *(inter[n] for n in names))

    covs = assert_fully_written(run, names=["o", "final_state", *names])
    assert all(c.storage_fully_written for c in covs)


def test_segments_argument_is_checked_and_auto_follows_the_record():
    x = gdn.make_inputs(1, 8, 1, 16, seed=46)
    for bad in (0, -1, True, 1.5, "fast"):
        with pytest.raises(ValueError, match="segments must be None, 'auto' or a positive int"):
            gdn.chunk_gated_delta_rule(**x, segments=bad)
    xl = gdn.make_inputs(1, 8, 1, 256, V=512, seed=46)
    with pytest.raises(ValueError, match=r"segments needs V \+ K <= 512"):
        gdn.chunk_gated_delta_rule(**xl, segments=1)
    # the rule follows the H200 record: plain wherever no segment length beat the plain path there, and
    # where one did, a length that did
    rec = load_record("gdn_segments")["results"]
    measured = [r for r in rec["segments"] if "not_measured" not in r]
    assert len(measured) >= 4 and {(r["B"], r["T"], r["H"], r["HV"]) for r in rec["segments"]} == set(bench.SEGMENT_SHAPES)
    for row in measured:
        ratios = {s: row[f"ratio_seg{s}_over_plain_graph"] for s in rec["sweep_chunks_per_segment"]}
        pick = gdn.segment_rule(row["B"], row["T"], row["H"], row["HV"], row["K"], row["V"])
        if min(ratios.values()) > 1:
            assert pick is None, row
        else:
            assert pick in ratios and ratios[pick] < 1, (row, pick)
    assert any(gdn.segment_rule(r["B"], r["T"], r["H"], r["HV"], r["K"], r["V"]) for r in measured)


def test_fused_defaults_follow_the_recorded_fusion_table():
    # CONFIG's FUSE_WU / FUSE_O defaults against the H200 fusion table: w, u in kernel 1 is on (it was never
    # slower than the split form by more than run-to-run noise, 1%, and faster at most shapes); outputs in the
    # state pass follow fuse_o_rule, which must pick the faster of fuse_wu and fuse_wu_o (within 2%) at every
    # recorded shape, and the table must hold shapes where each choice wins by more than 5% (a rule, not a constant)
    rows = load_record("gdn_segments")["results"]["fusion"]["rows"]
    assert {(r["B"], r["T"], r["H"], r["HV"]) for r in rows} == set(bench.FUSION_SHAPES)
    chunk = gdn.CONFIG["chunk"]
    assert chunk["solve"]["FUSE_WU"] is True and chunk["state"]["FUSE_O"] is None
    pairs = [(r["fuse_wu_graph_us"], r["split_graph_us"]) for r in rows]
    assert all(wu <= 1.01 * split for wu, split in pairs) and sum(wu < split for wu, split in pairs) > len(pairs) / 2
    for r in rows:
        wu, wu_o = r["fuse_wu_graph_us"], r["fuse_wu_o_graph_us"]
        picked = wu_o if gdn.fuse_o_rule(r["B"], r["HV"], r["K"], r["V"], 2, n_sm=132) else wu
        assert picked <= 1.02 * min(wu, wu_o), r
    assert any(r["fuse_wu_o_graph_us"] > 1.05 * r["fuse_wu_graph_us"] for r in rows)
    assert any(r["fuse_wu_graph_us"] > 1.03 * r["fuse_wu_o_graph_us"] for r in rows)
    # the three stages of the folded state pass: at the BV the rule picks, faster than two at every swept shape
    sweep = load_record("gdn_segments")["results"]["fuse_o_launch_sweep"]["rows"]
    for r in sweep:
        c = gdn._state_cfg({**chunk["state"]}, r["B"], r["HV"], r["K"], r["V"], 2, fused=True)
        assert c["num_stages"] == 3 and c["num_warps"] == 4, c
        bv = gdn.state_launch(r["B"], r["HV"], r["K"], r["V"], n_sm=132)["BV"]     # the H200's pick
        assert r[f"bv{bv}_w4_s3_graph_us"] < r[f"bv{bv}_w4_s2_graph_us"], (r["B"], r["T"], r["H"], r["HV"], bv)


def test_blocks_solve_outcome_states_what_its_run_measured():
    """The block-wise solve's outcome line (notebook 05 prints it) quotes its own rows: the range of the whole call
    against the merged form, and the two solve kernels' profiler times at the profiled shape."""
    bs = load_record("gdn_segments")["results"]["from_a"]["blocks_solve"]
    ratios = [r["from_a_o_blocks_graph_us"] / r["from_a_o_graph_us"] for r in bs["rows"]]
    assert min(ratios) > 1 and f"{min(ratios):.2f}x to {max(ratios):.2f}x" in bs["outcome"]
    prof = next(r for r in bs["rows"] if "from_a_o_blocks_kernels_profiler_us" in r)
    blocks = prof["from_a_o_blocks_kernels_profiler_us"]["chunk_gdn_solve_blocks_kernel"]
    merged = prof["from_a_o_kernels_profiler_us"]["chunk_gdn_solve_kernel"]
    assert f"{blocks:.1f} us against the merged solve's {merged:.1f} us" in bs["outcome"]


def test_w_u_in_the_state_pass_follows_the_recorded_table():
    # FROM_A None follows FUSE_O (w and u formed in the state pass on wide grids): against the record's table of
    # the forms with FROM_A (the fusion table where it was measured on the H200, else the from_a table, which names
    # its GPU), the default pick (from_a_o where fuse_o_rule says, else fuse_wu) is within 2% of the fastest form at
    # every recorded shape, and the table holds shapes where FROM_A wins and where it loses by more than 5%; the
    # stage rule's pick in the launch sweep is within 2% of the fastest launch swept
    rs = load_record("gdn_segments")["results"]
    name = next(n for n in ("fusion", "from_a") if any("from_a_o_graph_us" in r for r in rs.get(n, {}).get("rows", [])))
    rows = rs[name]["rows"]
    assert gdn.CONFIG["chunk"]["state"]["FROM_A"] is None
    assert {(r["B"], r["T"], r["H"], r["HV"]) for r in rows} == set(bench.FUSION_SHAPES)
    for r in rows:
        times = {f: r[f"{f}_graph_us"] for f in bench.FUSION_FORMS}
        pick = "from_a_o" if gdn.fuse_o_rule(r["B"], r["HV"], r["K"], r["V"], 2, n_sm=132) else "fuse_wu"
        assert times[pick] <= 1.02 * min(times.values()), (pick, r)
        assert r["from_a_o_rel_err_vs_split_o"] < 3e-2, r    # bf16: v' rounded elsewhere, within bf16's bound
    assert any(r["from_a_o_graph_us"] < 0.95 * min(r["fuse_wu_graph_us"], r["fuse_wu_o_graph_us"]) for r in rows)
    assert any(r["from_a_o_graph_us"] > 1.05 * r["fuse_wu_graph_us"] for r in rows)
    sweeps = [r for n in ("fusion", "from_a") for r in rs.get(n, {}).get("launch_sweep", [])]   # a session's sweep
    assert sweeps, "the stage rule of FROM_A needs its launch sweep in the record"
    for r in sweeps:
        cs = {**gdn.CONFIG["chunk"]["state"], "BV": None}   # the GPU's default (the interpreter's BV is wider)
        c = gdn._state_cfg(cs, r["B"], r["HV"], 128, 128, 2, fused=True, from_a=True)
        assert c == r["rule"], (c, r["rule"])
        swept = {k: v for k, v in r.items() if k.startswith("from_a_o_") and k.endswith("_graph_us")
                 and not k.startswith("from_a_o_solve")}
        picked = r["from_a_o_s%d_graph_us" % c["num_stages"]] if c["BV"] == 64 else r["from_a_o_bv32_graph_us"]
        assert picked <= 1.02 * min(swept.values()), (c, r)


def test_w_u_fold_avoids_the_faulting_variant():
    """On a GPU (Triton 3.6) the solve kernel with w/u folded in reads shared memory out of bounds at small K
    (compute-sanitizer on an H100: K = 16, with V = 16 or 64; illegal addresses at K = 32 with keys normalised in the
    kernel on the H200; clean at K = 48, 64, 100 and 128, and at V = 16 with K = 64). The launcher keeps kernel 2
    apart on a GPU unless K (padded) is at least 64; the interpreter runs the folded form everywhere."""
    on = {"FUSE_WU": True}
    assert not gdn._fuse_wu(on, 32, False) and not gdn._fuse_wu(on, 16, False)
    assert gdn._fuse_wu(on, 48, False) and gdn._fuse_wu(on, 64, False) and gdn._fuse_wu(on, 128, False)  # 48 pads to 64
    assert gdn._fuse_wu(on, 16, True) and not gdn._fuse_wu({"FUSE_WU": False}, 128, False)


@pytest.mark.parametrize("K,V,dtype,l2", [(16, 16, torch.bfloat16, False), (16, 16, torch.float32, False),
                                          (32, 32, torch.bfloat16, True), (16, 48, torch.bfloat16, False),
                                          (64, 16, torch.bfloat16, False)])
@pytest.mark.parametrize("kind", list(KERNELS))
def test_small_head_dims_on_the_default_launch(kind, K, V, dtype, l2):
    # the default launch at head dims below 64 (chunked, on a GPU: kernel 2 runs apart below K 64, see above;
    # folded otherwise) against the recurrence, odd length over three chunks, an initial state, every output written
    fn, fp32_bound = KERNELS[kind]
    x = gdn.make_inputs(1, 130, 1, K, V=V, HV=2, dtype=dtype, gate="mixed", normalize_qk=not l2, seed=K + V)
    x["initial_state"] = torch.randn(1, 2, K, V, device=DEVICE) * 0.3
    kw = dict(use_qk_l2norm_in_kernel=l2, output_final_state=True)
    assert_fully_written(lambda: fn(**x, **kw), names=["o", "final_state"])
    o, ht = fn(**x, **kw)
    ro, rh = _ref(x, use_qk_l2norm_in_kernel=l2)
    bound = fp32_bound if dtype == torch.float32 else 2e-2
    assert_rel_close(o, ro, bound, f"{kind} o, K={K} V={V}")
    assert_rel_close(ht, rh, bound, f"{kind} final state, K={K} V={V}")


def test_outputs_folded_in_by_the_rule(monkeypatch):
    """FUSE_O None asks fuse_o_rule about (N sequences, HV, K, V) and FROM_A None follows it; the answer gives the
    same bits as the forced forms, and a caller who keeps the intermediates gets the four-kernel form (h, v', w, u)
    whatever it says. The rule itself: outputs folded in exactly where the state pass's grid runs at BV 64 (fills
    the SMs) and K <= 128; three stages then, except with FROM_A where two programs must share an SM."""
    x = gdn.make_inputs(1, 70, 2, 32, HV=4, gate="mixed", seed=53)
    cu = torch.tensor([0, 3, 70], device=DEVICE)
    for answer in (True, False):
        seen = []
        monkeypatch.setattr(gdn, "fuse_o_rule", lambda *a, **kw: seen.append(a) or answer)
        o, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu)
        assert seen == [(2, 4, 32, 32, 4)]
        forced, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, config={"state": {"FUSE_O": answer,
                                                                                      "FROM_A": answer}})
        other, _ = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, config={"state": {"FUSE_O": answer,
                                                                                     "FROM_A": not answer}})
        assert torch.equal(o, forced) and not torch.equal(o, other), "FROM_A None follows the rule's FUSE_O"
        *_, inter = gdn.chunk_gated_delta_rule(**x, cu_seqlens=cu, return_intermediates=True)
        assert all(inter[n] is not None for n in ("h", "v_new", "w", "u"))
    monkeypatch.undo()
    for N, HV, K, V in ((2, 64, 128, 128), (1, 64, 128, 128), (4, 32, 128, 128), (1, 16, 128, 128), (1, 8, 128, 128),
                        (8, 32, 256, 256), (8, 32, 128, 32)):
        bv = gdn.state_launch(N, HV, K, V, n_sm=132)["BV"]
        assert gdn.fuse_o_rule(N, HV, K, V, n_sm=132) == (bv == 64 and K <= 128), (N, HV, K, V)
        assert not gdn.fuse_o_rule(N, HV, K, V, 4, n_sm=132)     # fp32 storage: not measured, tiles too large
    cs = {**gdn.CONFIG["chunk"]["state"]}
    assert gdn._state_cfg(cs, 2, 64, 128, 128, 2)["num_stages"] == 2
    assert gdn._state_cfg(cs, 2, 64, 128, 128, 2, fused=True)["num_stages"] == 3
    assert gdn._state_cfg(cs, 8, 32, 256, 256, 2, fused=True) == gdn._state_cfg(cs, 8, 32, 256, 256, 2)
    assert gdn._state_cfg(cs, 2, 64, 128, 128, 4, fused=True) == gdn._state_cfg(cs, 2, 64, 128, 128, 4)
    # FROM_A with the outputs folded in: a stage holds k, q, A and v tiles; at 2 x 64 value heads (two programs
    # per SM) three stages would hold one program per SM, so two; at 1 x 64 (one per SM) three
    assert gdn._state_cfg(cs, 2, 64, 128, 128, 2, fused=True, from_a=True)["num_stages"] == 2
    assert gdn._state_cfg(cs, 1, 64, 128, 128, 2, fused=True, from_a=True)["num_stages"] == 3
    assert gdn.state_launch(1, 8, 128, 128, from_a=True, fused=True)["num_stages"] == 3   # varlen-like: one per SM


def test_segment_rule_counts_sequences_not_the_batch_dim(monkeypatch):
    """'auto' asks the rule about N sequences of their mean length: a varlen batch (B == 1) of 4 sequences
    over 2 value heads is 8 sequence-heads, like B = 4; one long sequence with 8 heads is 8 too."""
    assert gdn.segment_rule(1, 65536, 2, 8, 128, 128) == gdn.SEGMENT_RULE["chunks"]
    assert gdn.segment_rule(4, 8192, 1, 2, 128, 128) == gdn.SEGMENT_RULE["chunks"]
    assert gdn.segment_rule(1, 8192, 16, 64, 128, 128) is None          # many heads: the plain path
    assert gdn.segment_rule(1, 4096, 2, 8, 128, 128) is None            # too short to split
    assert gdn.segment_rule(1, 65536, 2, 8, 256, 512) is None           # V + K > 512: never raises
    seen = []
    monkeypatch.setattr(gdn, "segment_rule", lambda *a: seen.append(a[:2]) or None)
    x = gdn.make_inputs(1, 40, 1, 16, seed=47)
    gdn.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 10, 10, 40], device=DEVICE), segments="auto")
    gdn.chunk_gated_delta_rule(**gdn.make_inputs(2, 20, 1, 16, seed=47), segments="auto")
    assert seen == [(3, 13), (2, 20)]
    o1, _ = gdn.chunk_gated_delta_rule(**x, segments="auto")
    o2, _ = gdn.chunk_gated_delta_rule(**x)                  # "auto" is the default: the rule is asked
    assert seen == [(3, 13), (2, 20), (1, 40), (1, 40)]
    o3, _ = gdn.chunk_gated_delta_rule(**x, segments=None)   # the plain path, the rule not asked
    assert seen == [(3, 13), (2, 20), (1, 40), (1, 40)] and torch.equal(o1, o2) and torch.equal(o1, o3)


def test_the_default_call_takes_segments_where_the_rule_says(monkeypatch):
    """The default (segments="auto") runs the segmented form where segment_rule answers a length, and its result
    is the explicit call's, bit for bit; where the rule answers None it is the plain path's."""
    x = gdn.make_inputs(1, 200, 1, 16, HV=2, gate="mixed", seed=11)
    x["initial_state"] = torch.randn(1, 2, 16, 16, device=DEVICE) * 0.5
    monkeypatch.setattr(gdn, "segment_rule", lambda *a: 1)
    o, ht, inter = gdn.chunk_gated_delta_rule(**x, output_final_state=True, return_intermediates=True)
    assert "seg_offsets" in inter                            # the segmented form ran
    o1, h1 = gdn.chunk_gated_delta_rule(**x, output_final_state=True, segments=1)
    assert torch.equal(o, o1) and torch.equal(ht, h1)
    monkeypatch.setattr(gdn, "segment_rule", lambda *a: None)
    *_, inter = gdn.chunk_gated_delta_rule(**x, output_final_state=True, return_intermediates=True)
    assert "seg_offsets" not in inter


def test_segmented_varlen_call_never_reads_device_values_on_the_host():
    cu = torch.tensor([0, 5, 140, 140, 150], device=DEVICE, dtype=torch.int32)
    cu_cpu = cu.cpu()
    x = gdn.make_inputs(1, 150, 1, 32, gate="mixed", seed=47)
    x["initial_state"] = torch.randn(4, 1, 32, 32, device=DEVICE) * 0.5
    ro, rh = _ref(x, cu_seqlens=cu)
    with no_host_reads(allow=[cu_cpu]):
        o, ht = gdn.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
                                           segments=1)
    assert_rel_close(o, ro, CHUNK_BOUND, "segmented varlen o, no host reads")
    assert_rel_close(ht, rh, CHUNK_BOUND, "segmented varlen final state, no host reads")


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_segmented_call_replays_from_a_cuda_graph():
    x = gdn.make_inputs(1, 600, 2, 64, HV=4, dtype=torch.bfloat16, gate="mixed", seed=48)
    x["initial_state"] = torch.randn(3, 4, 64, 64, device=DEVICE) * 0.3
    cu = torch.tensor([0, 70, 400, 600], device=DEVICE)
    kw = dict(cu_seqlens=cu, output_final_state=True, segments=2)
    torch.cuda.set_sync_debug_mode("error")
    try:
        gdn.chunk_gated_delta_rule(**x, **kw)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gdn.chunk_gated_delta_rule(**x, **kw)      # warm-up off the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, ht = gdn.chunk_gated_delta_rule(**x, **kw)
    cu.copy_(torch.tensor([0, 1, 129, 600], device=DEVICE))
    graph.replay()
    ro, rh = gdn.chunk_gated_delta_rule(**x, **{**kw, "cu_seqlens": cu.clone()})
    assert_rel_close(o, ro, 1e-6, "segmented replayed o")
    assert_rel_close(ht, rh, 1e-6, "segmented replayed final state")


def _compose(M=lambda M1, M2: M2 @ M1, B=lambda M1, B1, M2, B2: M2 @ B1 + B2, S=lambda M, B, S0: M @ S0 + B):
    """The solution with one part replaced (each a plausible mistake)."""
    def fn(M1, B1, M2, B2, S0):
        m, b = M(M1, M2), B(M1, B1, M2, B2)
        return m, b, S(m, b, S0)
    return fn


COMPOSE_WRONG = {
    "matrices in the wrong order": (_compose(M=lambda M1, M2: M1 @ M2), "segment 1 acts FIRST"),
    "matrices transposed": (_compose(M=lambda M1, M2: M1.T @ M2.T), "M is transposed"),
    "B1 not carried through M2": (_compose(B=lambda M1, B1, M2, B2: B1 + B2), r"B is B1 \+ B2.*B = M2 B1 \+ B2"),
    "B1 and B2 swapped": (_compose(B=lambda M1, B1, M2, B2: M2 @ B2 + B1), "B1 and B2 are swapped"),
    "B composed in the wrong order": (_compose(B=lambda M1, B1, M2, B2: M1 @ B2 + B1), "segment 2 first"),
    "B with M2 transposed": (_compose(B=lambda M1, B1, M2, B2: M2.T @ B1 + B2), "M2 transposed"),
    "B returned as [V, K]": (lambda *a: (lambda m, b, e: (m, b.T, e))(*graders.solution_compose_segments(*a)),
                             r"B and S_end are \[K, V\]"),
    "start state applied without B": (_compose(S=lambda M, B, S0: M @ S0), "S_end misses B"),
    "start state applied with M transposed": (_compose(S=lambda M, B, S0: M.T @ S0 + B), "S_end uses M transposed"),
    "start state not transformed": (_compose(S=lambda M, B, S0: S0 + B), "forgets M"),
}


@pytest.mark.parametrize("which", list(COMPOSE_WRONG))
def test_compose_segments_grader_fails_wrong_answers_with_the_intended_message(which):
    fn, match = COMPOSE_WRONG[which]
    _fails(graders.check_compose_segments, fn, match)


def test_segment_benchmark_cost_and_table_without_a_gpu():
    # the FLOP model: plain = NC (6 C^2 K + 4 C^2 V + 6 C K V + 2 C^3 / 3); the segmented form adds the
    # [B | M] pass and the scan; bytes = inputs read once, outputs written once
    c = bench.segment_cost(1, 64, 1, 1, 16, 8, seg=1)
    C = 64
    assert c["flops"] == 6 * C * C * 16 + 4 * C * C * 8 + 6 * C * 16 * 8 + 2 * C ** 3 / 3
    assert c["bytes"] == 64 * (2 * 16 + 2 * 8 + 1) * 2 + 64 * 4 + 2 * 16 * 8 * 4
    assert c["flops"] < c["seg_flops"] < 3 * c["flops"]
    assert [s[:4] for s in bench.SEGMENT_SHAPES] == [(2, 4096, 16, 64), (1, 8192, 16, 64), (1, 65536, 16, 64),
                                                    (1, 65536, 2, 8), (1, 8192, 2, 8)]
    row = {"B": 1, "T": 8192, "H": 2, "HV": 8, "K": 128, "V": 128, "plain_graph_us": 100.0, "plain_eager_us": 150.0,
           "seg4_graph_us": 50.0, "seg4_eager_us": 90.0, "ratio_seg4_over_plain_graph": 0.5, "seg8_error": "X",
           **bench.segment_cost(1, 8192, 2, 8, 128, 128)}
    text = bench.segments_table({"results": {"sweep_chunks_per_segment": [4, 8], "segments": [row]}})
    assert "plain graph    100.0 us" in text and "seg4 graph     50.0 us (0.50x plain)" in text, text
    assert "seg8 failed" in text and "fla graph      n/a" in text
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="measures a GPU"):
            bench.measure_segments()


def test_measure_segments_makes_a_valid_record(monkeypatch):
    # the lead's H200 run, rehearsed on a tiny shape with stand-in timers (no figure here is a GPU time):
    # every call runs, the segmented results are checked against the plain ones, the record fits the schema
    monkeypatch.setattr(timing, "require_gpu", lambda what: None)
    monkeypatch.setattr(timing, "time_both", lambda fn: (fn(), {"graph_us": 2.0, "eager_us": 3.0})[1])
    monkeypatch.setattr(bench, "SEGMENT_D", 16)
    monkeypatch.setattr(bench, "_fla", lambda: (None, None, "not called in the rehearsal"))
    saved_rec = load_record("gdn_segments")
    saved = saved_rec["results"]
    monkeypatch.setattr(bench, "describe", lambda: {"gpu": saved_rec["machine"]["gpu"]})   # as on the record's GPU
    rec = bench.measure_segments(shapes=[(1, 130, 1, 2)], sweep=(1, 4), verbose=False)
    row = rec["results"]["segments"][0]
    assert rec["name"] == "gdn_segments" and set(rec["timers"]) == {"graph", "eager", "profiler"}
    kept = {"previous_design", "fusion", "fuse_o_launch_sweep", "ncu_profile", "fused_prototype", "transposed_state",
            "from_a", "from_a_segments"}
    assert kept == set(bench.SEGMENTS_KEPT)
    assert kept <= set(saved) and all(rec["results"][k] == saved[k] for k in kept), kept   # the other tables, unchanged
    # on another GPU model only the tables that name their own machine stay (the rest were not measured there)
    other, _ = carry_over(saved_rec, bench.SEGMENTS_KEPT, "another GPU")
    assert set(other) == {"transposed_state", "from_a", "from_a_segments"}, set(other)
    assert row["seg1_segments_per_sequence"] == 3 and row["seg4_segments_per_sequence"] == 1
    assert row["seg1_rel_err_vs_plain_o"] < 3e-2 and row["seg4_rel_err_vs_plain_ht"] < 3e-2   # bf16 (the bound above)
    assert row["ratio_seg1_over_plain_graph"] == 1.0 and row["flops"] > 0 and row["seg1_flops"] > row["flops"]
    assert "seg1 graph      2.0 us (1.00x plain)" in bench.segments_table(rec)


def test_measure_fusion_rehearsed_without_a_gpu(monkeypatch):
    # the fused-forms table, rehearsed on a tiny shape with stand-in timers (no figure here is a GPU time):
    # every form runs, agrees with the split form, is timed and (at a profiled shape) profiled; the table renders
    monkeypatch.setattr(timing, "require_gpu", lambda what: None)
    monkeypatch.setattr(timing, "time_both", lambda fn: (fn(), {"graph_us": 2.0, "eager_us": 3.0})[1])
    monkeypatch.setattr(timing, "kernel_times_us", lambda fn, n=5: (fn(), {"chunk_gdn_solve_kernel": 1.0})[1])
    monkeypatch.setattr(bench, "SEGMENT_D", 16)
    monkeypatch.setattr(bench, "_fla", lambda: (None, None, "not called in the rehearsal"))
    monkeypatch.setattr(bench, "FUSION_PROFILED", {(1, 70, 1, 4)})
    monkeypatch.setattr(timing, "copy_ceiling_GBps", lambda: 4000.0)        # stand-in ceilings, not measured
    monkeypatch.setattr(timing, "matmul_ceiling_TFLOPs", lambda: 800.0)
    table = bench.measure_fusion(shapes=[(1, 70, 1, 4)], verbose=False)
    row = table["rows"][0]
    floor = max(row["flops"] / 800e6, row["bytes"] / 4000e3)   # us: FLOPs at 800 TFLOP/s, bytes at 4000 GB/s
    assert row["floor_microseconds"] == pytest.approx(floor) and row["fastest_share_of_floor"] == pytest.approx(floor / 2.0)
    for form in bench.FUSION_FORMS:   # the same bits, except where v' is rounded elsewhere (FROM_A: bf16's bound)
        bound = 3e-2 if bench.FUSION_FORMS[form]["state"]["FROM_A"] else 1e-5
        assert row[f"{form}_graph_us"] == 2.0 and row[f"{form}_rel_err_vs_split_o"] < bound, form
    assert row["from_a_o_rel_err_vs_split_o"] > 0, "FROM_A rounds v' elsewhere: bits equal to the split form's?"
    assert set(k for k in row if k.endswith("_kernels_profiler_us")) == {
        "split_kernels_profiler_us", "fuse_wu_kernels_profiler_us", "fuse_wu_o_kernels_profiler_us",
        "from_a_o_kernels_profiler_us"}
    text = bench.fusion_table({"results": {"fusion": table}})
    assert "fuse_wu      2.0 us" in text and "B=1 T=70 H=1/4" in text, text
    assert "not recorded yet" in bench.fusion_table({"results": {}})
    # the table is a valid part of the record save=True writes (every time figure's key names its timer)
    from workbook.records import load_record as load, validate_record
    rec = load("gdn_segments")
    validate_record({**rec, "results": {**rec["results"], "fusion": table},
                     "timers": {**rec["timers"], **{k: bench.TIMERS[k] for k in ("graph", "eager", "profiler")}}})


def test_fusion_table_saved_where_the_gpu_may_carry_the_record(monkeypatch, tmp_path):
    # measure_fusion(save=True) rewrites gdn_segments: on the record's GPU model every other table stays beside the
    # new fusion table; on another GPU only the tables that name their own machine do (the rest were not measured
    # there and would be filed under its name); both records are valid and the new table is the one written
    (tmp_path / "gdn_segments.json").write_text((DATA_DIR / "gdn_segments.json").read_text())
    rec = load_record("gdn_segments", tmp_path)
    table = {"what": "stand-in", "forms": {}, "fla_version": "-", "rows": [{"B": 1, "split_graph_us": 2.0}]}
    for gpu, expect in ((rec["machine"]["gpu"], set(rec["results"])),
                        ("another GPU", {"fusion", "transposed_state", "from_a", "from_a_segments"})):
        monkeypatch.setattr(bench, "describe", lambda gpu=gpu: {"gpu": gpu})
        (tmp_path / "gdn_segments.json").write_text((DATA_DIR / "gdn_segments.json").read_text())
        bench._save_fusion(table, {"copy_GBps": 4000.0}, tmp_path)
        saved = load_record("gdn_segments", tmp_path)
        assert set(saved["results"]) == expect and saved["results"]["fusion"] == table, (gpu, set(saved["results"]))
        assert all(saved["results"][k] == rec["results"][k] for k in expect - {"fusion"})


@pytest.mark.parametrize("segments", [None, 1])
def test_v_padded_path_for_k_above_v(monkeypatch, segments):
    """Where the GPU's compiled kernels fail with K > V (16-bit operands: _v_pad_needed), the call runs
    with v and the states padded to K columns: forced here, the results equal the reference, the
    caller's state is updated in place, and the padded path is taken exactly when K > V."""
    assert gdn._v_pad_needed(torch.bfloat16, 32, 16, emulate=False)
    assert not gdn._v_pad_needed(torch.bfloat16, 16, 32, emulate=False)
    assert not gdn._v_pad_needed(torch.float32, 32, 16, emulate=False)
    assert not gdn._v_pad_needed(torch.bfloat16, 32, 16, emulate=True)
    calls = []
    real = gdn._run_v_padded
    monkeypatch.setattr(gdn, "_v_pad_needed", lambda dtype, K, V, emulate: K > V)
    monkeypatch.setattr(gdn, "_run_v_padded", lambda *a, **kw: (calls.append(1), real(*a, **kw))[1])
    x = gdn.make_inputs(1, 130, 2, 32, V=16, HV=4, gate="mixed", seed=47)
    x["initial_state"] = torch.randn(1, 4, 32, 16, device=DEVICE) * 0.5
    ro, rh = gdn.naive_recurrent_gated_delta_rule(**x, output_final_state=True)
    o, ht = gdn.chunk_gated_delta_rule(**x, output_final_state=True, segments=segments)
    assert calls and o.shape == ro.shape and ht.shape == rh.shape
    assert_rel_close(o, ro, CHUNK_BOUND, "padded o")
    assert_rel_close(ht, rh, CHUNK_BOUND, "padded final state")
    for which in (0, 1):   # every empty of the padded path (its [N, HV, K, K] final states too) poisoned
        with poisoned_allocations(which):
            po, pht = gdn.chunk_gated_delta_rule(**x, output_final_state=True, segments=segments)
        assert torch.equal(po, o) and torch.equal(pht, ht), f"poison {which} reached a result"
    h = x.pop("initial_state").clone()
    o2, h2 = gdn.chunk_gated_delta_rule(**x, initial_state=h, inplace_final_state=True, segments=segments)
    assert h2 is h
    assert_rel_close(h, rh, CHUNK_BOUND, "padded state in place")
    n = len(calls)
    gdn.chunk_gated_delta_rule(**gdn.make_inputs(1, 70, 1, 16, V=32, seed=48), segments=segments)
    assert len(calls) == n, "K <= V never takes the padded path"
