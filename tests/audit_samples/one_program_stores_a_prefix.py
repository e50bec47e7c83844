"""Found out of sample (11th check, Triton-distributed test_compile_aot.py:167: ``B = torch.zeros(128)``
written by ``test_aot_kernel[(1,)](A=A, B=B)``, whose only store is ``tl.store(B + tl.arange(0, 64), x)``):
one program stores 64 elements of 128, so the other 64 keep their zeros: not high (low, naming the
stored extent and the size). The guards: the same kernel on a buffer of 64, a kernel whose one program
stores all 128, and a kernel that strides by its program id on a real grid stay high."""
import torch
import triton
import triton.language as tl


@triton.jit
def copy_64(A, B):
    x = tl.load(A + tl.arange(0, 64))
    tl.store(B + tl.arange(0, 64), x)


@triton.jit
def copy_128_in_two(A, B):
    x = tl.load(A + tl.arange(0, 64))
    tl.store(B + tl.arange(0, 64), x)
    tl.store(B + 64 + tl.arange(0, 64), x)


@triton.jit
def copy_blocks(A, B, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(B + offs, tl.load(A + offs))


def one_program_stores_half():
    A = torch.randn(128, dtype=torch.bfloat16)
    B = torch.zeros(128, dtype=torch.bfloat16)
    copy_64[(1, )](A=A, B=B)
    return B


def one_program_stores_half_positionally():
    A = torch.randn(128, dtype=torch.bfloat16)
    B = torch.zeros(128, dtype=torch.bfloat16)
    grid = (1, 1, 1)
    copy_64[grid](A, B)
    return B


def one_program_stores_all_64():
    A = torch.randn(64, dtype=torch.bfloat16)
    B = torch.zeros(64, dtype=torch.bfloat16)
    copy_64[(1, )](A=A, B=B)
    return B


def one_program_stores_all_128():
    A = torch.randn(128, dtype=torch.bfloat16)
    B = torch.zeros(128, dtype=torch.bfloat16)
    copy_128_in_two[(1, )](A, B)
    return B


def blocks_over_the_grid():
    A = torch.randn(128, dtype=torch.bfloat16)
    B = torch.zeros(128, dtype=torch.bfloat16)
    copy_blocks[(2, )](A, B, BLOCK=64)
    return B
