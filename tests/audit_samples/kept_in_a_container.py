"""Found out of sample (a KV cache built at prefill): an ``empty`` buffer written on a prefix and then
stored into a container that lives in an attribute or at module level (``ctx.caches[i] = [k, v, n]``,
``self.pages[slot] = (k, v)``, ``self._store["k"] = k``, ``self.entry = (k, v)``, ``_TABLES[key] =
...``, ``self.entries.append(...)``) is read later by code the audit does not follow (readers that take
only the written prefix, say): the trail is lost there, so the reverse risk is low and says where. A
buffer placed in a local container that is returned is still handed to a consumer the function cannot
see (medium)."""
import torch

_TABLES = {}


class CacheContext:
    caches = {}


def prefill_into_a_class_table(layer_id, k, v, capacity):
    kv_len = k.shape[1]
    k_buf = torch.empty(k.shape[0], capacity, k.shape[2], dtype=k.dtype)
    v_buf = torch.empty(v.shape[0], capacity, v.shape[2], dtype=v.dtype)
    k_buf[:, :kv_len] = k
    v_buf[:, :kv_len] = v
    CacheContext.caches[layer_id] = [k_buf, v_buf, kv_len]


class PagedStore:
    def fill_slot(self, slot, k, capacity):
        keys = torch.empty(capacity, k.shape[1])
        keys[:k.shape[0]] = k
        self.pages[slot] = (keys, k.shape[0])

    def fill_named(self, k, capacity):
        keys = torch.empty(capacity, k.shape[1])
        keys[:k.shape[0]] = k
        self._store["k"] = keys

    def fill_entry(self, k, capacity):
        keys = torch.empty(capacity, k.shape[1])
        keys[:k.shape[0]] = k
        self.entry = (keys, k.shape[0])

    def fill_appended(self, k, capacity):
        keys = torch.empty(capacity, k.shape[1])
        keys[:k.shape[0]] = k
        self.entries.append((keys, k.shape[0]))


def fill_module_table(key, k, capacity):
    keys = torch.empty(capacity, k.shape[1])
    keys[:k.shape[0]] = k
    _TABLES[key] = {"keys": keys, "len": k.shape[0]}


def returned_in_a_local_tuple(k, capacity):
    keys = torch.empty(capacity, k.shape[1])
    keys[:k.shape[0]] = k
    pair = (keys, k.shape[0])
    return pair
