"""A partly written `empty` buffer stored into a new object's field by a constructor keyword (written
after the 14th out-of-sample check, S-LoRA infer_batch.py:155: a slot table whose first columns are
copied and whose later columns the next decode steps fill one by one, handed to the batch object that
holds it; every reader of the field takes only the columns already filled). A constructor or a field
replacement (`dataclasses.replace`) keeps the buffer in an object's field, as `self.table = buf` keeps
it in an attribute: the readers of that field are not followed, so the gap is not shown read and the
trail is lost there (low, naming the field). Handed on to a function the files do not define, or
returned whole, the buffer reaches a consumer the function cannot see: the gap stays medium."""
import dataclasses

import torch


@dataclasses.dataclass
class SlotBatch:
    ids: list
    slots: torch.Tensor
    longest: int


# ---- low: kept in an object's field ------------------------------------------------------------

def shrink_batch(batch, keep, headroom):
    longest = max(batch.lengths[i] for i in keep)
    slots = torch.empty(len(keep), batch.capacity + headroom, dtype=torch.long, device=batch.slots.device)
    slots[:, : longest - 1] = batch.slots[keep, : longest - 1]
    return SlotBatch(ids=[batch.ids[i] for i in keep], slots=slots, longest=longest)


def regrow_batch(batch, extra):
    grown = torch.empty(batch.slots.size(0), batch.slots.size(1) + extra, dtype=torch.long,
                        device=batch.slots.device)
    grown[:, : batch.slots.size(1)] = batch.slots
    return dataclasses.replace(batch, slots=grown)


# ---- medium: a consumer the function cannot see ------------------------------------------------

def shrink_and_hand_on(batch, keep, headroom, hand_on):
    longest = max(batch.lengths[i] for i in keep)
    slots = torch.empty(len(keep), batch.capacity + headroom, dtype=torch.long, device=batch.slots.device)
    slots[:, : longest - 1] = batch.slots[keep, : longest - 1]
    hand_on(slots)
    return longest


def shrink_and_return(batch, keep, headroom):
    longest = max(batch.lengths[i] for i in keep)
    slots = torch.empty(len(keep), batch.capacity + headroom, dtype=torch.long, device=batch.slots.device)
    slots[:, : longest - 1] = batch.slots[keep, : longest - 1]
    return slots
