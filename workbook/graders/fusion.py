"""Notebook 06's exercise grader and its reference solution.

Exercise 1: return what you reduce. The learner writes the attention step of a decoder layer in the
return style, ``step(block, x, num_tokens)`` (``block(h)``: this rank's attention block with its
row-parallel out projection, ``x [T_pad, D]``: the padded batch, of which the first ``num_tokens`` rows
are real), and predicts the N that the fusion pass logs (``Replaced N patterns``) for a decoder of
:data:`EXERCISE_LAYERS` with its MLP sharded (:func:`check_return_step`, :func:`solution_return_step`,
:data:`SOLUTION_PREDICTION`).

The grader first calls the step on a small bf16 batch under a dispatch spy (:class:`_AllReduceSpy`):
one tensor of ``x``'s shape and dtype, one ``workbook::all_reduce`` of the block's output. Then it
compiles :class:`_StepDecoder` (the mini decoder of :mod:`workbook.fusion` with the learner's step in
its attention sites) with Inductor's graph passes only (``compile_decoder(..., codegen=False)``: the
same post-grad graph and the same pass, no kernels generated: fast on a CPU) and reads the pass's
count; the real rows must equal the reference decoder's. It raises ``AssertionError`` with a message
that teaches (notebooks call it through :func:`workbook.check.grade`).
"""
from __future__ import annotations

import warnings
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import fusion as fu
from ..check import rel_err
from ..device import DEVICE

__all__ = ["EXERCISE_LAYERS", "SOLUTION_PREDICTION", "exercise_config", "solution_return_step",
           "check_return_step"]

#: The decoder whose pass log the learner predicts: three layers, the MLP sharded over the ranks
EXERCISE_LAYERS = ("linear", "linear", "full")
#: What the pass logs for it in the return style: one site per attention block, one per sharded MLP
SOLUTION_PREDICTION = 6
_T_PAD, _NUM_TOKENS = 12, 9


def exercise_config() -> fu.DecoderConfig:
    """The decoder of the exercise: :data:`workbook.fusion.DEMO` with :data:`EXERCISE_LAYERS`, the MLP
    sharded (``shard_mlp=True``: its down projection ends in an all-reduce too) and the Gated DeltaNet
    recurrence on its pure-torch reference path (fast everywhere)."""
    return replace(fu.DEMO, layers=EXERCISE_LAYERS, shard_mlp=True, gdn_kernel="reference")


def solution_return_step(block, x: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The answer: run the block over the whole padded batch (it is causal and the padding comes last,
    so the real rows are the same) and return the all-reduce of its output; no buffer, no slice."""
    return fu.all_reduce(block(x))


class _AllReduceSpy(TorchDispatchMode):
    """Records the input of every ``workbook::all_reduce`` called inside ``with _AllReduceSpy() as spy:``."""

    def __init__(self):
        super().__init__()
        self.inputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.workbook.all_reduce.default:
            self.inputs.append(args[0].detach().clone())
        return func(*args, **(kwargs or {}))


class _StepDecoder(fu.MiniDecoder):
    """The mini decoder with ``step(block, x, num_tokens)`` at every attention site."""

    def __init__(self, cfg, weights, step):
        super().__init__(cfg, weights, "return")
        self._step = step

    def _attention(self, kind, m, x, num_tokens):
        block = self._linear_attention if kind == "linear" else self._full_attention
        return self._step(lambda h: block(m, h), x, num_tokens)


def _check_one_call(step) -> None:
    """The step on a small bf16 batch: a tensor of x's shape and dtype, the all-reduce of the block's output."""
    gen = torch.Generator().manual_seed(11)
    T, n, D = 6, 4, 16
    x = torch.randn(T, D, generator=gen).to(DEVICE, torch.bfloat16)
    w = (torch.randn(D, D, generator=gen) / D ** 0.5).to(DEVICE, torch.bfloat16)
    outputs = []

    def block(h):            # row-wise, hence causal: a stand-in for the attention block + out projection
        y = h @ w.T
        outputs.append(y.detach().clone())
        return y

    with torch.no_grad(), _AllReduceSpy() as spy:
        got = step(block, x, n)
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"return the tensor the residual add consumes, got {type(got).__name__}"
                             + (": did the function forget to `return`?" if got is None else ""))
    if tuple(got.shape) != tuple(x.shape):
        rows = ("only the real rows" if got.dim() == 2 and got.shape[0] == n else "a different shape")
        raise AssertionError(
            f"x is [T_pad, D] = {list(x.shape)} with num_tokens = {n}; your step returns {list(got.shape)}: {rows}. "
            "The residual add that follows consumes all T_pad rows, so the step must return all of them. Run the "
            "block on the whole padded batch: it is causal and the padding comes last, so the real rows come out "
            "the same, and the padding rows are read only into padding rows that nothing keeps.")
    if got.dtype != x.dtype:
        raise AssertionError(
            f"your step returns {got.dtype} for a {x.dtype} batch. Return the block's dtype: the residual add would "
            "promote the residual stream, and the pass's pattern (all_reduce -> add -> RMSNorm, traced for one "
            "dtype) would no longer match the graph.")
    if not spy.inputs:
        raise AssertionError(
            "your step never calls fu.all_reduce. The out projection is row-parallel: each rank holds a partial "
            "sum, and the all-reduce adds them up. With one rank it is the identity, so the numbers cannot show "
            "the omission; with two ranks every real row would be wrong, and the pass, which matches all_reduce "
            "-> add -> RMSNorm, would find nothing to fuse.")
    if len(spy.inputs) > 1:
        raise AssertionError(
            f"your step calls fu.all_reduce {len(spy.inputs)} times; call it once. With two ranks a second "
            "all-reduce adds the already-summed result again (twice the right value).")
    red = spy.inputs[0]
    if not any(o.shape == red.shape and torch.equal(o, red) for o in outputs):
        raise AssertionError(
            "your fu.all_reduce does not reduce the block's output. Reduce what the row-parallel out projection "
            "produces (the block's output, a partial sum on each rank), not its input: x is already the same "
            "on every rank.")


def _chain_breakers(graph) -> list[str]:
    """Ops that consume an all_reduce's result in ``graph`` other than the residual add."""
    out = set()
    for node in graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "").startswith("all_reduce"):
            for user in node.users:
                name = getattr(user.target, "__name__", str(user.target)).split(".")[0]
                if name != "add":
                    out.add(name)
    return sorted(out)


