"""The exercises of notebook 05 (Gated DeltaNet): a grader (``check_*``) and a plain reference solution
(``solution_*``) for each. A grader raises ``AssertionError`` with a message that teaches (or lets the
stub's ``NotImplementedError`` through); ``tests/test_gdn.py`` runs each against its solution, the stub
and plausible wrong answers.

1. ``check_decode_step``: one decode step of the recurrence, the state updated in place.
2. ``check_ut_transform``: A = (I + L)^-1 of one chunk, the exponent masked before exp.
3. ``check_chunk_spans``: the rows each program of the chunked kernels owns in a varlen batch.
4. ``check_state_pass``: the state carried from chunk to chunk, one head.
5. ``check_compose_segments``: two segments' affine state maps composed into one, and applied.
"""
from __future__ import annotations

import torch
import triton

from ..check import rel_err
from ..coverage import poisoned_allocations
from ..device import require_launchable
from ..gdn import l2norm, make_inputs, naive_recurrent_gated_delta_rule
from ..kernels import gdn as kern
from .common import run_guarded

__all__ = [
    "check_decode_step", "check_ut_transform", "check_chunk_spans", "check_state_pass",
    "solution_decode_step", "solution_ut_transform", "solution_chunk_spans", "solution_state_pass",
    "check_compose_segments", "solution_compose_segments", "segment_map",
]


def _call_learner(fn, *args, what: str, shapes: str):
    """Run the learner's function; an error other than NotImplementedError becomes a teaching message."""
    try:
        return fn(*args)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as e:  # noqa: BLE001  (any bug in the learner's code)
        raise AssertionError(f"{what} raised {type(e).__name__}: {str(e)[:300]}\nThe inputs were: {shapes}. "
                             "Check each tensor's shape and which axis you reduce over.") from None


def _rel(a, b) -> float:
    return rel_err(a, b)


# Exercise 1: one decode step ----------------------------------------------------------------------

def _decode_step_torch(h, q, k, v, g, beta, *, heads="group", order="decay_first", scale=True):
    """One decode step in torch on copies; the variants name plausible mistakes."""
    N, H, K = q.shape
    HV = v.shape[1]
    kh = torch.arange(HV, device=q.device) // (HV // H) if heads == "group" else torch.arange(HV, device=q.device) % H
    qh, kk = q[:, kh].float(), k[:, kh].float()                    # [N, HV, K]
    h = h.float().clone()
    decay = g.float().exp()[:, :, None, None]
    if order == "decay_first":
        h = h * decay
        u = beta.float()[:, :, None] * (v.float() - torch.einsum("nhkv,nhk->nhv", h, kk))
        h = h + kk[:, :, :, None] * u[:, :, None, :]
    else:  # the correction from the old state, decay applied after the write
        u = beta.float()[:, :, None] * (v.float() - torch.einsum("nhkv,nhk->nhv", h, kk))
        h = (h + kk[:, :, :, None] * u[:, :, None, :]) * decay
    o = torch.einsum("nhkv,nhk->nhv", h, qh * (K ** -0.5 if scale else 1.0))
    return o, h


def solution_decode_step(h, q, k, v, g, beta):
    """Exercise 1, plain solution: one Triton program per (sequence, value head) holds the whole
    [K, V] state (``kernels/gdn.py: decode_step_solution_kernel``); h is updated in place."""
    N, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    # empty: program (n, hv) writes all V entries of o[n, hv]; the N * HV programs cover o.
    o = torch.empty(N, HV, V, dtype=torch.float32, device=h.device)
    require_launchable(kern.decode_step_solution_kernel)
    kern.decode_step_solution_kernel[(N * HV,)](h, q, k, v, g, beta, o, K ** -0.5, H=H, HV=HV, K=K, V=V,
                                               BK=triton.next_power_of_2(K), BV=triton.next_power_of_2(V))
    return o


