"""Found out of sample (11th check, Triton-distributed: a block table of ``triton.cdiv(M, BLOCK_M) +
num_experts`` rows, pre-zeroed, written by a persistent kernel on a grid of ``(num_sms,)``): the grid
names no count at all, so the reason must not say it is "bounded by the real count"; it is only not
shown to reach the rounded size. A grid that does name the real count keeps that wording."""
import torch
import triton
import triton.language as tl


@triton.jit
def persistent_rows_kernel(x, s, M, N, BLOCK_N: tl.constexpr):
    # each program walks the rows m = pid, pid + P, ... below M; the padding rows are never stored
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    o = tl.arange(0, BLOCK_N)
    for m in range(pid, M, n_prog):
        v = tl.load(x + m * N + o, mask=o < N, other=0.0)
        tl.store(s + m, tl.max(tl.abs(v), axis=0))


def block_table_on_sms(x, num_experts, num_sms):
    M, N = x.shape
    rows = triton.cdiv(M, 64) + num_experts
    s = torch.zeros(rows, dtype=torch.float32, device=x.device)
    grid = (num_sms,)
    persistent_rows_kernel[grid](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s


def block_table_on_real_rows(x, num_experts):
    M, N = x.shape
    rows = triton.cdiv(M, 64) + num_experts
    s = torch.zeros(rows, dtype=torch.float32, device=x.device)
    persistent_rows_kernel[(M,)](x, s, M, N, BLOCK_N=triton.next_power_of_2(N))
    return s
