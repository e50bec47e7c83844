"""Class 1: a keyword named out= is not always a whole write."""
from dataclasses import dataclass

import torch

from .sample_kernels import scatter_add_kernel


@dataclass
class Packed:
    out: torch.Tensor
    scale: float


def into_a_dataclass(x):
    buf = torch.zeros_like(x)
    return Packed(out=buf, scale=1.0)


def field_replacement(params, x):
    buf = torch.zeros_like(x)
    return params.clone(out=buf)


def grouped_gemm(x, idx, out=None):
    """Rows of x added into out at idx (the epilogue scatter-adds)."""
    scatter_add_kernel[(x.shape[0],)](x, idx, out, x.shape[1], BLOCK=64)
    return out


def gemm_with_accumulating_epilogue(x, idx, n):
    out = torch.zeros(n, x.shape[1])
    grouped_gemm(x, idx, out=out)
    return out


def library_gemm_accumulate(a, b, c):
    out = torch.zeros(a.shape[0], b.shape[1])
    extlib.gemm(a, b, out=out, accumulate=True)
    return out


def library_gemm(a, b):
    out = torch.zeros(a.shape[0], b.shape[1])
    extlib.gemm(a, b, out=out)
    return out


def torch_out(a, b):
    out = torch.zeros(a.shape[0], b.shape[1])
    torch.matmul(a, b, out=out)
    return out