def check_decode_step(fn) -> None:
    """Grader of exercise 1: ``fn(h, q, k, v, g, beta) -> o`` for T = 1 with h [N, HV, K, V] fp32
    updated in place, q, k [N, H, K], v [N, HV, V], g, beta [N, HV]; o [N, HV, V]. Graded with
    K != V (a K/V mix-up shows) and two value heads per key head, outputs allocated poisoned."""
    N, H, HV, K, V = 3, 2, 4, 32, 16
    x = make_inputs(N, 1, H, K, V=V, HV=HV, gate="mixed", initial_state=True, seed=11)
    h0 = x["initial_state"]
    q, k, v, g, beta = x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["g"][:, 0], x["beta"][:, 0]
    ref_o, ref_h = _decode_step_torch(h0, q, k, v, g, beta)
    h = h0.clone()
    shapes = (f"h [N, HV, K, V] = [{N}, {HV}, {K}, {V}], q and k [N, H, K] = [{N}, {H}, {K}], "
              f"v [N, HV, V] = [{N}, {HV}, {V}], g and beta [N, HV] = [{N}, {HV}]")
    # allocations poisoned (NaN) and guarded: a Triton kernel's store past the end of o is named, and
    # in the interpreter a stray access is stopped before it can kill the Python kernel
    o, _ = run_guarded(lambda: _call_learner(fn, h, q, k, v, g, beta, what="your decode step", shapes=shapes),
                       f"[N={N}, HV={HV}, K={K}, V={V}]", outputs=lambda o: [("o", o)],
                       needs={"o": f"o is [N, HV, V] = [{N}, {HV}, {V}] fp32 = {4 * N * HV * V} bytes"})
    if not isinstance(o, torch.Tensor):
        raise AssertionError(f"return o, a tensor [N, HV, V] = [{N}, {HV}, {V}] (got {type(o).__name__})")
    if tuple(o.shape) == (N, HV, K):
        raise AssertionError(f"o has shape [N, HV, K] = [{N}, {HV}, {K}]: the output lives in VALUE space. "
                             f"o = h^T q contracts the K axis of h [K, V] with q, leaving V = {V} entries per head.")
    if tuple(o.shape) != (N, HV, V):
        raise AssertionError(f"o must be [N, HV, V] = [{N}, {HV}, {V}], got {list(o.shape)}")
    if torch.isnan(o.float()).any():
        raise AssertionError("o still holds poison (NaN) at some positions: every o[n, hv, :] must be written "
                             f"(all HV = {HV} value heads, not only the H = {H} key heads)")
    if torch.equal(h, h0):
        raise AssertionError("h was not updated in place: write the new state into the h you were given "
                             "(h.mul_(...), h.copy_(...), or a kernel storing into h), not into a new tensor")
    if _rel(h, ref_h) > 2e-3:
        for kw, hint in (({"heads": "mod"}, "value head hv reads key head hv // (HV // H) (heads in groups: "
                                            "value heads 0, 1 share key head 0 here), not hv % H"),
                         ({"order": "decay_after"}, "decay FIRST (h *= exp(g)), then u = beta (v - h^T k) "
                                                    "with the DECAYED h, then h += k u^T")):
            if _rel(h, _decode_step_torch(h0, q, k, v, g, beta, **kw)[1]) < 2e-3:
                raise AssertionError(f"the state is off by {_rel(h, ref_h):.1e}: {hint}.")
        raise AssertionError(f"the state is off by {_rel(h, ref_h):.1e}: h <- exp(g) h; u = beta (v - h^T k); "
                             "h <- h + k u^T (k as a column, u as a row: an outer product [K, V]); value head "
                             "hv uses key head hv // (HV // H).")
    if _rel(o, ref_o) > 2e-3:
        old_h = h0.float() * g.float().exp()[:, :, None, None]
        kh = torch.arange(HV) // (HV // H)
        if _rel(o, torch.einsum("nhkv,nhk->nhv", old_h, q[:, kh].float() * K ** -0.5)) < 2e-3:
            raise AssertionError("the state is right but o was read from the state BEFORE this token's write: "
                                 "o = h^T q uses the UPDATED h (the token sees its own value).")
        if _rel(o, _decode_step_torch(h0, q, k, v, g, beta, scale=False)[0]) < 2e-3:
            raise AssertionError(f"o is off by a factor sqrt(K) = {K ** 0.5:.2f}: o = h^T q * K**-0.5.")
        raise AssertionError(f"the state is right but o is off by {_rel(o, ref_o):.1e}: o = h^T q * K**-0.5 "
                             "with the updated h.")


