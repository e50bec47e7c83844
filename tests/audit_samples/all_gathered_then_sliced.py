"""A padded buffer all-gathered into a list whose copies are read only in part, written after the 11th
and 14th out-of-sample checks (Triton-distributed test_ep_a2a.py: ``pad = empty([M, k])`` written on
``[:n]``, all-gathered into ``[empty_like(pad) for _ in ranks]``, each copy then read as
``t[:lens[i]]``). The collective was taken as a consumer the function cannot see (medium), but it copies
the buffer into a list made here whose every later use reads a part: low, naming the reads. The true
counterparts stay medium: the copies concatenated whole, and an output list that comes from the caller."""
import torch
import torch.distributed as dist


def gather_rows(rows, max_rows, lens):
    pad = torch.empty([max_rows, rows.shape[1]], dtype=rows.dtype, device=rows.device)
    pad[:rows.shape[0]] = rows
    copies = [torch.empty_like(pad) for _ in range(len(lens))]
    dist.all_gather(copies, pad)
    return torch.cat([t[:lens[r]] for r, t in enumerate(copies)])


def gather_rows_in_a_loop(rows, max_rows, lens):
    pad = torch.empty([max_rows, rows.shape[1]], dtype=rows.dtype, device=rows.device)
    pad[:rows.shape[0]] = rows
    copies = [torch.empty_like(pad), torch.empty_like(pad)]
    dist.all_gather(copies, pad)
    total = 0
    for c in copies:
        total = total + c[:lens[0]].sum()
    return total + copies[1][:lens[1]].sum()


def gather_rows_whole(rows, max_rows, world):
    pad = torch.empty([max_rows, rows.shape[1]], dtype=rows.dtype, device=rows.device)
    pad[:rows.shape[0]] = rows
    copies = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(copies, pad)
    return torch.cat(copies)


def gather_rows_into(copies, rows, max_rows):
    pad = torch.empty([max_rows, rows.shape[1]], dtype=rows.dtype, device=rows.device)
    pad[:rows.shape[0]] = rows
    dist.all_gather(copies, pad)
    return [c[:1] for c in copies]
