"""Found out of sample (17th check): convolution filters turned into band matrices by copying them into an
``as_strided`` view of a zero-filled buffer (a row stride one longer than the band): the view is the band
only, the zeros off it are what the batched product reads. Guard: a copy into ``view`` (the whole buffer
under another shape) stays a whole write."""
import torch


def band_matrices(weight, T):
    BH, _, K = weight.shape
    expanded = weight.new_zeros(BH, T, T + K - 1)
    expanded.as_strided((BH, T, K), (T * (T + K - 1), T + K, 1)).copy_(weight)
    return expanded.narrow(2, K - 1, T)


def reshaped_copy(x, rows, cols):
    out = x.new_zeros(rows * cols)
    out.view(rows, cols).copy_(x)
    return out