# Exercise 2: the UT transform of one chunk --------------------------------------------------------

class _ExpWatch:
    """Records the largest argument passed to exp/exp2 (any spelling: torch.exp, Tensor.exp, exp_)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        watch = self
        self.max_arg = float("-inf")
        self.hot = None          # the argument that held the largest value
        ops = {torch.ops.aten.exp, torch.ops.aten.exp_, torch.ops.aten.exp2, torch.ops.aten.exp2_}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket in ops and isinstance(args[0], torch.Tensor) and args[0].numel():
                    a = args[0].detach().float()
                    a = a[~torch.isnan(a)]
                    if a.numel() and float(a.max()) > watch.max_arg:
                        watch.max_arg, watch.hot = float(a.max()), args[0].detach().float()
                return func(*args, **(kwargs or {}))

        self.mode = Mode()


def solution_ut_transform(k, beta, G):
    """Exercise 2, plain solution: A = (I + L)^-1 with L = strict_lower(diag(beta) (K K^T * Gamma)),
    Gamma_ij = exp(G_i - G_j) computed only where i > j (masked BEFORE exp: above the diagonal the
    exponent is positive and overflows), then forward substitution row by row."""
    C = k.shape[0]
    below = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)        # i > j
    expo = torch.where(below, G[:, None] - G[None, :], torch.zeros((), device=k.device))
    L = torch.where(below, beta[:, None] * (k @ k.T) * expo.exp(), torch.zeros((), device=k.device))
    A = torch.eye(C, device=k.device)                       # row i of A = e_i - sum_{j<i} L[i, j] A[j]
    for i in range(1, C):
        A[i] = A[i] - L[i, :i] @ A[:i]
    return A


def check_ut_transform(fn) -> None:
    """Grader of exercise 2: ``fn(k [C, K], beta [C], G [C]) -> A [C, C]``. The gates drop sharply
    near the end of the chunk, so that above the diagonal G_i - G_j reaches about +200 (exp overflows
    to inf in fp32); an exp of those entries is seen (every exp call's argument is watched) and
    refused, and a masked product inf * 0 = NaN shows as non-finite. Two chunk lengths, 64 and 37."""
    for C, K in ((64, 32), (37, 16)):
        gen = torch.Generator().manual_seed(C)
        k = l2norm(torch.randn(C, K, generator=gen))
        beta = torch.rand(C, generator=gen) * 0.9 + 0.05
        G = (-torch.rand(C, generator=gen) * 0.5).cumsum(0)
        G[-C // 4:] -= 200.0         # a sharp drop: exp(G_i - G_j) above the diagonal overflows
        watch = _ExpWatch()
        with watch.mode:
            A = _call_learner(fn, k.clone(), beta.clone(), G.clone(), what="your UT transform",
                              shapes=f"k [C, K] = [{C}, {K}], beta [C], G [C] with C = {C}")
        hot = watch.hot
        if watch.max_arg > 1.0 and hot is not None and hot.shape == (C, C) and bool((hot.triu(1) <= 0).all()):
            raise AssertionError(
                f"[C={C}] you masked the exponent, but its sign is reversed (exp of up to {watch.max_arg:+.1f} "
                "below the diagonal): Gamma_ij = exp(G_i - G_j) for i > j, the decay from token j to the later "
                "token i; the log decays only fall, so G_i - G_j <= 0 there and exp stays in [0, 1].")
        if watch.max_arg > 1.0:
            raise AssertionError(
                f"[C={C}] you exponentiated a positive number (up to {watch.max_arg:+.1f}): above the diagonal "
                "(i < j) G_i - G_j > 0, and from about 89 on exp overflows to inf in fp32 (here the gap is "
                "200). Masking after exp (tril, or * mask) comes too late. Mask the EXPONENT first: "
                "torch.where(i > j, G_i - G_j, 0) (or -inf), then exp; likewise exp(G_i) * exp(-G_j) overflows.")
        if not isinstance(A, torch.Tensor) or tuple(A.shape) != (C, C):
            raise AssertionError(f"[C={C}] return A as a [C, C] = [{C}, {C}] tensor")
        A = A.float()
        if not torch.isfinite(A).all():
            raise AssertionError(f"[C={C}] A has inf/NaN: an overflowing exp times a zero mask is NaN (inf * 0). "
                                 "Mask the exponent G_i - G_j to i > j BEFORE exponentiating.")
        if A.triu(1).abs().max() > 0:
            raise AssertionError(f"[C={C}] A must be lower triangular (the inverse of a unit lower triangular matrix)")
        below = torch.ones(C, C, dtype=torch.bool).tril(-1)
        gam = torch.where(below, G[:, None] - G[None, :], torch.zeros(())).exp()
        S = (k @ k.T) * gam
        eye = torch.eye(C)

        def inv(Lm):
            return torch.linalg.solve_triangular(eye + Lm, eye, upper=False)

        L = torch.where(below, beta[:, None] * S, torch.zeros(()))
        if (A - inv(L)).abs().max() < 1e-4:
            continue
        if (A - inv(torch.where(below, beta[None, :] * S, torch.zeros(())))).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] beta scales the wrong side: diag(beta) multiplies on the LEFT, so row "
                                 "i of L is scaled by beta_i (the token being written), not column j.")
        if (A - inv(torch.where(below | eye.bool(), beta[:, None] * S, torch.zeros(())))).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] L must be STRICTLY lower (i > j): a token does not correct against "
                                 "itself, so I + L has ones on its diagonal.")
        if (A - inv(-L)).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] you inverted I - L: A = (I + L)^-1 (the plus sign: row i of A is "
                                 "e_i - sum_{j<i} L[i, j] A[j]).")
        if (A - (eye - L)).abs().max() < 1e-4:
            raise AssertionError(f"[C={C}] you returned I - L, the first terms of the inverse only: solve "
                                 "(I + L) A = I (forward substitution or torch.linalg.solve_triangular).")
        resid = (A @ (eye + L) - eye).abs().max().item()
        raise AssertionError(f"[C={C}] A (I + L) - I has entries up to {resid:.1e}: L = strict_lower(diag(beta) "
                             "(K K^T * Gamma)) with Gamma_ij = exp(G_i - G_j), and A = (I + L)^-1.")


# Exercise 3: the chunks of a variable-length batch -------------------------------------------------

def solution_chunk_spans(cu_seqlens, chunk):
    """Exercise 3, plain solution: the row range [start, end) of every chunk, sequence by sequence.
    Chunks restart at every sequence start and the last one of a sequence is cut at its end."""
    spans = []
    for bos, eos in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        for start in range(bos, eos, chunk):
            spans.append((start, min(start + chunk, eos)))
    return spans


def check_chunk_spans(fn) -> None:
    """Grader of exercise 3: ``fn(cu_seqlens: list[int], chunk: int) -> list of (start, end)``, the rows
    each program of the chunked kernels owns, in order. Graded on T = 63, T = 1, exact multiples,
    an empty sequence and a sequence one row longer than a chunk."""
    cases = [([0, 63], 64), ([0, 1], 64), ([0, 15, 100, 130], 64), ([0, 64, 64, 129, 130], 64),
             ([0, 5, 37, 37, 64, 100], 16)]
    for cu, C in cases:
        got = _call_learner(fn, list(cu), C, what="your chunk table",
                            shapes=f"cu_seqlens = {cu}, chunk = {C}")
        try:
            got = [(int(s), int(e)) for s, e in got]
        except (TypeError, ValueError):
            raise AssertionError(f"return a list of (start, end) pairs, got {got!r:.200}") from None
        ref = solution_chunk_spans(cu, C)
        if got == ref:
            continue
        where = f"cu_seqlens = {cu}, chunk = {C}: "
        for s, e in got:
            if e <= s:
                raise AssertionError(where + f"chunk ({s}, {e}) is empty: a zero-length sequence has no chunks "
                                     "(a program for it would read and write rows of its neighbours)")
            n = max((i for i in range(len(cu) - 1) if cu[i] <= s < cu[i + 1]), default=None)
            if n is None or e > cu[n + 1]:
                end = cu[-1] if n is None else cu[n + 1]
                raise AssertionError(where + f"chunk ({s}, {e}) runs past the end of its sequence at row {end}: a "
                                     "chunk never spans two sequences (the state restarts from h0 at every "
                                     "cu_seqlens offset); start chunks at each sequence start and cut the last "
                                     "one at the sequence end.")
            if (s - cu[n]) % C:
                raise AssertionError(where + f"chunk ({s}, {e}) does not start at a multiple of {C} rows from its "
                                     f"sequence start {cu[n]}: chunks restart at every sequence start.")
        count = [0] * cu[-1]
        for s, e in got:
            for r in range(s, e):
                count[r] += 1
        missed = [r for r, c in enumerate(count) if c == 0]
        if missed:
            raise AssertionError(where + f"rows {missed[0]}..{missed[-1]} ({len(missed)} rows) belong to no chunk: "
                                 "a sequence of L rows has ceil(L / chunk) chunks, the last one partial "
                                 "(floor drops the tail, and nobody writes those rows of o).")
        twice = [r for r, c in enumerate(count) if c > 1]
        if twice:
            raise AssertionError(where + f"rows from {twice[0]} belong to two chunks: chunks must not overlap.")
        raise AssertionError(where + f"the chunks are right but not in order: expected {ref}, got {got}")


# Exercise 4: the state carried from chunk to chunk -------------------------------------------------

def _prepare_one_head(k, v, g, beta, cu_seqlens, chunk):
    """In-chunk G (cumulative log decay), w and u of one head (fp32 torch), chunk by chunk."""
    T = k.shape[0]
    G, w, u = torch.empty(T), torch.empty(T, k.shape[1]), torch.empty(T, v.shape[1])   # every chunk's rows
    for s, e in solution_chunk_spans(cu_seqlens, chunk):
        Gc = g[s:e].cumsum(0)
        A = solution_ut_transform(k[s:e], beta[s:e], Gc)
        G[s:e], w[s:e], u[s:e] = Gc, A @ ((beta[s:e] * Gc.exp())[:, None] * k[s:e]), A @ (beta[s:e, None] * v[s:e])
    return G, w, u


def _state_pass_torch(k, w, u, G, h0, cu_seqlens, chunk, *, variant=None):
    """The state pass of one head; ``variant`` names a plausible mistake (for the grader's messages)."""
    T, V = u.shape
    v_new = torch.empty(T, V)     # every chunk writes its rows
    finals = []
    h = None
    for n, (bos, eos) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:])):
        h = h0[n].clone() if variant != "carry" or h is None else h
        for s in range(bos, eos, chunk):
            e = min(s + chunk, eos)
            v_new[s:e] = u[s:e] - w[s:e] @ h
            last = {"batch_end": min(s + chunk, T) - 1, "first": s}.get(variant, e - 1)
            gl = G[last]
            dec = (gl - G[s:e]).exp() if variant != "no_weights" else torch.ones(e - s)
            h = h * gl.exp() + (k[s:e] * dec[:, None]).T @ v_new[s:e]
        finals.append(h)
    return v_new, torch.stack(finals)


