"""Writes under a condition whose union still leaves part of the buffer unwritten (out of sample, 15th
check: a shape gathered into a 2**20-element buffer whose prefix is written only when a tensor is
given, the whole buffer then reduced): on every path, taken or not, that part is never written, so the
gap is proven whichever way the test goes (medium). The guards: conditional writes that together reach
every element (one per branch, or one whole write), and a size that is a call (which may be exactly the
cells written) leave the audit unable to show a gap (low)."""
import torch


def shape_into_a_fixed_buffer(tensor, device):
    buf = torch.empty(1 << 20, dtype=torch.int64, device=device)
    if tensor is not None:
        buf[: tensor.dim() + 1] = torch.tensor([tensor.dim(), *tensor.shape], device=device)
    return buf


def rows_of_a_fixed_table_under_a_test(x, n, flag):
    out = torch.empty(4096, x.shape[1])
    if flag and n > 0:
        out[:n] = x[:n]
    return out


def one_half_per_branch(x, n, first):
    out = torch.empty(2 * n, x.shape[1])
    if first:
        out[:n] = x[:n]
    else:
        out[n:] = x[:n]
    return out


def whole_under_a_test(x, n, flag):
    out = torch.empty(n, x.shape[1])
    if flag:
        out[:] = x[:n]
    return out


def _cells(kind):
    return 2 if kind == "int" else 1


def cells_of_a_size_from_a_call(kind):
    out = torch.empty(_cells(kind), dtype=torch.float32)
    out[0] = 0
    if kind == "int":
        out[1] = -1
    return out
