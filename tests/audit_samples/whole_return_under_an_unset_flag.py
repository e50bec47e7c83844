"""A buffer with slack after its written prefix, returned whole only under a flag, written after the
14th out-of-sample check (aiter mxfp6_fmha_pack.py:663: ``sbuf = empty(n + 64)``, ``sbuf[:n] = s``,
``if return_raw: return buf, sbuf``, else only ``sbuf[:n]`` leaves). The whole return was called a
proven gap (medium), but it runs only when the flag is true, and the flag defaults to false and no call
in the files sets it (one caller forwards its own such flag, which its caller leaves out): low, naming
the calls. The true counterparts stay medium: a caller that sets the flag, and a function that also
hands the whole buffer on after the flag's ``if``."""
import torch


def pad_rows(x, return_raw=False):
    n = x.numel()
    slack = torch.empty(n + 32, dtype=x.dtype, device=x.device)
    slack[:n] = x.reshape(-1)
    if return_raw:
        return slack
    return slack[:n].view(x.shape)


def quantise_and_pad(x, return_raw=False):
    q = (x * 4).round()
    return pad_rows(q, return_raw=return_raw)


def forward_step(x):
    y = quantise_and_pad(x)
    return y.shape[0]


def pad_cols(x, raw=False):
    n = x.numel()
    wide = torch.empty(n + 16, dtype=x.dtype, device=x.device)
    wide[:n] = x.reshape(-1)
    if raw:
        return wide
    return wide[:n]


def export_cols(x):
    w = pad_cols(x, raw=True)
    return w.sum()


def pad_then_hand_on(x, keep=False):
    n = x.numel()
    both = torch.empty(n + 8, dtype=x.dtype, device=x.device)
    both[:n] = x.reshape(-1)
    if keep:
        return both
    return both, n


def caller_of_pad_then_hand_on(x):
    y, n = pad_then_hand_on(x)
    return y[:n]
