"""TurboQuant KV cache (the ``4bit_nc`` preset) and attention over a mixed decode + prefill batch.

The quantizer (Zandieh et al. 2025, arXiv 2504.19874, MSE variant; the preset as vLLM names it):

* **Keys**: ``u = k / ||k||`` rotated by the orthonormal Hadamard matrix ``H`` (Sylvester
  construction, scaled by ``1/sqrt(D)``; symmetric, so ``H^T = H``). Each coordinate of a rotated
  unit vector follows the density of one coordinate of a uniform random unit vector in ``D``
  dimensions (:func:`coordinate_density`, the exact Beta-like law, close to N(0, 1/D)). Each is
  coded by the nearest of the ``2**bits`` Lloyd-Max centroids of that density
  (:func:`lloyd_max_centroids`, computed here by Lloyd iteration, cached). The fp16 norm is kept.
  *Norm correction* (``nc``): the centroid vector ``c`` is renormalized to unit length before the
  inverse rotation, so the dequantized key ``||k|| (c / ||c||) H`` has exactly the key's norm. The
  cache folds the correction into its one fp16 scalar per key: ``k_scale = ||k|| / ||c||`` (so a key's
  norm must stay within fp16's range, 65504; the prefill kernel also reads new keys as fp16).
* **Values**: 4-bit uniform per (token, head): ``scale = (max - min) / 15``, ``zero = min``, both
  fp16; ``code = round((v - zero) / scale)`` with the fp16-rounded scale and zero.
* A slot per (token, KV head) at D = 128: 64 + 2 bytes of key, 64 + 4 bytes of value (bf16: 512).

The mixed batch (vLLM's ordering): decode requests first (one new token each), then prefill requests
(their new tokens; a continuation chunk also has a cached prefix). ``attn_out = torch.empty(N, Hq,
D)``: rows ``[0, num_decode_tokens)`` are written by the split-KV decode kernel (through the merge
kernel when the context is split), rows ``[num_decode_tokens, num_actual_tokens)`` by the prefill
kernel. :func:`prove_coverage` proves from the host-side metadata that these ranges are disjoint and
cover ``[0, N)``; :func:`mixed_attention` refuses to launch otherwise (a batch padded for a CUDA
graph leaves its padding rows unwritten).
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import math
from collections import namedtuple
from dataclasses import dataclass

import torch

from . import nvcc
from .device import (DEVICE, ON_GPU, cdiv, check_tensor, kernel_device, next_pow2, require_launchable,
                     resolve_config, resolve_emulate, same_device, sm_count)
from .kernels import turboquant as kern

__all__ = [
    "hadamard", "coordinate_density", "lloyd_max_centroids", "centroid_boundaries", "sign_magnitude",
    "sign_magnitude_table", "QuantizedKeys", "quantize_keys", "dequantize_keys", "QuantizedValues", "quantize_values",
    "dequantize_values", "pack_nibbles", "unpack_nibbles", "TurboQuantCache", "allocate_cache", "slot_bytes",
    "MixedBatch", "make_batch", "CoverageError", "prove_coverage", "store_kv", "store_kv_reference",
    "dequantize_cache", "reference_attention", "reference_mixed_attention", "rotate_queries", "decode_attention",
    "prefill_attention", "mixed_attention", "write_attention", "tq_decode_resident_warps", "cuda_decode_launch",
    "CudaDecodeLaunch",
    "CONFIG", "EMULATE_WHY", "make_example",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
VALUE_BITS = 4
KEY_BITS = 4  # the 4bit_nc preset; the reference path also takes 2 and 3

# What Triton's interpreter cannot run in these kernels (device.resolve_emulate puts it in its error).
EMULATE_WHY = "it runs fp16 tl.dot and inline PTX, which Triton's interpreter gets wrong or cannot run"


def _is_pow2(n: int) -> bool:
    return isinstance(n, int) and n >= 1 and (n & (n - 1)) == 0


def _check_counts(**counts) -> None:
    for name, val in counts.items():
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")


def _check_dim(name: str, d, lo: int = 2) -> None:
    if not _is_pow2(d) or d < lo:
        raise ValueError(f"{name} must be a power of two >= {lo} (the Hadamard rotation is defined "
                         f"for powers of two), got {d}")


# ----------------------------- Rotation and codebook ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _hadamard_cpu(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(d)).float()


def hadamard(d: int, device=None) -> torch.Tensor:
    """The orthonormal Hadamard matrix ``[d, d]`` (fp32, Sylvester order, symmetric: H @ H = I)."""
    _check_dim("d", d, lo=1)
    return _hadamard_cpu(d).to(device or "cpu")


def coordinate_density(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Density of one coordinate of a uniform random unit vector in ``dim`` dimensions:
    ``f(x) = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) (1 - x^2)^((d-3)/2)`` on (-1, 1) (a Beta law
    stretched to [-1, 1]); variance 1/d, and close to N(0, 1/d) for large d."""
    if not isinstance(dim, int) or dim < 2:
        raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
    x = x.double()
    logc = math.lgamma(dim / 2) - 0.5 * math.log(math.pi) - math.lgamma((dim - 1) / 2)
    inside = x.abs() < 1
    f = torch.exp(logc + (dim - 3) / 2 * torch.log1p(-torch.where(inside, x * x, torch.zeros_like(x))))
    return torch.where(inside, f, torch.zeros_like(f))


@functools.lru_cache(maxsize=None)
def _lloyd_max_cpu(bits: int, dim: int) -> torch.Tensor:
    # The density is symmetric, so the optimal codebook is: solve for the 2**(bits-1) positive
    # centroids on (0, 1) and mirror them. Midpoint rule on a fine grid, float64 throughout.
    half = 2 ** (bits - 1)
    xmax = min(1.0, 14.0 / math.sqrt(dim))  # beyond 14 sigma the density is below 1e-40 of its peak
    n = 100_000
    x = (torch.arange(n, dtype=torch.float64) + 0.5) * (xmax / n)
    w = coordinate_density(x, dim)
    w = w / w.sum()
    cw = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w, 0)])
    cwx = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w * x, 0)])
    # start from the asymptotically optimal point density (proportional to f^(1/3)), then Lloyd:
    # cells end at the midpoints between centroids, each centroid moves to its cell's mean
    cw3 = torch.cumsum(w ** (1 / 3), 0)
    q = torch.searchsorted(cw3 / cw3[-1], ((torch.arange(half, dtype=torch.float64) + 0.5) / half).contiguous())
    c = x[q.clamp(max=n - 1)]
    tol = 1e-12 / math.sqrt(dim)
    for _ in range(20000):
        mids = (c[1:] + c[:-1]) / 2
        inner = torch.searchsorted(x, mids.contiguous())
        edges = torch.cat([torch.zeros(1, dtype=torch.long), inner, torch.tensor([n])])
        new = (cwx[edges[1:]] - cwx[edges[:-1]]) / (cw[edges[1:]] - cw[edges[:-1]])
        done = float((new - c).abs().max()) < tol
        c = new
        if done:
            break
    return torch.cat([-c.flip(0), c]).float()


