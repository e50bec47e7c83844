"""Found out of sample (batches concatenated, a table built in row blocks): a buffer allocated on the
first pass of a loop (``if out is None:``, ``if i == 0:``) and written a slice per pass is written in a
loop, as a buffer allocated before the loop is: no reverse risk. One allocated on every pass (under
any other if) and written once in it still is one."""
import torch


def concatenate(batches, total):
    ids = None
    start = 0
    for b in batches:
        end = start + len(b)
        if ids is None:
            ids = b.new_empty((total, 1))
        ids[start:end] = b
        start = end
    return ids


def last_window(batches, width):
    for b in batches:
        win = b.new_empty((width + 4, 1))
        win[:width] = b[:width]
    return win


def per_pass(batches, width, keep):
    for i, b in enumerate(batches):
        if keep:
            win = b.new_empty((width + 4, 1))
            win[:width] = b[:width]
            keep(win)


def first_index(batches, total):
    for i, b in enumerate(batches):
        if i == 0:
            out = b.new_empty((total, 1))
        out[i * 8:(i + 1) * 8] = b
    return out


def two_tables(n, rows, make):
    cos = sin = None
    for start in range(0, n, rows):
        c, s = make(start, rows)
        if cos is None:
            cos = torch.empty(n, c.shape[1])
            sin = torch.empty_like(cos)
        cos[start:start + rows] = c
        sin[start:start + rows] = s
    return cos, sin
