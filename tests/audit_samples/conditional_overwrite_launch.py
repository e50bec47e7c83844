"""A kernel that loads the buffer only where it stores it and stores a select between the loaded value
and a fresh one, at rows loaded offsets pick, written after the 10th and 14th out-of-sample checks
(vllm-ascend msa_m3_triton_a5.py:740: ``idx = empty(h, n, topk)`` written on ``[..., :k]``, then a kernel
that returns early past a sequence's length, loads each slot of the row a loaded start points to and
stores ``tl.where(valid, idx, -1)``). The launch was read as adding into the gap (medium); its stores
are a conditional overwrite at places not bounded by the written part, so the gap is neither shown
unwritten nor shown read: low, naming the select. The true counterparts stay medium: the same select
bounded by the written part's own bound (``off < k``), and a select whose both sides keep the loaded
value."""
import torch
import triton
import triton.language as tl


@triton.jit
def drop_stale_slots(slot_ptr, starts, limit_ptr, width: tl.constexpr, stride_r, BLOCK_W: tl.constexpr):
    pid_q = tl.program_id(0)
    pid_s = tl.program_id(1)
    first = tl.load(starts + pid_s)
    count = tl.load(starts + pid_s + 1) - first
    if pid_q >= count:
        return
    limit = tl.load(limit_ptr + pid_s)
    cols = tl.arange(0, BLOCK_W)
    where = slot_ptr + (first + pid_q) * stride_r + cols
    inside = cols < width
    got = tl.load(where, mask=inside, other=0)
    fresh = tl.where((cols < limit) & (got >= 0), got, -1)
    tl.store(where, fresh.to(slot_ptr.dtype.element_ty), mask=inside)


def top_slots(raw, starts, limits, k, width, longest):
    n = raw.shape[0]
    slots = torch.empty(n, width, dtype=torch.int32, device=raw.device)
    slots[:, :k].copy_(raw)
    drop_stale_slots[(longest, starts.numel() - 1)](slots, starts, limits, width, slots.stride(0),
                                                   BLOCK_W=triton.next_power_of_2(width))
    return slots


@triton.jit
def drop_stale_prefix(slot_ptr, starts, limit_ptr, used, stride_r, BLOCK_W: tl.constexpr):
    pid_q = tl.program_id(0)
    first = tl.load(starts + pid_q)
    limit = tl.load(limit_ptr + pid_q)
    cols = tl.arange(0, BLOCK_W)
    where = slot_ptr + first * stride_r + cols
    got = tl.load(where, mask=cols < used, other=0)
    tl.store(where, tl.where(cols < limit, got, -1), mask=cols < used)


def top_slots_prefix_only(raw, starts, limits, k, width):
    n = raw.shape[0]
    slots = torch.empty(n, width, dtype=torch.int32, device=raw.device)
    slots[:, :k].copy_(raw)
    drop_stale_prefix[(n,)](slots, starts, limits, k, slots.stride(0), BLOCK_W=triton.next_power_of_2(width))
    return slots


@triton.jit
def bump_slots(slot_ptr, starts, width: tl.constexpr, stride_r, BLOCK_W: tl.constexpr):
    first = tl.load(starts + tl.program_id(0))
    cols = tl.arange(0, BLOCK_W)
    where = slot_ptr + first * stride_r + cols
    got = tl.load(where, mask=cols < width, other=0)
    tl.store(where, tl.where(got >= 0, got + 1, got - 1), mask=cols < width)


def top_slots_bumped(raw, starts, k, width):
    n = raw.shape[0]
    slots = torch.empty(n, width, dtype=torch.int32, device=raw.device)
    slots[:, :k].copy_(raw)
    bump_slots[(n,)](slots, starts, width, slots.stride(0), BLOCK_W=triton.next_power_of_2(width))
    return slots