def solution_state_pass(k, w, u, G, h0, cu_seqlens, chunk):
    """Exercise 4, plain solution (one head): per sequence, start from h0[n]; per chunk [s, e),
    v' = u - w h, then h <- exp(G_C) h + (K * exp(G_C - G))^T v' with G_C = G[e - 1], the cumulative
    decay at the chunk's LAST VALID row (e is cut at the sequence end)."""
    v_new = torch.empty_like(u)          # every chunk of every sequence writes its rows below
    finals = []
    for n in range(len(cu_seqlens) - 1):
        bos, eos = cu_seqlens[n], cu_seqlens[n + 1]
        h = h0[n].clone()
        for s in range(bos, eos, chunk):
            e = min(s + chunk, eos)
            v_new[s:e] = u[s:e] - w[s:e] @ h
            G_C = G[e - 1]
            h = h * G_C.exp() + (k[s:e] * (G_C - G[s:e]).exp()[:, None]).T @ v_new[s:e]
        finals.append(h)
    return v_new, torch.stack(finals)


def check_state_pass(fn) -> None:
    """Grader of exercise 4: ``fn(k [T, K], w [T, K], u [T, V], G [T], h0 [N, K, V], cu_seqlens, chunk)
    -> (v_new [T, V], ht [N, K, V])`` for one head. Graded with chunk = 16 on T = 63 (a partial last
    chunk), T = 1, and a variable-length batch with an empty sequence, against the fp32 recurrence."""
    cases = [[0, 63], [0, 1], [0, 5, 37, 37, 64, 100]]
    C, K, V = 16, 16, 8
    for cu in cases:
        T, N = cu[-1], len(cu) - 1
        x = make_inputs(1, T, 1, K, V=V, gate="mixed", seed=T)
        k, v, g, beta = x["k"][0, :, 0].cpu(), x["v"][0, :, 0].cpu(), x["g"][0, :, 0].cpu(), x["beta"][0, :, 0].cpu()
        h0 = torch.randn(N, K, V, generator=torch.Generator().manual_seed(N)) * 0.5
        G, w, u = _prepare_one_head(k, v, g, beta, cu, C)
        ref_v, ref_h = solution_state_pass(k, w, u, G, h0, cu, C)
        where = f"cu_seqlens = {cu}, chunk = {C}: "
        with poisoned_allocations("nan"):
            out = _call_learner(fn, k, w, u, G, h0.clone(), list(cu), C, what="your state pass",
                                shapes=f"k, w [T, K] = [{T}, {K}], u [T, V] = [{T}, {V}], G [T], "
                                       f"h0 [N, K, V] = [{N}, {K}, {V}], cu_seqlens = {cu}, chunk = {C}")
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise AssertionError("return the pair (v_new [T, V], final states [N, K, V])")
        vn, ht = out
        if not (isinstance(vn, torch.Tensor) and isinstance(ht, torch.Tensor)):
            raise AssertionError("return the pair (v_new, final states) as two tensors")
        if tuple(vn.shape) != (T, V) or tuple(ht.shape) != (N, K, V):
            raise AssertionError(where + f"v_new must be [T, V] = [{T}, {V}] and the final states [N, K, V] = "
                                 f"[{N}, {K}, {V}], got {list(vn.shape)} and {list(ht.shape)}")
        vn, ht = vn.float(), ht.float()
        if torch.isnan(vn).any():
            r = torch.isnan(vn).any(1).nonzero().flatten().tolist()
            raise AssertionError(where + f"rows {r[:6]} of v_new were never written (poison left): every row of "
                                 "every chunk, the partial last chunk included, gets v' = u - w h.")
        if _rel(vn, ref_v) < 1e-4 and _rel(ht, ref_h) < 1e-4:
            continue
        for variant, msg in (
                ("carry", "the state leaked from one sequence into the next: at every cu_seqlens offset the state "
                          "restarts from that sequence's h0[n]."),
                ("batch_end", "the last chunk of a sequence ends at the SEQUENCE end, not 16 rows later: G_C is the "
                              "cumulative decay at the chunk's last valid row, G[min(s + chunk, eos) - 1], never "
                              "a row of the next sequence."),
                ("first", "G_C is the cumulative decay at the chunk's LAST row (the state leaves the chunk after "
                          "its last token), not its first."),
                ("no_weights", "each key row carries the decay still to come before the chunk ends: (K * exp(G_C - "
                               "G))^T v', not K^T v'.")):
            wv, wh = _state_pass_torch(k, w, u, G, h0, cu, C, variant=variant)
            if _rel(vn, wv) < 1e-4 and _rel(ht, wh) < 1e-4:
                raise AssertionError(where + msg)
        for n in range(N):
            for s, e in solution_chunk_spans(cu[n:n + 2], C):
                if _rel(vn[s:e], ref_v[s:e]) > 1e-4:
                    first = s == cu[n]
                    raise AssertionError(
                        where + f"v' is wrong from rows {s}..{e - 1} (sequence {n}, "
                        + ("its first chunk: the state there is h0[n], nothing carried from before)" if first else
                           "not its first chunk: the state handed over by the previous chunk is wrong: h <- "
                           "exp(G_C) h + (K * exp(G_C - G))^T v', G_C at the previous chunk's last row)"))
            if _rel(ht[n], ref_h[n]) > 1e-4:
                raise AssertionError(where + f"v' is right but the final state of sequence {n} is wrong"
                                     + (" (an empty sequence hands back h0[n] unchanged)" if cu[n] == cu[n + 1] else
                                        ": apply the update after the LAST chunk too, the partial one included, "
                                        "with G_C = G[eos - 1]."))
        raise AssertionError(where + "v' and the final states differ from the reference.")


