"""A Triton kernel launched through ``torch.library.wrap_triton(kernel)[grid](...)`` (the launch torch.compile
can trace) is the kernel's launch: a whole store is a redundant fill's overwrite, a kernel that adds into the
buffer keeps the fill. Any other call that returns something to index by a grid stays a launch not followed."""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton


@triton.jit
def copy_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)


@triton.jit
def add_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(out + offs, mask=offs < n) + tl.load(x + offs, mask=offs < n), mask=offs < n)


def wrapped_copy(x, n):
    out = torch.zeros(n)
    wrap_triton(copy_kernel)[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out


def wrapped_add(x, n):
    out = torch.zeros(n)
    torch.library.wrap_triton(add_kernel)[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out


def captured_copy(x, n):
    out = torch.zeros(n)
    torch.library.capture_triton(copy_kernel)[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out


def picked_kernel(x, n, pick):
    out = torch.zeros(n)
    pick(copy_kernel)[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out
