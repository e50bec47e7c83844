"""Found out of sample (a tensor-parallel split with an optional column): a dimension whose size is
conditional (``1 if offset >= 0 else 0``) written under the same test (``if offset >= 0: vp[..., 0] =
...``) is written whole or has no elements: no reverse risk. Any other write under a condition leaves
the audit unable to show which part stays unwritten in the cases that matter (the test may be the
very one that makes the rest empty): at most low, and the finding says which condition."""
import torch


def optional_column(x, offset, value):
    v_dim = 1 if offset >= 0 else 0
    vp = torch.empty(x.shape[0], x.shape[1], v_dim, dtype=x.dtype)
    if offset >= 0:
        vp[..., 0] = value
    return vp


def optional_column_inline(x, offset, value):
    ip = torch.empty(x.shape[0], x.shape[1], 1 if offset >= 0 else 0, dtype=torch.long)
    if offset >= 0:
        ip[..., 0] = value
    return ip


def optional_rows(x, n, keep):
    out = torch.empty(n if keep else 0, x.shape[1])
    if keep:
        out[:n] = x[:n]
    return out


def prefix_under_a_test(x, n, cap):
    out = torch.empty(cap, x.shape[1])
    if n < cap:
        out[:n] = x[:n]
    return out


def prefix_by_a_conditional_expression(x, n, cap, full):
    out = torch.empty(cap, x.shape[1])
    out[:cap if full else n] = x[:cap if full else n]
    return out


def optional_tail(x, n, extra):
    out = torch.empty(n + 1 if extra else n, x.shape[1])
    out[:n] = x[:n]
    return out