# Exercise 5: two segments composed ---------------------------------------------------------------

def segment_map(x: dict, s: int, e: int):
    """(M [K, K], B [K, V]) of tokens [s, e) of the one head of ``x`` (make_inputs with B = H = HV = 1):
    the recurrence run from [0 | I_K] with values [v, 0_K] ends in [B | M], the launcher's trick."""
    K, V = x["k"].shape[-1], x["v"].shape[-1]
    part = {n: t[:, s:e].contiguous() for n, t in x.items() if n != "initial_state"}
    part["v"] = torch.nn.functional.pad(part["v"], (0, K))
    start = torch.cat([torch.zeros(K, V), torch.eye(K)], dim=1).to(part["v"].device)[None, None]
    _, bm = naive_recurrent_gated_delta_rule(**part, initial_state=start, output_final_state=True)
    return bm[0, 0, :, V:].cpu(), bm[0, 0, :, :V].cpu()


def solution_compose_segments(M1, B1, M2, B2, S0):
    """Exercise 5, plain solution: segment 1 then segment 2, S -> M2 (M1 S + B1) + B2, so
    M = M2 M1 and B = M2 B1 + B2 (B1 is carried through segment 2 like any state); then M S0 + B."""
    M = M2 @ M1
    B = M2 @ B1 + B2
    return M, B, M @ S0 + B


