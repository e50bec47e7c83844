"""Found out of sample (decode scratch buffers, a cached prefix): an ``empty`` buffer kept in an
attribute is read by code the audit does not follow, so a reverse risk on it is where the trail is
lost (low); an alias of exactly the written slice reads only what was written."""
import torch

HEADROOM = 256


class Decoder:
    def step(self, q, keys, first):
        if first:
            # scratch with headroom: later calls use only [:cached] of it
            self.scores = torch.empty(q.shape[0], keys.shape[0] + HEADROOM)
        cached = keys.shape[0]
        torch.matmul(q, keys.T, out=self.scores[:, :cached])
        return self.scores[:, :cached].softmax(-1)


def tail_of_prefix(hidden, prefix_len, total, blocks):
    full = torch.empty(hidden.shape[0], total, hidden.shape[2])
    full[:, prefix_len:] = hidden[:, hidden.shape[1] - (total - prefix_len):]
    joint = full[:, prefix_len:]
    for block in blocks:
        joint = block(joint)
    return joint


def padded_heads(q, heads):
    out = q.new_empty(q.shape[0], heads, q.shape[2])
    out[:, :q.shape[1]] = q
    return out


def aligned_scales(scales, keys):
    # the kernel reads the storage up to a multiple of 4: the view's padding is read
    aligned = torch.empty((keys + 3) // 4 * 4, dtype=scales.dtype)
    aligned[:keys] = scales
    scales = aligned[:keys]
    return scales