def lloyd_max_centroids(bits: int, dim: int) -> torch.Tensor:
    """The ``2**bits`` Lloyd-Max centroids (sorted, float32, on the CPU) of one coordinate of a
    uniform random unit vector in ``dim`` dimensions (:func:`coordinate_density`, the exact law, not
    its Gaussian limit). Lloyd iteration (cells at midpoints, centroids at conditional means) on a
    100k-point grid, deterministic and cached; exactly symmetric (c[2**bits - 1 - m] = -c[m])."""
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits must be an integer in 1..8, got {bits!r}")
    if not isinstance(dim, int) or dim < 2:
        raise ValueError(f"dim must be an integer >= 2, got {dim!r}")
    return _lloyd_max_cpu(bits, dim).clone()


def sign_magnitude(codes: torch.Tensor) -> torch.Tensor:
    """Sorted centroid indices 0..15 -> the cache's sign-magnitude codes: index i >= 8 (a positive
    centroid) -> i - 8, i < 8 -> 8 | (7 - i). So code & 7 is the magnitude's rank and bit 3 the sign
    (the decode kernel looks magnitudes up 4 at a time with byte permutes)."""
    return torch.where(codes >= 8, codes - 8, 15 - codes)


def sign_magnitude_table(centroids: torch.Tensor) -> torch.Tensor:
    """The 16 sorted (symmetric) centroids in sign-magnitude code order: t[m] = c[8 + m], t[8 + m] = -c[8 + m]."""
    pos = centroids[8:]
    return torch.cat([pos, -pos])


def centroid_boundaries(centroids: torch.Tensor) -> torch.Tensor:
    """Decision boundaries: the midpoints between neighbouring centroids (fp32, ``2**bits - 1``)."""
    c = centroids.float()
    return (c[1:] + c[:-1]) / 2


# ----------------------------- Pure-torch quantizers (the reference path; any device) ------------------------------

@dataclass
class QuantizedKeys:
    """Keys as TurboQuant stores them: ``codes`` (uint8, one code per coordinate, [..., D]) of the
    rotated unit vector, ``norm`` (fp16 ``||k||``, [...]), the bit width, and whether dequantization
    renormalizes the centroid vector (norm correction)."""

    codes: torch.Tensor
    norm: torch.Tensor
    bits: int
    norm_correction: bool = True

    @property
    def dim(self) -> int:
        return self.codes.shape[-1]


def _check_float(name, t, device=None):
    check_tensor(name, t, dtypes=_FLOATS, device=device, contiguous=False)
    if t.dim() < 1:
        raise ValueError(f"{name} must have a last dimension (the head dim), got a scalar")


def quantize_keys(k: torch.Tensor, bits: int = 4, norm_correction: bool = True) -> QuantizedKeys:
    """TurboQuant's MSE quantizer for keys ``[..., D]`` (D a power of two, bits in {2, 3, 4})."""
    _check_float("k", k)
    _check_dim("k.shape[-1] (the head dim)", k.shape[-1])
    if bits not in (2, 3, 4):
        raise ValueError(f"bits must be 2, 3 or 4, got {bits!r}")
    d = k.shape[-1]
    kf = k.float()
    norm = torch.linalg.vector_norm(kf, dim=-1)
    u = kf / torch.where(norm > 0, norm, torch.ones_like(norm)).unsqueeze(-1)
    y = u @ hadamard(d, k.device)
    bnd = centroid_boundaries(lloyd_max_centroids(bits, d)).to(k.device)
    codes = torch.bucketize(y, bnd).to(torch.uint8)  # number of boundaries strictly below y
    return QuantizedKeys(codes, norm.to(torch.float16), bits, bool(norm_correction))


def dequantize_keys(qk: QuantizedKeys) -> torch.Tensor:
    """float32 keys of the quantized keys' shape: ``norm * c H`` (``c / ||c||`` with norm correction)."""
    if not isinstance(qk, QuantizedKeys):
        raise TypeError(f"dequantize_keys takes the QuantizedKeys that quantize_keys returns, got {type(qk).__name__}")
    d = qk.dim
    c = lloyd_max_centroids(qk.bits, d).to(qk.codes.device)[qk.codes.long()]
    if qk.norm_correction:
        c = c / torch.linalg.vector_norm(c, dim=-1, keepdim=True)
    return qk.norm.float().unsqueeze(-1) * (c @ hadamard(d, qk.codes.device))


