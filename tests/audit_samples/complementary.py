"""Class 5: writes whose slices together cover the buffer, and writes that leave a part unwritten."""
import torch


def two_columns(a, b):
    out = torch.empty(a.shape[0], 2)
    out[:, 0] = a
    out[:, 1] = b
    return out


def even_odd(a, b):
    out = torch.empty(2 * a.shape[0], a.shape[1])
    out[0::2] = a
    out[1::2] = b
    return out


def last_dim_halves(a, b, h):
    out = torch.empty(a.shape[0], a.shape[1], 2 * h)
    out[..., :h] = a
    out[..., h:] = b
    return out


def first_row_then_rest(x):
    out = torch.empty(x.shape[0] + 1, x.shape[1])
    out[0] = 0
    out[1:] = x
    return out


def tuple_shaped(x, n):
    out = torch.empty((n, x.shape[1]), dtype=x.dtype)
    out[:n] = x
    return out


def three_parts(a, b, c, n, m):
    out = torch.empty(n + m + 1, 4)
    out[:n] = a
    out[n:n + m] = b
    out[n + m:] = c
    return out


def zeros_two_columns(a, b):
    out = torch.zeros(a.shape[0], 2)
    out[:, 0] = a
    out[:, 1] = b
    return out


def column_never_written(a, b):
    out = torch.empty(a.shape[0], 3)
    out[:, 0] = a
    out[:, 1] = b
    return out


def padded_rows_returned(x, w, num_tokens):
    out = torch.empty(x.shape[0], w.shape[1])
    out[:num_tokens] = x[:num_tokens] @ w
    return out


def padded_rows_trimmed(x, w, num_tokens):
    out = torch.empty(x.shape[0], w.shape[1])
    out[:num_tokens] = x[:num_tokens] @ w
    return out[:num_tokens]


def padded_rows_dropped(x, w, num_tokens):
    out = torch.empty(x.shape[0], w.shape[1])
    out[:num_tokens] = x[:num_tokens] @ w
    total = out[:num_tokens].sum()
    out = None
    return total


def padded_rows_passed_on(x, w, num_tokens, consumer):
    out = torch.empty(x.shape[0], w.shape[1])
    out[:num_tokens] = x[:num_tokens] @ w
    consumer(out)


def per_branch_columns(meta, q):
    out = torch.empty(meta.shape[0], 2 * q)
    if q == 2:
        out[:, 0] = meta & 1
        out[:, 1] = meta >> 1
        out[:, 2] = meta >> 2
        out[:, 3] = meta >> 3
    elif q == 1:
        out[:, 0] = meta & 1
        out[:, 1] = meta >> 1
    return out


def per_branch_short(meta, q):
    out = torch.empty(meta.shape[0], 2 * q)
    if q == 2:
        out[:, 0] = meta & 1
        out[:, 1] = meta >> 1
        out[:, 2] = meta >> 2
    return out


def through_named_sizes(reqs_a, reqs_b, la, lb):
    n_a, n_b = len(reqs_a), len(reqs_b)
    reqs = reqs_a + reqs_b
    out = torch.empty((len(reqs), la.shape[1]))
    out[0:n_a, :].copy_(la[:n_a])
    out[n_a:n_a + n_b, :].copy_(lb[:n_b])
    return out


def total_named(a, b):
    n, m = a.shape[0], b.shape[0]
    total = n + m
    out = torch.empty(total, a.shape[1])
    out[:n] = a
    out[n:n + m] = b
    return out


def padding_zeroed(x, n):
    out = torch.empty(x.shape[0] + 8, x.shape[1])
    out[:n] = x[:n]
    out[n:] = 0
    return out


def index_sets(x, ids_a, ids_b):
    """Columns picked by two index tensors (a mask and its complement, say): the audit cannot tell
    whether they cover the buffer, so the risk is low, never medium."""
    out = torch.empty(x.shape[0], x.shape[1])
    out[:, ids_a] = x[:, ids_a]
    out[:, ids_b] = 2 * x[:, ids_b]
    return out
