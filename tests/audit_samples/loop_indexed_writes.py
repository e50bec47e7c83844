"""Found out of sample (a draft model filling one token column per step): writes indexed by a loop
variable after a straight-line write. ``for i in range(s): out[:, i + 1] = ...`` covers columns
[1, s + 1); with ``out[:, 0]`` before the loop that is all of an ``empty(b, s + 1)``: no reverse risk,
though a read in the loop (``embed(out[:, i])``) comes first in the text. Tiles ``[1 + i * k:1 + (i +
1) * k]`` cover ``[1, 1 + n * k)``. A loop whose writes the audit does not bound (a ``while``, an
index it cannot place) may cover the rest, and one it reads may still be short: the gap is not
proven, so the risk is low and names the loop."""
import torch


def draft_columns(first, steps, embed, head):
    out = torch.empty(first.shape[0], steps + 1, dtype=torch.long)
    out[:, 0] = first
    for i in range(steps):
        h = embed(out[:, i])
        out[:, i + 1] = head(h).argmax(-1)
    return out


def tiles_after_a_head(x, n, block, proj):
    out = torch.empty(1 + n * block, x.shape[1])
    out[0] = x[0]
    for i in range(n):
        out[1 + i * block:1 + (i + 1) * block] = proj(out[:1], i)
    return out


def while_filled(first, steps, step):
    out = torch.empty(first.shape[0], steps + 1)
    out[:, 0] = first
    t = 0
    while t < steps:
        out[:, t + 1] = step(out[:, t])
        t += 1
    return out


def columns_one_short(first, parts, mix):
    out = torch.empty(first.shape[0], len(parts) + 2)
    out[:, 0] = first
    for j, p in enumerate(parts):
        out[:, j + 1] = mix(out[:, j], p)
    return out


def rows_only_in_a_loop(xs, n):
    out = torch.empty(n + 1, xs.shape[1])
    for i in range(n):
        out[i] = xs[i] * 2
    return out