@dataclass
class QuantizedValues:
    """4-bit uniform codes (uint8 [..., D]) with fp16 ``scale`` and ``zero`` per vector ([...])."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor


def quantize_values(v: torch.Tensor) -> QuantizedValues:
    """``scale = fp16((max - min) / 15)``, ``zero = fp16(min)``, ``code = clamp(floor((v - zero) /
    scale + 1/2), 0, 15)`` (codes 0 when scale is 0). Exactly what the store kernel computes."""
    _check_float("v", v)
    vf = v.float()
    vmax, vmin = vf.amax(-1), vf.amin(-1)
    scale = ((vmax - vmin) / 15.0).half()
    zero = vmin.half()
    s32 = scale.float().unsqueeze(-1)
    pos = s32 > 0
    q = torch.floor((vf - zero.float().unsqueeze(-1)) / torch.where(pos, s32, torch.ones_like(s32)) + 0.5)
    q = torch.where(pos, q.clamp(0, 15), torch.zeros_like(q))
    return QuantizedValues(q.to(torch.uint8), scale, zero)


def dequantize_values(qv: QuantizedValues) -> torch.Tensor:
    return qv.codes.float() * qv.scale.float().unsqueeze(-1) + qv.zero.float().unsqueeze(-1)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., D] in 0..15 -> [..., D/2]: coordinate 2j in the low nibble, 2j+1 in the high."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    lo, hi = packed & 15, packed >> 4
    return torch.stack([lo, hi], -1).flatten(-2)


# ----------------------------- The paged cache ---------------------------------------------------------------------

@dataclass
class TurboQuantCache:
    """The paged 4bit_nc cache (layout in ``kernels/turboquant.py``), plus its codebook."""

    k_codes: torch.Tensor
    k_scale: torch.Tensor
    v_codes: torch.Tensor
    v_scale: torch.Tensor
    v_zero: torch.Tensor
    centroids: torch.Tensor
    boundaries: torch.Tensor
    rotation: torch.Tensor

    num_blocks = property(lambda self: self.k_codes.shape[0], doc="pages")
    num_kv_heads = property(lambda self: self.k_codes.shape[1])
    block_size = property(lambda self: self.k_codes.shape[2], doc="tokens per page")
    head_dim = property(lambda self: 2 * self.k_codes.shape[3])
    device = property(lambda self: self.k_codes.device)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.k_codes, self.k_scale, self.v_codes, self.v_scale, self.v_zero

    @property
    def centroids_half(self) -> torch.Tensor:
        """The fp16 table the attention kernels look up (their matrix-multiply operand dtype)."""
        if getattr(self, "_half", None) is None or self._half.device != self.centroids.device:
            self._half = self.centroids.half()
        return self._half

    @property
    def key_table_words(self) -> tuple[int, int, int, int]:
        """The decode kernel's prmt table (host ints, computed once, no device sync): the low bytes of
        the 8 fp16 magnitudes centroids[0..7], 4 per int32 word, then their high bytes."""
        if getattr(self, "_table_words", None) is None:
            bits = sign_magnitude_table(lloyd_max_centroids(KEY_BITS, self.head_dim))[:8].half().view(torch.int16)
            bits = [int(x) & 0xFFFF for x in bits.tolist()]
            word = lambda bs: int.from_bytes(bytes(bs), "little", signed=True)  # noqa: E731
            self._table_words = (word([b & 0xFF for b in bits[:4]]), word([b & 0xFF for b in bits[4:]]),
                                 word([b >> 8 for b in bits[:4]]), word([b >> 8 for b in bits[4:]]))
        return self._table_words

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def slot_bytes(head_dim: int = 128) -> dict:
    """Bytes per (token, KV head) slot: 4bit_nc vs a bf16 cache, and the compression ratio."""
    key, value, bf16 = head_dim // 2 + 2, head_dim // 2 + 4, 2 * 2 * head_dim
    return {"head_dim": head_dim, "key": key, "value": value, "total": key + value, "bf16": bf16,
            "ratio": bf16 / (key + value)}


def allocate_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                   device=None) -> TurboQuantCache:
    """A paged cache of ``num_blocks`` pages of ``block_size`` tokens.

    ``torch.empty`` is right here: a slot is read only after the store kernel wrote it (a request
    reads positions [0, seq_len) of its own pages, and every position below seq_len was stored
    when its token was new); the tests poison every page and check that no output changes."""
    _check_dim("head_dim", head_dim, lo=2)
    _check_counts(num_blocks=num_blocks, block_size=block_size, num_kv_heads=num_kv_heads)
    dev = kernel_device(device)
    shape = (num_blocks, num_kv_heads, block_size)
    c = lloyd_max_centroids(KEY_BITS, head_dim)
    bnd = torch.cat([centroid_boundaries(c), torch.tensor([float("inf")])])
    return TurboQuantCache(
        k_codes=torch.empty(*shape, head_dim // 2, dtype=torch.uint8, device=dev),
        k_scale=torch.empty(shape, dtype=torch.float16, device=dev),
        v_codes=torch.empty(*shape, head_dim // 2, dtype=torch.uint8, device=dev),
        v_scale=torch.empty(shape, dtype=torch.float16, device=dev),
        v_zero=torch.empty(shape, dtype=torch.float16, device=dev),
        centroids=sign_magnitude_table(c).to(dev), boundaries=bnd.to(dev), rotation=hadamard(head_dim, dev))


# ----------------------------- Batch metadata and the coverage proof (host side) -----------------------------------

class CoverageError(ValueError):
    """The rows of attn_out written by the decode and prefill paths are not a disjoint cover of [0, N)."""


@dataclass
class MixedBatch:
    """One step's metadata: host lists (for the plan and the proof) and device tensors (for kernels)."""

    query_lens: list
    seq_lens_host: list
    query_start_host: list
    num_decode_reqs: int
    block_size: int
    seq_lens: torch.Tensor         # int32 [R]
    query_start_loc: torch.Tensor  # int32 [R + 1]
    block_table: torch.Tensor      # int32 [R, max_pages]
    slot_mapping: torch.Tensor     # int64 [num_actual_tokens]
    max_page: int | None = None    # the largest page id the step uses (make_batch; None: not known)

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_decode_tokens(self) -> int:
        return self.query_start_host[self.num_decode_reqs]

    @property
    def num_actual_tokens(self) -> int:
        return self.query_start_host[-1]

    @property
    def max_decode_seq_len(self) -> int:
        return max(self.seq_lens_host[: self.num_decode_reqs], default=0)

    @property
    def max_prefill_query_len(self) -> int:
        return max(self.query_lens[self.num_decode_reqs:], default=0)


