"""The smallest allocate-then-overwrite producer: program ``pid`` writes ``out[pid*BLOCK : (pid+1)*BLOCK]``."""
import workbook.device  # noqa: F401  (sets TRITON_INTERPRET=1 on a CPU-only machine before triton.jit)
import triton
import triton.language as tl


@triton.jit
def iota_kernel(
    out,                    # *int32 [n]: output, allocated with torch.empty by the launcher
    n,                      # number of elements to write
    BLOCK: tl.constexpr,    # elements per program
):
    pid = tl.program_id(0)
    o_i = pid * BLOCK + tl.arange(0, BLOCK)   # the elements this program owns
    m_i = o_i < n                             # the last program may own fewer than BLOCK
    tl.store(out + o_i, o_i.to(tl.int32), mask=m_i)
