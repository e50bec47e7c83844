"""True reverse risks the hand checks confirmed, written again in this project's words: they must stay
medium under the stricter rule (every write before the consumer straight-line and unconditional,
relative to the allocation; a part provably outside them; a consumer the function cannot see).
Query heads padded to a kernel's tier (the allocation and its write in the same branch), the sink
vector next to them, an input padded to the weight's width and handed whole to a GEMM, and a tier
chosen by a conditional expression whose every side leaves heads unwritten."""
import torch


def pad_heads_to_tier(query, sinks):
    heads = query.size(2) if query.dim() == 4 else query.size(1)
    if heads in (64, 128):
        return query, sinks
    if heads < 64:
        tier = 64
    else:
        tier = 128
    if query.dim() == 4:
        padded = torch.empty(query.size(0), query.size(1), tier, query.size(3), dtype=query.dtype)
        padded[:, :, :heads, :].copy_(query)
    else:
        padded = torch.empty(query.size(0), tier, query.size(2), dtype=query.dtype)
        padded[:, :heads, :].copy_(query)
    padded_sinks = torch.empty(tier, dtype=sinks.dtype)
    padded_sinks[:heads].copy_(sinks)
    return padded, padded_sinks


class PaddedLinear:
    def forward(self, x, gemm):
        if self.needs_padding:
            wide = torch.empty(x.shape[0], self.in_features, dtype=x.dtype)
            wide[:, :self.true_in_features] = x
            x = wide
        return gemm(x, self.weight)

    def forward_direct(self, x, gemm):
        wide = torch.empty(x.shape[0], self.in_features, dtype=x.dtype)
        wide[:, :self.true_in_features] = x
        return gemm(wide, self.weight)


def heads_to_a_chosen_tier(q, heads):
    tier = 64 if heads <= 64 else 128
    out = torch.empty(q.shape[0], tier, q.shape[2], dtype=q.dtype)
    out[:, :heads] = q
    return out