def make_batch(query_lens, seq_lens, block_table, num_decode_reqs: int, *, block_size: int,
               num_blocks: int, device=None) -> MixedBatch:
    """Validate one step's metadata (on the host, once) and build the device tensors.

    ``query_lens[r]``: new tokens of request r (1 for a decode request); ``seq_lens[r]``: its context
    length including the new tokens; ``block_table``: [R, max_pages] page ids (int); the first
    ``num_decode_reqs`` requests are the decode requests."""
    dev = kernel_device(device)
    _check_counts(block_size=block_size, num_blocks=num_blocks)
    ql, sl = (x.tolist() if isinstance(x, torch.Tensor) else list(x) for x in (query_lens, seq_lens))
    for name, xs in (("query_lens", ql), ("seq_lens", sl)):
        if any(isinstance(x, bool) or int(x) != x for x in xs):
            raise ValueError(f"{name} must hold integers (token counts), got {xs}")
    ql, sl = [int(x) for x in ql], [int(x) for x in sl]
    R = len(ql)
    if len(sl) != R:
        raise ValueError(f"seq_lens has {len(sl)} entries but query_lens has {R}: one per request")
    if not isinstance(num_decode_reqs, int) or not 0 <= num_decode_reqs <= R:
        raise ValueError(f"num_decode_reqs must be an integer in [0, {R}], got {num_decode_reqs!r}")
    bt = torch.as_tensor(block_table)
    if bt.dtype not in (torch.int32, torch.int64) or bt.dim() != 2 or bt.shape[0] != R:
        raise ValueError(f"block_table must be an int32/int64 tensor [R={R}, max_pages], got "
                         f"{bt.dtype} {tuple(bt.shape)}")
    btc = bt.cpu()
    for r in range(R):
        if ql[r] < 1:
            raise ValueError(f"query_lens[{r}] = {ql[r]}: every request in the batch has >= 1 new token")
        if r < num_decode_reqs and ql[r] != 1:
            raise ValueError(f"request {r} is a decode request (r < num_decode_reqs = {num_decode_reqs}) "
                             f"but has {ql[r]} new tokens: decode requests have exactly 1 and come first")
        if sl[r] < ql[r]:
            raise ValueError(f"seq_lens[{r}] = {sl[r]} is smaller than its query_lens[{r}] = {ql[r]}: the "
                             "context includes the new tokens")
        need = cdiv(sl[r], block_size)
        if need > bt.shape[1]:
            raise ValueError(f"seq_lens[{r}] = {sl[r]} needs {need} pages of {block_size} tokens but the "
                             f"block table has {bt.shape[1]} columns")
        pages = btc[r, :need]
        if (pages < 0).any() or (pages >= num_blocks).any():
            bad = [int(p) for p in pages if p < 0 or p >= num_blocks][:4]
            raise ValueError(f"block_table[{r}] holds page ids {bad} outside [0, num_blocks={num_blocks})")
    used = torch.cat([btc[r, : cdiv(sl[r], block_size)] for r in range(R)]) if R else btc.new_empty(0)
    if used.unique().numel() != used.numel():
        raise ValueError("two requests (or two positions of one request) share a cache page in block_table: "
                         "their stores would overwrite each other")
    qsl = [0, *itertools.accumulate(ql)]
    slots = [int(btc[r, pos // block_size]) * block_size + pos % block_size
             for r in range(R) for pos in range(sl[r] - ql[r], sl[r])]
    return MixedBatch(ql, sl, qsl, num_decode_reqs, block_size,
                      torch.tensor(sl, dtype=torch.int32, device=dev),
                      torch.tensor(qsl, dtype=torch.int32, device=dev),
                      bt.to(device=dev, dtype=torch.int32).contiguous(),
                      torch.tensor(slots, dtype=torch.int64, device=dev), int(used.max()) if used.numel() else -1)


def prove_coverage(batch: MixedBatch, num_rows: int) -> list[tuple[str, int, int]]:
    """Prove, from host metadata only, that the decode rows and the prefill rows of ``attn_out`` are
    disjoint and cover [0, num_rows). Returns [(writer, start, end), ...]; raises CoverageError."""
    nd, nt = batch.num_decode_tokens, batch.num_actual_tokens
    qsl = batch.query_start_host
    # decode request r writes row qsl[r] = r; prefill request r writes rows [qsl[r], qsl[r+1])
    if qsl[0] != 0 or any(b <= a for a, b in zip(qsl, qsl[1:])):
        raise CoverageError(f"query_start_loc must start at 0 and increase strictly, got {qsl}")
    if nd != batch.num_decode_reqs:
        raise CoverageError(f"{batch.num_decode_reqs} decode requests must own rows [0, {batch.num_decode_reqs}), "
                            f"but query_start_loc puts the first prefill row at {nd}")
    if nt != num_rows:
        if nt < num_rows:
            raise CoverageError(
                f"attn_out has {num_rows} rows but the decode path writes rows [0, {nd}) and the prefill path "
                f"rows [{nd}, {nt}): rows [{nt}, {num_rows}) would be written by nobody and hold whatever "
                "torch.empty left there (e.g. a batch padded for a CUDA graph). Slice the inputs to the "
                f"{nt} real tokens, or give the padding rows a writer.")
        raise CoverageError(f"the batch has {nt} tokens but attn_out only {num_rows} rows")
    return [("decode", 0, nd), ("prefill", nd, nt)]


# ----------------------------- Launchers: input checks, launch configurations, the Triton and CUDA halves ----------

def _check_cache(cache):
    if not isinstance(cache, TurboQuantCache):
        raise TypeError(f"cache must be a TurboQuantCache (allocate_cache), got {type(cache).__name__}")
    if not same_device(cache.device, DEVICE):
        raise ValueError(f"cache is on {cache.device} but the kernels run on {DEVICE}")
    if cache.head_dim < 32:
        raise ValueError(f"the kernels need head_dim >= 32 (tl.dot needs K >= 16 per half), cache has {cache.head_dim}")


def _check_qkv(q, k, v, cache, batch):
    _check_cache(cache)
    if not isinstance(batch, MixedBatch):
        raise TypeError(f"batch must be a MixedBatch (make_batch), got {type(batch).__name__}")
    check_tensor("q", q, dtypes=_FLOATS, ndim=3, device=DEVICE)
    n, hq, d = q.shape
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, dtypes=(q.dtype,), ndim=3, device=DEVICE)
        if t.shape[0] != n or t.shape[2] != d:
            raise ValueError(f"{name} must be [N={n}, Hkv, D={d}] like q, got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    _check_dim("head dim", d, lo=32)
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the number of KV heads ({hkv})")
    if hkv != cache.num_kv_heads or d != cache.head_dim:
        raise ValueError(f"k/v have {hkv} KV heads of dim {d} but the cache holds {cache.num_kv_heads} of dim "
                         f"{cache.head_dim}")
    if batch.block_size != cache.block_size:
        raise ValueError(f"the batch was planned for pages of {batch.block_size} tokens, the cache has {cache.block_size}")
    if not same_device(batch.block_table.device, DEVICE):
        raise ValueError(f"the batch's tensors are on {batch.block_table.device}, the kernels on {DEVICE}")
    if batch.max_page is not None and batch.max_page >= cache.num_blocks:
        raise ValueError(f"the batch's block_table uses page {batch.max_page} but the cache holds {cache.num_blocks} "
                         f"pages: its stores would land outside the cache (make_batch num_blocks={cache.num_blocks})")
    return n, hq, hkv, d


# Launch configurations, one part per kernel: each launcher resolves its own (``config=`` takes its keys).
# decode: NUM_SPLITS None = enough splits for WAVES programs per multiprocessor, at most one per MIN_SPLIT
# tokens. 4 warps (one warpgroup: with BLOCK_G = 16 query columns Triton 3.6 emits Hopper's wgmma; with 8
# it falls back to mma.sync and extra moves), 64 tokens a tile, maxnreg 128 (4 programs per SM, not 3 at
# the compiler's 139); WAVES chosen on the H200 from the configurations the benchmark records side by side.
# num_stages=1: with 2, Triton 3.6's pipelining of the cached-prefix loop made an out-of-range shared-memory
# access on the H200 (compute-sanitizer memcheck on tests/test_turboquant.py, 2026-11-30; not upstream).
# cuda_decode (backend="cuda": one warp per run, a contiguous range of one (request, KV head) pair's tokens):
# NUM_SPLITS None = splits filling WAVES whole rounds of the resident warps (a partly filled last round costs
# a whole round), at most one per MIN_SPLIT tokens, but a grid of up to SMALL_WARPS warps may cut splits to
# one 32-token step (short contexts: a warp's fixed cost and the merge outweigh its steps; turboquant.json
# "launch_rule"). FILL: where whole rounds bound the splits, the pairs share the round's runs exactly (some
# pairs one run more) instead of pairs x splits <= the round; off, as measured (cuda_variants_measured run 17).
# KEY_TABLE: True the kernel's shared-memory key table, False its register table, None the rule: the table for
# runs of KEY_TABLE_MIN_SPLIT tokens or more, where its 64 KB fill paid (benchmarks.turboquant.key_table_ab).
CONFIG = {
    "store": {"BLOCK_R": 16, "num_warps": 4},
    "decode": {"BLOCK_N": 64, "BLOCK_G": 16, "NUM_SPLITS": None, "WAVES": 8, "MIN_SPLIT": 256,
               "num_warps": 4, "num_stages": 1, "maxnreg": 128},
    "cuda_decode": {"NUM_SPLITS": None, "WAVES": 1, "MIN_SPLIT": 256, "SMALL_WARPS": 512, "FILL": False,
                    "KEY_TABLE": None, "KEY_TABLE_MIN_SPLIT": 512},
    "prefill": {"BLOCK_M": 64, "BLOCK_N": 64, "LOOKUP": 0, "num_warps": 4, "num_stages": 1},
}
if not ON_GPU:  # the interpreter pays per operation, not per element: few, large programs
    CONFIG["decode"].update(BLOCK_N=128, BLOCK_G=1, MIN_SPLIT=128, WAVES=1)
    CONFIG["store"].update(BLOCK_R=256)
_CUDA_STEP = 32   # the CUDA decode kernel's tokens per softmax step: its runs are whole steps
_POW2 = {"store": ("BLOCK_R", "num_warps"), "decode": ("BLOCK_N", "BLOCK_G", "num_warps"), "cuda_decode": (),
         "prefill": ("BLOCK_M", "BLOCK_N", "num_warps")}   # each part's keys that must be powers of two


def _part_config(config, part: str, name: str = "config") -> dict:
    """CONFIG[part] updated with ``config``: names checked, tile sizes powers of two, NUM_SPLITS None or >= 1."""
    cfg = resolve_config(config, CONFIG[part], name=name, pow2=_POW2[part])
    s = cfg.get("NUM_SPLITS")
    if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
        raise ValueError(f"{name} NUM_SPLITS must be None or an integer >= 1, got {s!r}")
    return cfg


def store_kv(k: torch.Tensor, v: torch.Tensor, cache: TurboQuantCache, slot_mapping: torch.Tensor, *,
             config=None) -> None:
    """Quantize the new tokens' keys and values ``[N, Hkv, D]`` into their cache slots (the Triton
    store kernel). ``slot_mapping[n] = page * block_size + offset``; a negative slot skips the token."""
    _check_cache(cache)
    check_tensor("k", k, dtypes=_FLOATS, ndim=3, device=DEVICE)
    check_tensor("v", v, dtypes=(k.dtype,), ndim=3, device=DEVICE)
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int64,), ndim=1, device=DEVICE)
    if k.shape != v.shape or k.shape[1:] != (cache.num_kv_heads, cache.head_dim):
        raise ValueError(f"k and v must be [N, {cache.num_kv_heads}, {cache.head_dim}] (the cache's heads and "
                         f"dim), got {tuple(k.shape)} and {tuple(v.shape)}")
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {k.shape[0]} tokens")
    rows = k.shape[0] * cache.num_kv_heads
    if rows == 0:
        return
    cfg = _part_config(config, "store")
    require_launchable(kern.tq_store_kernel)
    kern.tq_store_kernel[(cdiv(rows, cfg["BLOCK_R"]),)](
        k, v, slot_mapping, cache.rotation, cache.centroids, cache.boundaries, *cache.tensors(), rows,
        HKV=cache.num_kv_heads, D=cache.head_dim, BLOCK_SIZE=cache.block_size, BLOCK_R=cfg["BLOCK_R"],
        num_warps=cfg["num_warps"])


