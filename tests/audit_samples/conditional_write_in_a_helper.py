"""A cache allocated with zeros and handed to a helper that writes it only under a flag, written after
the 16th out-of-sample check (a test's key/value cache zero-filled again only when it is not marked
initialized: where the flag is set, the zeros are the cache's contents). The helper's write is
conditional, as the same ``if`` written inline is; a helper that writes unconditionally is a plain
overwrite."""
import torch


def _zero_unless_initialized(cache, initialized):
    if not initialized:
        cache.zero_()


def _load_unless_initialized(cache, src, initialized):
    if not initialized:
        cache.copy_(src)


def _load(cache, src):
    cache.copy_(src)


def cache_zeroed_by_a_helper_under_a_flag(n, initialized):
    kc = torch.zeros(2, n)
    _zero_unless_initialized(kc, initialized)
    return kc


def cache_loaded_by_a_helper_under_a_flag(n, src, initialized):
    vc = torch.zeros(2, n)
    _load_unless_initialized(vc, src, initialized)
    return vc


def cache_loaded_by_a_helper_always(n, src):
    vc = torch.zeros(2, n)
    _load(vc, src)
    return vc


def _load_by_mode(cache, src, mode):
    if mode == 0:
        cache.copy_(src)
    elif mode == 1:
        cache.copy_(src * 2)
    else:
        cache.copy_(src * 3)


def cache_loaded_by_a_helper_on_every_branch(n, src, mode):
    vc = torch.zeros(2, n)
    _load_by_mode(vc, src, mode)   # every branch, an else included, writes it: no test skips the write
    return vc
