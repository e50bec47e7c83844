"""Found out of sample (blockwise dequantization with a remainder): ``out[:full]`` and ``out[full:]``
with ``full = n - n % block`` cover ``out``; the bound's sum sorts a negative term first, which is
not a bound written negative (``x[-1]``, which counts from the end and is not read)."""
import torch


def dequant_with_tail(codes, scales, n, block):
    rem = n % block
    full = n - rem
    out = torch.empty(n)
    out[:full] = (codes[:full].view(-1, block) * scales[:full // block, None]).reshape(full)
    out[full:] = codes[full:] * scales[-1]
    return out


def last_from_end(x, n):
    out = torch.empty(n)
    out[:-1] = x[1:]
    return out