def store_kv_reference(k, v, cache: TurboQuantCache, slot_mapping) -> None:
    """The store in pure torch (same bytes as the kernel, up to codes of keys within rounding of a
    boundary): keys via :func:`quantize_keys`, the scale ``fp16(||k|| / ||c||)``; values via
    :func:`quantize_values`."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    kk, vv = k[keep].float(), v[keep].float()
    qk = quantize_keys(kk, KEY_BITS)
    codes = sign_magnitude(qk.codes)  # the cache's code order (cache.centroids is indexed by it)
    c = cache.centroids[codes.long()]
    norm = torch.linalg.vector_norm(kk, dim=-1)
    scale = (norm / torch.linalg.vector_norm(c, dim=-1)).half()
    qv = quantize_values(vv)
    page, off = slots // cache.block_size, slots % cache.block_size
    for h in range(cache.num_kv_heads):
        cache.k_codes[page, h, off] = pack_nibbles(codes[:, h])
        cache.k_scale[page, h, off] = scale[:, h]
        cache.v_codes[page, h, off] = pack_nibbles(qv.codes[:, h])
        cache.v_scale[page, h, off] = qv.scale[:, h]
        cache.v_zero[page, h, off] = qv.zero[:, h]


def dequantize_cache(cache: TurboQuantCache, block_table_row, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [length, Hkv, D] (float32) of positions [0, length) of one request."""
    pos = torch.arange(length, device=cache.device)
    page = torch.as_tensor(block_table_row, device=cache.device).long()[pos // cache.block_size]
    off = pos % cache.block_size
    kc = unpack_nibbles(cache.k_codes[page, :, off])                     # [L, Hkv, D]
    keys = cache.k_scale[page, :, off].float().unsqueeze(-1) * (cache.centroids[kc.long()] @ cache.rotation)
    vc = unpack_nibbles(cache.v_codes[page, :, off]).float()
    vals = vc * cache.v_scale[page, :, off].float().unsqueeze(-1) + cache.v_zero[page, :, off].float().unsqueeze(-1)
    return keys, vals


def reference_attention(q, keys, values, causal_offset: int | None = None, sm_scale=None) -> torch.Tensor:
    """float32 softmax attention, q [M, Hq, D] over keys/values [L, Hkv, D] (GQA: query head h reads
    KV head h // (Hq // Hkv)); with ``causal_offset`` P, query m sees keys [0, P + m]."""
    m, hq, d = q.shape
    g = hq // keys.shape[1]
    kk = keys.float().repeat_interleave(g, dim=1)
    vv = values.float().repeat_interleave(g, dim=1)
    s = torch.einsum("mhd,lhd->hml", q.float(), kk) * (sm_scale if sm_scale is not None else d ** -0.5)
    if causal_offset is not None:
        allowed = torch.arange(kk.shape[0], device=q.device)[None, :] <= causal_offset + torch.arange(m, device=q.device)[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(s, dim=-1), vv)


def reference_mixed_attention(q, k, v, cache: TurboQuantCache, batch: MixedBatch, sm_scale=None) -> torch.Tensor:
    """float32 attention for the real rows [0, num_actual_tokens) of a mixed batch, on the cache as
    the kernels see it after the store: decode tokens attend to the dequantized cache [0, seq_len);
    prefill tokens to the dequantized prefix [0, P) and causally to their own new tokens (q, k, v as
    given, unquantized)."""
    out = torch.empty(batch.num_actual_tokens, q.shape[1], q.shape[2], dtype=torch.float32, device=q.device)
    for r in range(batch.num_reqs):
        a, b = batch.query_start_host[r], batch.query_start_host[r + 1]
        L, row = batch.seq_lens_host[r], batch.block_table[r]
        if r < batch.num_decode_reqs:
            keys, vals = dequantize_cache(cache, row, L)
            out[a:b] = reference_attention(q[a:b], keys, vals, sm_scale=sm_scale)
        else:
            P = L - (b - a)
            keys, vals = dequantize_cache(cache, row, P)
            keys, vals = torch.cat([keys, k[a:b].float()]), torch.cat([vals, v[a:b].float()])
            out[a:b] = reference_attention(q[a:b], keys, vals, causal_offset=P, sm_scale=sm_scale)
    return out


def rotate_queries(q: torch.Tensor, cache: TurboQuantCache, sm_scale=None) -> torch.Tensor:
    """``q H * sm_scale * log2(e)`` in fp32: each query rotated once (never a key rotated back)."""
    scale = (sm_scale if sm_scale is not None else q.shape[-1] ** -0.5) * math.log2(math.e)
    memo = cache.__dict__.setdefault("_scaled_rotation", {})
    if scale not in memo:  # H * scale once per scale: one matrix multiply per call, no extra kernel
        memo[scale] = cache.rotation * scale
    return q.float() @ memo[scale]


def _num_splits(cfg, capacity, pairs: int, max_len: int, step: int, whole_rounds: bool = False):
    """(splits, split_len, bound): NUM_SPLITS if given, else ``capacity`` programs shared by the ``pairs``
    rounded up (Triton) or down (CUDA), at most max(SMALL_WARPS // pairs, one per MIN_SPLIT tokens); whole
    ``step``s. bound: whether the capacity set the count (long contexts)."""
    if cfg["NUM_SPLITS"] is not None:
        s, bound = cfg["NUM_SPLITS"], False   # checked by _part_config
    else:
        pairs = max(pairs, 1)
        s = capacity // pairs if whole_rounds else cdiv(capacity, pairs)
        cap = max(cfg.get("SMALL_WARPS", 0) // pairs, cdiv(max_len, cfg["MIN_SPLIT"]))
        bound = 1 <= s <= cap
        s = max(1, min(s, cap))
    split_len = cdiv(cdiv(max(max_len, 1), s), step) * step
    return cdiv(max(max_len, 1), split_len), split_len, bound


def _check_cuda_decode(q, cache: TurboQuantCache, hq: int, d: int) -> None:
    """What the CUDA decode kernel (kernels/cuda/turboquant.cu) is written for; the Triton one takes more."""
    hkv, bs = cache.num_kv_heads, cache.block_size
    if d != 128:
        raise ValueError(f"backend='cuda' decodes head_dim 128 only (its MMA layout is written for it), got {d}; "
                         "use backend='triton'")
    if hq // hkv > 8:
        raise ValueError(f"backend='cuda' takes at most 8 query heads per KV head (one MMA's n = 8), got "
                         f"{hq // hkv}; use backend='triton'")
    if bs < 16 or bs & (bs - 1):
        raise ValueError(f"backend='cuda' needs a block_size that is a power of two >= 16 (a 16-token tile "
                         f"lies in one page), got {bs}; use backend='triton'")
    check_tensor("q", q, dtypes=(torch.float32, torch.float16, torch.bfloat16), ndim=3, device=DEVICE, contiguous=False)
    for name, t in zip(("k_codes", "k_scale", "v_codes", "v_scale", "v_zero"), cache.tensors()):   # 16-byte cp.async
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"backend='cuda' copies cache.{name} 16 bytes at a time: it must be contiguous and "
                             f"start on a 16-byte boundary (a cache from allocate_cache is); use backend='triton'")


# ----------------------------- The CUDA C++ decode kernel (kernels/cuda/turboquant.cu) -----------------------------
_Q_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _cuda_tq_decode(q: torch.Tensor, cfg: dict, cache, batch, out: torch.Tensor, sm_scale) -> torch.Tensor:
    """The CUDA half of :func:`decode_attention` (``out`` checked there; ``q`` = its decode rows): the decode
    kernel rotates the raw queries ``q`` [B, Hq, D] (fp32/fp16/bf16) times sm_scale log2(e) / sqrt(D) and
    fills part_out and part_lse for every run of :func:`cuda_decode_launch`'s split; the merge kernel,
    launched as its programmatic dependent, writes rows [0, B) of ``out``."""
    (B, hq, d), hkv = q.shape, cache.num_kv_heads
    _check_cuda_decode(q, cache, hq, d)
    index = out.device.index if out.device.index is not None else torch.cuda.current_device()
    plan = cuda_decode_launch(cfg, B * hkv, batch.max_decode_seq_len, index)
    # empty is right: the warp of run k of pair (b, KV head) writes row k of part_out/part_lse[b, its G
    # heads], a run past the sequence's end included (lse -inf, output 0); the merge reads rows [0, the
    # pair's runs), never the rows past them (a pair with fewer runs than slots). The tests poison both.
    part_out = torch.empty(B, hq, plan.slots, d, dtype=torch.float32, device=out.device)
    part_lse = torch.empty(B, hq, plan.slots, dtype=torch.float32, device=out.device)
    # the kernel loads 16 bytes at a time from [Hq, D]-dense rows: else a fresh (aligned) copy
    if q.stride(2) != 1 or q.stride(1) != d or q.data_ptr() % 16 or q.stride(0) * q.element_size() % 16:
        q = q.clone(memory_format=torch.contiguous_format)
    scale = (sm_scale if sm_scale is not None else d ** -0.5) * math.log2(math.e) / math.sqrt(d)
    nvcc.check_backend("cuda")
    lib = nvcc.build()
    err = lib.tq_decode_cuda(
        q.data_ptr(), _Q_DTYPES[q.dtype], q.stride(0), ctypes.c_float(scale), batch.block_table.data_ptr(),
        batch.seq_lens.data_ptr(), *(t.data_ptr() for t in cache.tensors()), part_out.data_ptr(),
        part_lse.data_ptr(), out.data_ptr(), _Q_DTYPES[out.dtype], *cache.key_table_words, B, hq, hkv,
        cache.block_size, batch.block_table.stride(0), batch.block_table.shape[1], plan.pair_steps, plan.runs,
        plan.slots, *nvcc.device_stream(q), int(plan.key_table))
    nvcc.check_error(lib, err, "tq_decode_cuda")
    return out


@functools.cache
def tq_decode_resident_warps(device_index: int) -> int:
    """Warps of the CUDA decode kernel that the whole GPU holds at once (per-multiprocessor occupancy
    from the CUDA runtime, times the multiprocessors; asked once per device): a round of runs."""
    nvcc.check_backend("cuda")
    lib = nvcc.build()
    w = ctypes.c_int(0)
    nvcc.check_error(lib, lib.tq_decode_cuda_warps_per_sm(device_index, ctypes.byref(w)), "tq_decode_cuda_warps_per_sm")
    return w.value * torch.cuda.get_device_properties(device_index).multi_processor_count


# The CUDA decode's work split (kernels/cuda/turboquant.cu, run_of_warp): `runs` warps shared by the pairs (request,
# KV head) as evenly as whole runs allow, each pair's runs over its `pair_steps` steps of 32 tokens likewise;
# slots: the most runs of a pair (part_out's third dimension); run_len: the longest run, tokens; the key form.
CudaDecodeLaunch = namedtuple("CudaDecodeLaunch", "runs pair_steps slots run_len key_table")


def cuda_decode_launch(cfg: dict, pairs: int, max_len: int, device_index: int) -> CudaDecodeLaunch:
    """The CUDA decode's launch rule (:data:`CudaDecodeLaunch`), the launcher's and the benchmarks', for
    ``pairs`` (requests x KV heads) over at most ``max_len`` tokens under ``cfg`` (CONFIG["cuda_decode"]'s
    keys): the splits of :func:`_num_splits` per pair, or with FILL, where whole rounds bound them, the
    round's runs exactly."""
    warps = int(cfg["WAVES"] * tq_decode_resident_warps(device_index)) if cfg["NUM_SPLITS"] is None else 0
    if not isinstance(cfg["FILL"], bool):
        raise ValueError(f"config FILL must be True or False, got {cfg['FILL']!r}")
    pairs, steps = max(pairs, 1), cdiv(max(max_len, 1), _CUDA_STEP)
    S, split_len, bound = _num_splits(cfg, warps, pairs, max_len, _CUDA_STEP, whole_rounds=True)
    runs = min(warps, pairs * steps) if cfg["FILL"] and bound else pairs * S   # no run without a step to take
    run_len = _CUDA_STEP * cdiv(steps, runs // pairs)
    table = run_len >= cfg["KEY_TABLE_MIN_SPLIT"] if cfg["KEY_TABLE"] is None else cfg["KEY_TABLE"]
    if not isinstance(table, bool):
        raise ValueError(f"config KEY_TABLE must be None (the rule), True or False, got {table!r}")
    return CudaDecodeLaunch(runs, steps, cdiv(runs, pairs), run_len, table)


def decode_attention(q: torch.Tensor, cache: TurboQuantCache, batch: MixedBatch, out: torch.Tensor,
                     *, sm_scale=None, q_rot: torch.Tensor | None = None, config=None,
                     emulate: bool | None = None, backend: str = "triton") -> torch.Tensor:
    """Rows [0, num_decode_tokens) of ``out`` (and nothing else): split-KV decode over the quantized
    cache for the queries ``q`` [>= num_decode_tokens, Hq, D]. Returns ``out``.

    ``backend``: "triton" (``tq_decode_kernel``; runs in the interpreter too) reads the rotated queries,
    ``q_rot`` from :func:`rotate_queries` (computed here when not given); "cuda" (the CUDA C++ kernel
    ``kernels/cuda/turboquant.cu``, GPU only: head_dim 128, at most 8 query heads per KV head, pages of a
    power of two >= 16 tokens) rotates ``q`` itself, in registers (``q_rot`` is not used). ``config``
    takes the keys of ``CONFIG["decode"]`` (Triton) or ``CONFIG["cuda_decode"]`` (CUDA, which refuses
    ``emulate``). Both write the same rows, each through its own partial buffers and merge kernel."""

    use_cuda = nvcc.check_backend(backend, triton_only=("emulate",) if emulate is not None else ())
    cfg = _part_config(config, "cuda_decode" if use_cuda else "decode")
    em = False if use_cuda else resolve_emulate(emulate, EMULATE_WHY)
    check_tensor("out", out, dtypes=(torch.float32, torch.float16, torch.bfloat16), ndim=3, device=DEVICE)
    B = batch.num_decode_reqs
    for name, t in (("q", q), ("q_rot", q_rot), ("out", out)):   # out: a row per decode token
        if t is not None and (t.dim() != 3 or t.shape[1:] != out.shape[1:] or t.shape[0] < B):
            raise ValueError(f"{name} must be [>= num_decode_tokens ({B}), Hq, D] with out's Hq, D "
                             f"{tuple(out.shape[1:])}, got {tuple(t.shape)}")
    if B == 0:
        return out
    if use_cuda:
        return _cuda_tq_decode(q[:B], cfg, cache, batch, out, sm_scale)
    hq, d, hkv = out.shape[1], out.shape[2], cache.num_kv_heads
    q_rot = rotate_queries(q[:B], cache, sm_scale) if q_rot is None else q_rot
    S, split_len, _ = _num_splits(cfg, cfg["WAVES"] * sm_count(), B * hkv, batch.max_decode_seq_len, cfg["BLOCK_N"])
    part_out = part_lse = None   # one split writes out directly
    if S > 1:
        # empty is right: program (b, KV head, s) writes part_out/part_lse[b, its G heads, s] for every b < B,
        # KV head and split, an empty split included (lse -inf, output 0); the merge reads exactly those
        # entries (the tests poison both buffers).
        part_out = torch.empty(B, hq, S, d, dtype=torch.float32, device=out.device)
        part_lse = torch.empty(B, hq, S, dtype=torch.float32, device=out.device)
    require_launchable(kern.tq_decode_kernel)
    kern.tq_decode_kernel[(B, hkv, S)](
        q_rot, batch.block_table, batch.seq_lens, cache.k_codes.view(torch.int32), cache.k_scale,
        cache.v_codes.view(torch.int32), cache.v_scale, cache.v_zero, cache.centroids_half,
        *cache.key_table_words, out, part_out, part_lse, batch.block_table.stride(0), split_len,
        HQ=hq, HKV=hkv, D=d, BLOCK_SIZE=cache.block_size,
        BLOCK_G=max(cfg["BLOCK_G"], next_pow2(hq // hkv)), BLOCK_N=cfg["BLOCK_N"], NUM_SPLITS=S,
        EMULATE=em, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **({"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] and ON_GPU else {}))
    if S > 1:
        kern.tq_merge_kernel[(B, hq)](part_out, part_lse, out, HQ=hq, D=d, NUM_SPLITS=S,
                                      BLOCK_S=next_pow2(S), EMULATE=em, num_warps=4)
    return out


def prefill_attention(q, k, v, q_rot, cache: TurboQuantCache, batch: MixedBatch, out: torch.Tensor,
                      *, sm_scale=None, config=None, emulate: bool | None = None) -> torch.Tensor:
    """Rows [num_decode_tokens, num_actual_tokens) of ``out`` (and nothing else): causal attention of
    each prefill request's new tokens over its cached prefix (quantized) and its own new tokens."""
    cfg = _part_config(config, "prefill")
    em = resolve_emulate(emulate, EMULATE_WHY)
    n_pre = batch.num_reqs - batch.num_decode_reqs
    if n_pre == 0:
        return out
    hq, d = q.shape[1], q.shape[2]
    scale = (sm_scale if sm_scale is not None else d ** -0.5) * math.log2(math.e)
    require_launchable(kern.tq_prefill_kernel)
    grid = (n_pre, hq, cdiv(batch.max_prefill_query_len, cfg["BLOCK_M"]))
    kern.tq_prefill_kernel[grid](
        q, q_rot, k, v, batch.query_start_loc, batch.seq_lens, batch.block_table, *cache.tensors(),
        cache.centroids_half, out, batch.num_decode_reqs, batch.block_table.stride(0), scale,
        HQ=hq, HKV=cache.num_kv_heads, D=d, BLOCK_SIZE=cache.block_size, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], LOOKUP=cfg["LOOKUP"], EMULATE=em, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    return out


def mixed_attention(q, k, v, cache: TurboQuantCache, batch: MixedBatch, *, sm_scale=None,
                    alloc: str = "empty", config=None, emulate: bool | None = None,
                    backend: str = "triton") -> torch.Tensor:
    """One attention step of a mixed batch: store the new tokens into the cache, then decode rows
    [0, num_decode_tokens) and prefill rows [num_decode_tokens, N). q [N, Hq, D]; k, v [N, Hkv, D].

    ``alloc``: "empty" (default) or "zeros" for ``attn_out`` (the lesson switch; zeros costs a fill).
    ``config``: {"store": {...}, "decode": {...}, "prefill": {...}}, each part with the keys of that part
    of :data:`CONFIG` ("decode": of ``CONFIG["cuda_decode"]`` with ``backend="cuda"``).
    ``backend``: the decode kernel, "triton" or "cuda" (:func:`decode_attention`); prefill is Triton's."""
    n, hq, hkv, d = _check_qkv(q, k, v, cache, batch)
    if alloc not in ("empty", "zeros"):
        raise ValueError(f"alloc must be 'empty' or 'zeros', got {alloc!r}")
    cfg = dict(config or {})
    unknown = set(cfg) - {"store", "decode", "prefill"}
    if unknown:
        raise ValueError(f"config takes the keys 'store', 'decode' and 'prefill', got {sorted(unknown)}")
    prove_coverage(batch, n)  # raises CoverageError before anything is launched
    # empty is right: prove_coverage just showed that decode rows [0, nd) and prefill rows [nd, N)
    # are disjoint and cover [0, N); each path writes every (head, dim) of its rows (tests poison it).
    attn_out = (torch.empty if alloc == "empty" else torch.zeros)(n, hq, d, dtype=q.dtype, device=q.device)
    return write_attention(q, k, v, cache, batch, attn_out, sm_scale=sm_scale, config=cfg, emulate=emulate,
                           backend=backend)


def write_attention(q, k, v, cache: TurboQuantCache, batch: MixedBatch, attn_out: torch.Tensor, *,
                    sm_scale=None, config=None, emulate: bool | None = None,
                    backend: str = "triton") -> torch.Tensor:
    """The two writers of a mixed step into a caller's ``attn_out`` [N, Hq, D], WITHOUT the coverage
    proof: store the new tokens, then the decode path writes rows [0, num_decode_tokens) and the
    prefill path rows [num_decode_tokens, num_actual_tokens). Rows beyond are left as they were:
    this is what an engine without the check does (notebook 04 shows it on a padded batch); use
    :func:`mixed_attention`, which proves coverage first."""
    _check_qkv(q, k, v, cache, batch)
    check_tensor("attn_out", attn_out, dtypes=(q.dtype,), ndim=3, device=DEVICE)
    if attn_out.shape[1:] != q.shape[1:] or attn_out.shape[0] < batch.num_actual_tokens:
        raise ValueError(f"attn_out must be [>= {batch.num_actual_tokens}, {q.shape[1]}, {q.shape[2]}], got "
                         f"{tuple(attn_out.shape)}")
    cfg = dict(config or {})
    # what the decode and prefill launchers would refuse, refused before the store writes the cache
    use_cuda = nvcc.check_backend(backend, triton_only=("emulate",) if emulate is not None else ())
    for part, name in (("decode", "cuda_decode" if use_cuda else "decode"), ("prefill", "prefill")):
        _part_config(cfg.get(part), name, name=f"config[{part!r}]")
    if not use_cuda:
        resolve_emulate(emulate, EMULATE_WHY)
    store_kv(k[: batch.num_actual_tokens], v[: batch.num_actual_tokens], cache, batch.slot_mapping,
             config=cfg.get("store"))
    # the Triton kernels read the rotated queries; the CUDA decode kernel rotates its own
    q_rot = rotate_queries(q, cache, sm_scale) if backend != "cuda" or batch.num_reqs > batch.num_decode_reqs else None
    decode_attention(q, cache, batch, attn_out, sm_scale=sm_scale, q_rot=q_rot, config=cfg.get("decode"),
                     emulate=emulate, backend=backend)
    # the prefill path is Triton's with either backend (backend= picks the decode kernel)
    prefill_attention(q, k, v, q_rot, cache, batch, attn_out, sm_scale=sm_scale, config=cfg.get("prefill"),
                      emulate=None if backend == "cuda" else emulate)
    return attn_out


# ----------------------------- Examples for tests and notebooks ----------------------------------------------------

def make_example(query_lens, seq_lens, num_decode_reqs, *, hq=4, hkv=1, d=32, block_size=16,
                 dtype=torch.float32, seed=0, spare_blocks=3, device=None):
    """A cache holding every request's history (positions [0, seq_len - query_len), stored with the
    store kernel), shuffled pages, and the step's q, k, v. Returns (q, k, v, cache, batch)."""
    dev = kernel_device(device)
    g = torch.Generator().manual_seed(seed)
    R = len(query_lens)
    pages = [cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(pages) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g)
    width = max(pages + [1])
    bt = torch.full((R, width), -1, dtype=torch.int32)
    first = [0, *itertools.accumulate(pages)]
    for r in range(R):
        bt[r, : pages[r]] = perm[first[r]: first[r + 1]].to(torch.int32)
    bt[bt < 0] = perm[-1].to(torch.int32)  # unused columns: any page id (never read)
    cache = allocate_cache(num_blocks, block_size, hkv, d, dev)
    hist = [s - n for s, n in zip(seq_lens, query_lens)]
    if sum(hist):  # the history, stored through the store kernel as earlier steps would have
        slots = [int(bt[r, pos // block_size]) * block_size + pos % block_size
                 for r in range(R) for pos in range(hist[r])]
        kh = (torch.randn(sum(hist), hkv, d, generator=g) * 1.5).to(dtype).to(dev)
        vh = torch.randn(sum(hist), hkv, d, generator=g).to(dtype).to(dev)
        store_kv(kh, vh, cache, torch.tensor(slots, dtype=torch.int64, device=dev))
    batch = make_batch(query_lens, seq_lens, bt, num_decode_reqs, block_size=block_size, num_blocks=num_blocks,
                       device=dev)
    n = sum(query_lens)
    q = torch.randn(n, hq, d, generator=g).to(dtype).to(dev)
    k = (torch.randn(n, hkv, d, generator=g) * 1.5).to(dtype).to(dev)
    v = torch.randn(n, hkv, d, generator=g).to(dtype).to(dev)
    return q, k, v, cache, batch