def _compose_hint(got, ref, wrongs) -> str | None:
    """The message of the first plausible wrong answer that ``got`` matches."""
    for wrong, msg in wrongs:
        if tuple(got.shape) == tuple(wrong.shape) and _rel(got, wrong) < 1e-5:
            return msg
    return None


def check_compose_segments(fn) -> None:
    """Grader of exercise 5: ``fn(M1 [K, K], B1 [K, V], M2, B2, S0 [K, V]) -> (M, B, S_end)`` with
    (M1, B1), (M2, B2) the maps of two consecutive segments of a real head (:func:`segment_map`), segment 1
    first. Graded with K != V on two inputs; S_end against the recurrence run over both segments from S0."""
    for K, V, cut, T in ((8, 4, 7, 16), (16, 8, 20, 33)):
        x = make_inputs(1, T, 1, K, V=V, gate="mixed", seed=K + T, device="cpu")
        (M1, B1), (M2, B2) = segment_map(x, 0, cut), segment_map(x, cut, T)
        S0 = torch.randn(K, V, generator=torch.Generator().manual_seed(T))
        _, end = naive_recurrent_gated_delta_rule(**x, initial_state=S0[None, None], output_final_state=True)
        end = end[0, 0]
        where = f"[K={K}, V={V}] "
        out = _call_learner(fn, M1.clone(), B1.clone(), M2.clone(), B2.clone(), S0.clone(), what="your composition",
                            shapes=f"M1, M2 [K, K] = [{K}, {K}]; B1, B2, S0 [K, V] = [{K}, {V}]")
        if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, torch.Tensor) for t in out)):
            raise AssertionError("return the three tensors (M, B, S_end)")
        M, B, S = (t.float() for t in out)
        if tuple(M.shape) != (K, K) or tuple(B.shape) != (K, V) or tuple(S.shape) != (K, V):
            raise AssertionError(where + f"M is [K, K] = [{K}, {K}]; B and S_end are [K, V] = [{K}, {V}] like the state; "
                                 f"got {list(M.shape)}, {list(B.shape)}, {list(S.shape)} (a transpose turns [K, V] "
                                 "into [V, K]: the matrices act on the state's K rows, from the left)")
        rM, rB, _ = solution_compose_segments(M1, B1, M2, B2, S0)
        if _rel(M, rM) > 1e-5:
            raise AssertionError(where + (_compose_hint(M, rM, [
                (M1 @ M2, "M is in the wrong order: segment 1 acts FIRST, so its matrix stands on the RIGHT, "
                          "M = M2 M1 (S -> M2 (M1 S + B1) + B2). Matrix products do not commute."),
                (M1.T @ M2.T, "M is transposed: (M2 M1)^T = M1^T M2^T. The state is [K, V] and each M acts on its K "
                              "rows from the left: M = M2 @ M1, no transposes."),
                (M2.T @ M1.T, "M holds transposes: the maps are S -> M S + B with M on the left, M = M2 @ M1.")])
                or "M is wrong: the two segments together map S -> M2 (M1 S + B1) + B2, so M = M2 M1."))
        if _rel(B, rB) > 1e-5:
            raise AssertionError(where + (_compose_hint(B, rB, [
                (B1 + B2, "B is B1 + B2: B1 is the state segment 1 leaves behind, and segment 2 acts on it like on "
                          "any state (decays it and corrects it by its keys): B = M2 B1 + B2."),
                (M2 @ B2 + B1, "B1 and B2 are swapped: B2 is added after segment 2's matrix; B1 enters first and goes "
                               "through M2: B = M2 B1 + B2."),
                (M1 @ B2 + B1, "B is composed in the wrong order (segment 2 first): segment 1 acts first, so "
                               "B = M2 B1 + B2."),
                (M2.T @ B1 + B2, "B uses M2 transposed: M2 acts on the K rows of B1 from the left, B = M2 @ B1 + B2.")])
                or "B is wrong: the two segments together map S -> M2 (M1 S + B1) + B2, so B = M2 B1 + B2."))
        if _rel(S, end) > 1e-4:
            raise AssertionError(where + (_compose_hint(S, end, [
                (rM @ S0, "S_end misses B: applying (M, B) to a start state is M S0 + B (B is what the "
                          "segments' own tokens write, from a zero start)."),
                (rM.T @ S0 + rB, "S_end uses M transposed: M S0 + B, M on the left of the [K, V] state."),
                (S0 + rB, "S_end = S0 + B forgets M: the start state decays and is corrected too, M S0 + B.")])
                or f"S_end is off the recurrence over both segments by {_rel(S, end):.1e}: S_end = M S0 + B."))
