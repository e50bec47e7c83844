"""Uses that read only a buffer's metadata, written after the 11th out-of-sample check
(Triton-distributed test_ep_a2a: ``padded_indices = empty([M, topk])``, ``padded_indices[:n] = ...``,
then ``[torch.empty_like(padded_indices) for _ in ...]``): the prototype of ``empty_like`` was read as
the consumer of the unwritten rows (medium). ``*_like(x)``, ``x.shape``, ``x.size(0)``, ``x.dtype``,
``x.device``, ``x.numel()``, ``x.dim()``, ``x.stride(0)``, ``x.element_size()``, ``x.new_empty(..)``,
``x.data_ptr()``, ``x.is_contiguous()`` and ``len(x)`` read no element: the first real use decides. A
zero fill whose first real use is an overwrite is redundant (high); the true counterparts (a sum, an
addition, a return, a callee not in the files after the metadata uses) stay what they were."""
import torch


def prefix_then_empty_like(x, m, topk):
    out = torch.empty([m, topk], dtype=torch.int32, device=x.device)
    out[:x.size(0), ] = x
    gathered = [torch.empty_like(out) for _ in range(4)]
    return gathered


def prefix_then_every_metadata_use(x, m):
    out = torch.empty(m, 8, dtype=x.dtype, device=x.device)
    out[:x.shape[0]] = x
    z = torch.zeros_like(out)
    o = torch.ones_like(input=out)
    f = torch.full_like(out, 2.0)
    r = torch.rand_like(out) + torch.randn_like(out)
    e = out.new_empty(3) + out.new_zeros(3) + out.new_full((3,), 1.0)
    meta = (out.shape, out.size(0), out.dtype, out.device, out.numel(), out.dim(), out.stride(0),
            out.element_size(), out.data_ptr(), out.is_contiguous(), len(out))
    return z, o, f, r, e, meta


def zeros_then_metadata_then_copy(x):
    buf = torch.zeros(x.shape[0], 16, dtype=x.dtype, device=x.device)
    scratch = torch.empty_like(buf)
    n = buf.numel() + buf.size(1) + len(buf)
    spare = buf.new_zeros(n)
    buf.copy_(x)
    return buf, scratch, spare


def prefix_then_empty_like_then_sum(x, m):
    out = torch.empty(m, 8, dtype=x.dtype, device=x.device)
    out[:x.shape[0]] = x
    like = torch.empty_like(out)
    return out.sum(), like


def prefix_then_empty_like_then_add(x, m):
    out = torch.empty(m, 8, dtype=x.dtype, device=x.device)
    out[:x.shape[0]] = x
    like = torch.empty_like(out)
    return out + 1, like


def prefix_then_shape_then_return(x, m):
    out = torch.empty(m, 8, dtype=x.dtype, device=x.device)
    out[:x.shape[0]] = x
    rows = out.shape[0] + out.size(1)
    print(rows)
    return out


def zeros_then_metadata_then_sum(x):
    buf = torch.zeros(x.shape[0], 16, dtype=x.dtype, device=x.device)
    scratch = torch.empty_like(buf)
    total = buf.sum()
    buf.copy_(x)
    return buf, scratch, total


def zeros_then_metadata_then_unknown_callee(x):
    buf = torch.zeros(x.shape[0], 16, dtype=x.dtype, device=x.device)
    scratch = torch.zeros_like(buf)
    fill_from_somewhere(buf, x)
    buf.copy_(x)
    return buf, scratch
