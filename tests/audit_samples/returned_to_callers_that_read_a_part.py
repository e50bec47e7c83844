"""A partly written `empty` buffer returned whole to callers that read only parts of it (written
after the 10th out-of-sample check, gpt-fast eval.py:75, and the 9th, aiter mxfp6_fmha_pack.py:663:
a padded prompt whose tail is never written, read by every caller through `index_select` over the
prompt's positions; 64 slack bytes after a copied prefix, read by every caller through the prefix).
Where every caller in the files reads the returned buffer only through a slice, an index, `narrow` or
`index_select` (or its metadata), no caller is shown to read the unwritten part: low. A caller that
uses it whole (arithmetic, passed whole, returned again), or no caller in the files: medium."""
import torch


# ---- low: every caller reads only a part --------------------------------------------------------

def padded_prompt(prompt, extra):
    T = prompt.size(0)
    empty = torch.empty(T + extra, dtype=prompt.dtype, device=prompt.device)
    empty[:T] = prompt
    seq = empty
    pos = torch.arange(0, T, device=prompt.device)
    return seq, pos, T + extra


def prefill_logits(model, prompt):
    seq, pos, _ = padded_prompt(prompt, 16)
    x = seq.index_select(0, pos).view(1, -1)
    return model(x, pos)


def record_prompt(prompt, n):
    seq, pos, limit = padded_prompt(prompt, 8)
    return seq[:n], seq.narrow(0, 0, n), seq.shape, limit


def scales_with_slack(scale):
    flat = scale.reshape(-1)
    sbuf = torch.empty(flat.numel() + 64, dtype=torch.uint8, device=scale.device)
    sbuf[: flat.numel()] = flat
    return sbuf


def scale_view(scale, b, sk, h):
    raw = scales_with_slack(scale)
    return raw[: b * sk * h * 4].view(b, sk, h, 4)


# ---- medium: a caller uses it whole, or none is in the files ------------------------------------

def padded_tokens(prompt, extra):
    T = prompt.size(0)
    buf = torch.empty(T + extra, dtype=prompt.dtype, device=prompt.device)
    buf[:T] = prompt
    return buf


def first_tokens(prompt):
    toks = padded_tokens(prompt, 4)
    return toks[: prompt.size(0)]


def token_total(prompt):
    toks = padded_tokens(prompt, 4)
    return toks.sum()                      # arithmetic on the whole buffer: the tail is read


def padded_ids(ids, extra):
    n = ids.size(0)
    out = torch.empty(n + extra, dtype=ids.dtype, device=ids.device)
    out[:n] = ids
    return out


def embed_padded(table, ids):
    padded = padded_ids(ids, 8)
    return torch.nn.functional.embedding(padded, table)    # passed whole to another function


def padded_rows(x, extra):
    n = x.size(0)
    out = torch.empty(n + extra, x.size(1), dtype=x.dtype, device=x.device)
    out[:n] = x
    return out                             # no caller in the files