_BREAKER_WHY = {
    "slice_scatter": "slice_scatter is the slice write out[:num_tokens] = y, functionalised: a new T_pad-row tensor "
                     "built from the buffer and y",
    "copy_": "copy_ writes the result back into a buffer the graph was handed",
    "constant_pad_nd": "constant_pad_nd pads the real rows up to T_pad: the same partial write in another form",
}


def _breaker_note(breakers: list[str]) -> str:
    if not breakers:
        return ("Some attention site does not end in all_reduce -> add: return the all-reduce of the block's "
                "output itself.")
    why = "; ".join(_BREAKER_WHY[b] for b in breakers if b in _BREAKER_WHY)
    return (f"In the post-grad graph the all-reduce's result goes into {', '.join(breakers)}, not straight into the "
            "residual add, so the chain all_reduce -> add -> RMSNorm is not there to match" + (f" ({why})" if why else "")
            + ". Return the all-reduce of the block's output over the whole padded batch, nothing after it.")


def _compiled_count(step, cfg, weights, hidden) -> tuple[int, list[str], torch.Tensor]:
    """Inductor's graph passes on the decoder with ``step``: (the pass's count, the ops between an
    all-reduce and its add, the output)."""
    fusion, before = fu.FusionPass(cfg.dtype), []
    fn = fu.compile_decoder(_StepDecoder(cfg, weights, step), fusion, before=before, codegen=False)
    with torch.no_grad(), warnings.catch_warnings():
        # the rows past num_tokens of an `empty` buffer (a wrong answer's) hold whatever memory held:
        # the interpreter may warn about overflows there, in rows that nothing keeps
        warnings.simplefilter("ignore", RuntimeWarning)
        out = fn(hidden, _NUM_TOKENS)
    return sum(fusion.counts), _chain_breakers(before[0]) if before else [], out


def _check_prediction(prediction, got: int, cfg) -> None:
    L = len(cfg.layers)
    if isinstance(prediction, bool) or not isinstance(prediction, int):
        raise AssertionError(f"your step is right. Now set my_prediction to an int, the N of 'Replaced N patterns' "
                             f"for this decoder, got {prediction!r}")
    if prediction == got:
        return
    why = {L: f"{L} counts the attention sites only. With shard_mlp=True the MLP's down projection is row-parallel "
              "too: its all-reduce is followed by the next residual add + RMSNorm (the next layer's input norm, or "
              "the final norm), one more site per layer.",
           2: "2 is the demo's count (two layers, the MLP replicated on every rank: no all-reduce in it); this "
              f"decoder has {L} layers and a sharded MLP.",
           0: "0 is the buffer style's count at the attention sites; your step returns what it reduces."}
    raise AssertionError(f"your step is right, and the pass logs 'Replaced {got} patterns'; you predicted {prediction}. "
                         + why.get(prediction, f"Count the all-reduce sites of the {L} layers: each all-reduce "
                                   "followed by a residual add and an RMSNorm is one match: one per attention "
                                   "block, and one per MLP when the MLP is sharded."))


def check_return_step(step, prediction) -> None:
    """Grader of exercise 1: ``step(block, x, num_tokens)`` returns ``all_reduce(block(x))`` over the whole
    padded batch (no buffer, no slice), so the fusion pass matches every site of the decoder of
    :func:`exercise_config`; ``prediction`` is the N that the pass then logs."""
    _check_one_call(step)
    cfg = exercise_config()
    weights = fu.make_decoder_weights(cfg, seed=3)
    hidden = torch.randn(_T_PAD, cfg.hidden, generator=torch.Generator().manual_seed(5)).to(DEVICE, cfg.dtype)
    got, breakers, out = _compiled_count(step, cfg, weights, hidden)
    sites = fu.expected_sites(cfg, "return")
    want = sites["attention"] + sites["mlp"]
    if got != want:
        raise AssertionError(
            f"the pass logs 'Replaced {got} patterns' on this decoder; the return style gives {want} "
            f"({sites['attention']} attention sites + {sites['mlp']} MLP sites). " + _breaker_note(breakers))
    with torch.no_grad():
        ref = fu.MiniDecoder(cfg, weights, "return")(hidden, _NUM_TOKENS)
    e = rel_err(out[:_NUM_TOKENS], ref[:_NUM_TOKENS])
    if not e <= 1e-5:
        raise AssertionError(f"the pass fuses every site, but the real rows differ from the reference decoder's "
                             f"(relative error {e:.1e}): return all_reduce(block(x)), nothing added or scaled.")
    _check_prediction(prediction, got, cfg)
