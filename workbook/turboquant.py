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
  cache folds the correction into its one fp16 scalar per key: ``k_scale = ||k|| / ||c||``.
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

import functools
import math
from dataclasses import dataclass

import torch
import triton

from .device import DEVICE, ON_GPU, check_tensor, require_launchable, resolve_config, same_device
from .device import resolve_emulate as _resolve_emulate
from .kernels import turboquant as kern

__all__ = [
    "hadamard", "coordinate_density", "lloyd_max_centroids", "centroid_boundaries", "sign_magnitude",
    "sign_magnitude_table",
    "QuantizedKeys", "quantize_keys", "dequantize_keys", "QuantizedValues", "quantize_values",
    "dequantize_values", "pack_nibbles", "unpack_nibbles", "key_mse", "mse_table", "PAPER_MSE",
    "TurboQuantCache", "allocate_cache", "slot_bytes", "MixedBatch", "make_batch", "CoverageError",
    "prove_coverage", "store_kv", "store_kv_reference", "dequantize_cache", "reference_attention",
    "reference_mixed_attention", "rotate_queries", "decode_attention", "prefill_attention",
    "mixed_attention", "write_attention", "resolve_emulate", "DECODE_CONFIG", "CUDA_DECODE_CONFIG", "PREFILL_CONFIG", "STORE_CONFIG", "make_example",
    "check_value_quant", "check_unwritten_rows", "check_merge_splits", "merge_splits_reference", "decode_point",
    "benchmark", "plot_rotation_histograms", "plot_centroids", "draw_cache_layout", "plot_benchmark",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
VALUE_BITS = 4
KEY_BITS = 4  # the 4bit_nc preset; the reference path also takes 2 and 3

# The paper's MSE distortion of its MSE quantizer on unit vectors, b = 1..4 (Theorem on D_mse, numeric
# values as quoted by independent summaries of arXiv 2504.19874; not checked here against the paper's
# own text, so printed as "as quoted").
PAPER_MSE = {1: 0.36, 2: 0.117, 3: 0.03, 4: 0.009}


def _is_pow2(n: int) -> bool:
    return isinstance(n, int) and n >= 1 and (n & (n - 1)) == 0


def _check_dim(name: str, d, lo: int = 2) -> None:
    if not _is_pow2(d) or d < lo:
        raise ValueError(f"{name} must be a power of two >= {lo} (the Hadamard rotation is defined "
                         f"for powers of two), got {d}")


# --------------------------------------------------------------------------------------------------
# Rotation and codebook
# --------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------
# Pure-torch quantizers (the reference path; any device)
# --------------------------------------------------------------------------------------------------

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


def key_mse(bits: int, dim: int, n: int = 4096, norm_correction: bool = False, seed: int = 0) -> float:
    """E ||x - dequant(quant(x))||^2 over ``n`` random unit vectors in ``dim`` dimensions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    x = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    xh = dequantize_keys(quantize_keys(x, bits, norm_correction=norm_correction))
    return float(((x - xh) ** 2).sum(-1).mean())


def mse_table(dim: int = 128, bits=(2, 3, 4), n: int = 4096) -> list[dict]:
    """Measured key MSE on random unit vectors beside the paper's bounds and quoted figures."""
    rows = []
    for b in bits:
        rows.append({"bits": b, "mse": key_mse(b, dim, n), "mse_nc": key_mse(b, dim, n, norm_correction=True),
                     "lower_bound": 4.0 ** -b, "upper_bound": math.sqrt(3) * math.pi / 2 * 4.0 ** -b,
                     "paper_quoted": PAPER_MSE.get(b)})
    return rows


# --------------------------------------------------------------------------------------------------
# The paged cache
# --------------------------------------------------------------------------------------------------

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

    @property
    def num_blocks(self) -> int:
        return self.k_codes.shape[0]

    @property
    def num_kv_heads(self) -> int:
        return self.k_codes.shape[1]

    @property
    def block_size(self) -> int:
        return self.k_codes.shape[2]

    @property
    def head_dim(self) -> int:
        return 2 * self.k_codes.shape[3]

    @property
    def device(self) -> torch.device:
        return self.k_codes.device

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
    for name, val in (("num_blocks", num_blocks), ("block_size", block_size), ("num_kv_heads", num_kv_heads)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    dev = torch.device(device or DEVICE)
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


# --------------------------------------------------------------------------------------------------
# Batch metadata and the coverage proof (host side)
# --------------------------------------------------------------------------------------------------

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
    dev = torch.device(device or DEVICE)
    ql = [int(x) for x in (query_lens.tolist() if isinstance(query_lens, torch.Tensor) else query_lens)]
    sl = [int(x) for x in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
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
        need = triton.cdiv(sl[r], block_size)
        if need > bt.shape[1]:
            raise ValueError(f"seq_lens[{r}] = {sl[r]} needs {need} pages of {block_size} tokens but the "
                             f"block table has {bt.shape[1]} columns")
        pages = btc[r, :need]
        if (pages < 0).any() or (pages >= num_blocks).any():
            bad = [int(p) for p in pages if p < 0 or p >= num_blocks][:4]
            raise ValueError(f"block_table[{r}] holds page ids {bad} outside [0, num_blocks={num_blocks})")
    used = torch.cat([btc[r, : triton.cdiv(sl[r], block_size)] for r in range(R)]) if R else btc.new_empty(0)
    if used.unique().numel() != used.numel():
        raise ValueError("two requests (or two positions of one request) share a cache page in block_table: "
                         "their stores would overwrite each other")
    qsl = [0]
    for n in ql:
        qsl.append(qsl[-1] + n)
    slots = []
    for r in range(R):
        for pos in range(sl[r] - ql[r], sl[r]):
            slots.append(int(btc[r, pos // block_size]) * block_size + pos % block_size)
    return MixedBatch(ql, sl, qsl, num_decode_reqs, block_size,
                      torch.tensor(sl, dtype=torch.int32, device=dev),
                      torch.tensor(qsl, dtype=torch.int32, device=dev),
                      bt.to(device=dev, dtype=torch.int32).contiguous(),
                      torch.tensor(slots, dtype=torch.int64, device=dev))


def prove_coverage(batch: MixedBatch, num_rows: int) -> list[tuple[str, int, int]]:
    """Prove, from host metadata only, that the decode rows and the prefill rows of ``attn_out`` are
    disjoint and cover [0, num_rows). Returns [(writer, start, end), ...]; raises CoverageError."""
    nd, nt = batch.num_decode_tokens, batch.num_actual_tokens
    qsl = batch.query_start_host
    plan = [("decode", 0, nd), ("prefill", nd, nt)]
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
    return plan


# --------------------------------------------------------------------------------------------------
# Checks shared by the launchers
# --------------------------------------------------------------------------------------------------

def resolve_emulate(emulate) -> bool:
    """``EMULATE`` for the TurboQuant kernels (:func:`workbook.device.resolve_emulate`)."""
    return _resolve_emulate(emulate, "it runs fp16 tl.dot and inline PTX, which Triton's interpreter gets wrong "
                                     "or cannot run")


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
    return n, hq, hkv, d


def _resolve_config(defaults: dict, config) -> dict:
    return resolve_config(config, defaults)


# Launch configurations. NUM_SPLITS None = enough splits for WAVES programs per multiprocessor
# (at most one split per MIN_SPLIT tokens).
# Decode: 4 warps (one warpgroup: with BLOCK_G = 16 query columns Triton 3.6 emits Hopper's wgmma; with
# 8 it falls back to mma.sync and repacks operands through extra moves), 64 tokens per tile, registers
# capped at 128 per thread (maxnreg: 4 programs per SM instead of 3 at the 139 the compiler picks),
# WAVES x 132 programs. Chosen on the H200 from the configurations the benchmark records side by side
# (turboquant.json: WAVES 16 is a little faster at the largest points, 4 at batch 8 x 4k).
DECODE_CONFIG = {"BLOCK_N": 64, "BLOCK_G": 16, "NUM_SPLITS": None, "WAVES": 8, "MIN_SPLIT": 256,
                 "num_warps": 4, "num_stages": 1, "maxnreg": 128}
# num_stages=1: with 2, Triton 3.6's software pipelining of the cached-prefix loop made an out-of-range
# shared-memory access on the H200 (compute-sanitizer memcheck on tests/test_turboquant.py, 2026-11-30;
# the interpreter cannot see it); no upstream issue filed from here
# The CUDA decode kernel (backend="cuda"): one warp per (request, KV head, split); splits are whole
# 32-token steps (its softmax step). NUM_SPLITS None = as many splits as fill WAVES whole rounds of the
# warps the GPU holds at once (the runtime's occupancy for this kernel; every split of a uniform batch
# is the same work, so a last, partly filled round would cost a whole round's time), at most one split
# per MIN_SPLIT tokens.
CUDA_DECODE_CONFIG = {"NUM_SPLITS": None, "WAVES": 1, "MIN_SPLIT": 256}
CUDA_STEP = 32
PREFILL_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "LOOKUP": 0, "num_warps": 4, "num_stages": 1}
STORE_CONFIG = {"BLOCK_R": 16, "num_warps": 4}
if not ON_GPU:  # the interpreter pays per operation, not per element: few, large programs
    DECODE_CONFIG.update(BLOCK_N=128, BLOCK_G=1, MIN_SPLIT=128, WAVES=1)
    STORE_CONFIG.update(BLOCK_R=256)


def _sm_count() -> int:
    return torch.cuda.get_device_properties(DEVICE).multi_processor_count if ON_GPU else 4


# --------------------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------------------

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
    cfg = _resolve_config(STORE_CONFIG, config)
    require_launchable(kern.tq_store_kernel)
    kern.tq_store_kernel[(triton.cdiv(rows, cfg["BLOCK_R"]),)](
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
    hkv = keys.shape[1]
    g = hq // hkv
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
        L = batch.seq_lens_host[r]
        row = batch.block_table[r]
        if r < batch.num_decode_reqs:
            keys, vals = dequantize_cache(cache, row, L)
            out[a:b] = reference_attention(q[a:b], keys, vals, sm_scale=sm_scale)
        else:
            P = L - (b - a)
            keys, vals = dequantize_cache(cache, row, P)
            keys = torch.cat([keys, k[a:b].float()])
            vals = torch.cat([vals, v[a:b].float()])
            out[a:b] = reference_attention(q[a:b], keys, vals, causal_offset=P, sm_scale=sm_scale)
    return out


def rotate_queries(q: torch.Tensor, cache: TurboQuantCache, sm_scale=None) -> torch.Tensor:
    """``q H * sm_scale * log2(e)`` in fp32: each query rotated once (never a key rotated back)."""
    scale = (sm_scale if sm_scale is not None else q.shape[-1] ** -0.5) * math.log2(math.e)
    memo = cache.__dict__.setdefault("_scaled_rotation", {})
    if scale not in memo:  # H * scale once per scale: one matrix multiply per call, no extra kernel
        memo[scale] = cache.rotation * scale
    return q.float() @ memo[scale]


def _num_splits(cfg, batch_reqs, hkv, max_len):
    if cfg["NUM_SPLITS"] is not None:
        s = int(cfg["NUM_SPLITS"])
        if s < 1:
            raise ValueError(f"config NUM_SPLITS must be >= 1, got {s}")
    else:
        want = triton.cdiv(cfg["WAVES"] * _sm_count(), max(batch_reqs * hkv, 1))
        s = max(1, min(want, triton.cdiv(max_len, cfg["MIN_SPLIT"])))
    split_len = triton.cdiv(triton.cdiv(max_len, s), cfg["BLOCK_N"]) * cfg["BLOCK_N"]
    return triton.cdiv(max_len, split_len), split_len


def _check_cuda_decode(q, cache: TurboQuantCache, hq: int, d: int) -> None:
    """What the CUDA decode kernel (kernels/cuda/turboquant.cu) is written for; the Triton one takes more."""
    hkv = cache.num_kv_heads
    bs = cache.block_size
    if d != 128:
        raise ValueError(f"backend='cuda' decodes head_dim 128 only (its MMA layout is written for it), got {d}; "
                         "use backend='triton'")
    if hq // hkv > 8:
        raise ValueError(f"backend='cuda' takes at most 8 query heads per KV head (one MMA's n = 8), got "
                         f"{hq // hkv}; use backend='triton'")
    if bs < 16 or bs & (bs - 1):
        raise ValueError(f"backend='cuda' needs a block_size that is a power of two >= 16 (a 16-token tile "
                         f"lies in one page), got {bs}; use backend='triton'")
    check_tensor("q", q, dtypes=(torch.float32, torch.float16, torch.bfloat16), ndim=3, device=DEVICE,
                 contiguous=False)
    names = ("k_codes", "k_scale", "v_codes", "v_scale", "v_zero")
    for name, t in zip(names, cache.tensors()):   # cp.async copies 16 bytes: aligned, dense pages
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"backend='cuda' copies cache.{name} 16 bytes at a time: it must be contiguous and "
                             f"start on a 16-byte boundary (a cache from allocate_cache is); use backend='triton'")


def decode_attention(q: torch.Tensor, cache: TurboQuantCache, batch: MixedBatch, out: torch.Tensor,
                     *, sm_scale=None, q_rot: torch.Tensor | None = None, config=None,
                     emulate: bool | None = None, backend: str = "triton") -> torch.Tensor:
    """Rows [0, num_decode_tokens) of ``out`` (and nothing else): split-KV decode over the quantized
    cache for the queries ``q`` [>= num_decode_tokens, Hq, D]. Returns ``out``.

    ``backend``: "triton" (``tq_decode_kernel``; runs in the interpreter too) reads the rotated queries,
    ``q_rot`` from :func:`rotate_queries` (computed here when not given); "cuda" (the CUDA C++ kernel
    ``kernels/cuda/turboquant.cu``, GPU only: head_dim 128, at most 8 query heads per KV head, pages of a
    power of two >= 16 tokens) rotates ``q`` itself, in registers (``q_rot`` is not used). With "cuda",
    ``config`` takes the keys of ``CUDA_DECODE_CONFIG`` and ``emulate`` is refused. Both write the same
    rows from the same partial buffers; each merges them with its own kernel."""
    from .cuda import check_backend

    use_cuda = check_backend(backend, emulate)
    cfg = _resolve_config(CUDA_DECODE_CONFIG if use_cuda else DECODE_CONFIG, config)
    em = False if use_cuda else resolve_emulate(emulate)
    check_tensor("out", out, dtypes=(torch.float32, torch.float16, torch.bfloat16), ndim=3, device=DEVICE)
    B = batch.num_decode_reqs
    for name, t in (("q", q), ("q_rot", q_rot)):
        if t is not None and (t.dim() != 3 or t.shape[1:] != out.shape[1:] or t.shape[0] < B):
            raise ValueError(f"{name} must be [>= num_decode_tokens ({B}), Hq, D] with out's Hq, D "
                             f"{tuple(out.shape[1:])}, got {tuple(t.shape)}")
    if B == 0:
        return out
    hq, d = out.shape[1], out.shape[2]
    hkv = cache.num_kv_heads
    if use_cuda:
        _check_cuda_decode(q, cache, hq, d)
        from .cuda import _cuda_tq_decode, tq_decode_resident_warps

        max_len = batch.max_decode_seq_len
        if cfg["NUM_SPLITS"] is not None:
            S = int(cfg["NUM_SPLITS"])
            if S < 1:
                raise ValueError(f"config NUM_SPLITS must be >= 1, got {S}")
        else:
            index = out.device.index if out.device.index is not None else torch.cuda.current_device()
            S = int(cfg["WAVES"] * tq_decode_resident_warps(index)) // max(B * hkv, 1)
            S = max(1, min(S, triton.cdiv(max_len, cfg["MIN_SPLIT"])))
        split_len = triton.cdiv(triton.cdiv(max(max_len, 1), S), CUDA_STEP) * CUDA_STEP
        S = triton.cdiv(max(max_len, 1), split_len)
        # empty is right: warp (b, KV head, s) of the CUDA kernel writes part_out/part_lse[b, its G
        # heads, s] for every b < B, KV head and split, an empty split included (lse -inf, output 0);
        # the merge reads exactly those entries (the tests poison both buffers).
        part_out = torch.empty(B, hq, S, d, dtype=torch.float32, device=out.device)
        part_lse = torch.empty(B, hq, S, dtype=torch.float32, device=out.device)
        qd = q[:B]   # the kernel loads 16 bytes at a time from [Hq, D]-dense rows: else a fresh (aligned) copy
        if qd.stride(2) != 1 or qd.stride(1) != d or qd.data_ptr() % 16 or qd.stride(0) * qd.element_size() % 16:
            qd = qd.clone(memory_format=torch.contiguous_format)
        scale = (sm_scale if sm_scale is not None else d ** -0.5) * math.log2(math.e) / math.sqrt(d)
        _cuda_tq_decode(qd, scale, cache, batch, S, split_len, part_out, part_lse, out)   # + its merge kernel
        return out
    if q_rot is None:
        q_rot = rotate_queries(q[:B], cache, sm_scale)
    S, split_len = _num_splits(cfg, B, hkv, batch.max_decode_seq_len)
    if S > 1:
        # empty is right: program (b, kv head, s) writes part_out/part_lse[b, its G heads, s] for every
        # b < B, every head and every split, an empty split included (lse = -inf, output 0); the merge
        # reads exactly those entries. The tests poison both buffers.
        part_out = torch.empty(B, hq, S, d, dtype=torch.float32, device=out.device)
        part_lse = torch.empty(B, hq, S, dtype=torch.float32, device=out.device)
    else:
        part_out = part_lse = None
    require_launchable(kern.tq_decode_kernel)
    kern.tq_decode_kernel[(B, hkv, S)](
        q_rot, batch.block_table, batch.seq_lens, cache.k_codes.view(torch.int32), cache.k_scale,
        cache.v_codes.view(torch.int32), cache.v_scale, cache.v_zero, cache.centroids_half,
        *cache.key_table_words, out, part_out, part_lse, batch.block_table.stride(0), split_len,
        HQ=hq, HKV=hkv, D=d, BLOCK_SIZE=cache.block_size,
        BLOCK_G=max(cfg["BLOCK_G"], triton.next_power_of_2(hq // hkv)), BLOCK_N=cfg["BLOCK_N"], NUM_SPLITS=S,
        EMULATE=em, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **({"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] and ON_GPU else {}))
    if S > 1:
        kern.tq_merge_kernel[(B, hq)](part_out, part_lse, out, HQ=hq, D=d, NUM_SPLITS=S,
                                      BLOCK_S=triton.next_power_of_2(S), EMULATE=em, num_warps=4)
    return out


def prefill_attention(q, k, v, q_rot, cache: TurboQuantCache, batch: MixedBatch, out: torch.Tensor,
                      *, sm_scale=None, config=None, emulate: bool | None = None) -> torch.Tensor:
    """Rows [num_decode_tokens, num_actual_tokens) of ``out`` (and nothing else): causal attention of
    each prefill request's new tokens over its cached prefix (quantized) and its own new tokens."""
    cfg = _resolve_config(PREFILL_CONFIG, config)
    em = resolve_emulate(emulate)
    n_pre = batch.num_reqs - batch.num_decode_reqs
    if n_pre == 0:
        return out
    hq, d = q.shape[1], q.shape[2]
    scale = (sm_scale if sm_scale is not None else d ** -0.5) * math.log2(math.e)
    require_launchable(kern.tq_prefill_kernel)
    grid = (n_pre, hq, triton.cdiv(batch.max_prefill_query_len, cfg["BLOCK_M"]))
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
    ``config``: {"decode": {...}, "prefill": {...}} (keys of DECODE_CONFIG / PREFILL_CONFIG).
    ``backend``: the decode kernel, "triton" or "cuda" (:func:`decode_attention`); prefill is Triton's."""
    n, hq, hkv, d = _check_qkv(q, k, v, cache, batch)
    if alloc not in ("empty", "zeros"):
        raise ValueError(f"alloc must be 'empty' or 'zeros', got {alloc!r}")
    cfg = dict(config or {})
    unknown = set(cfg) - {"decode", "prefill"}
    if unknown:
        raise ValueError(f"config takes the keys 'decode' and 'prefill', got {sorted(unknown)}")
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
    store_kv(k[: batch.num_actual_tokens], v[: batch.num_actual_tokens], cache, batch.slot_mapping)
    # the Triton kernels read the rotated queries; the CUDA decode kernel rotates its own
    q_rot = rotate_queries(q, cache, sm_scale) if backend != "cuda" or batch.num_reqs > batch.num_decode_reqs else None
    decode_attention(q, cache, batch, attn_out, sm_scale=sm_scale, q_rot=q_rot, config=cfg.get("decode"),
                     emulate=emulate, backend=backend)
    # the prefill path is Triton's with either backend (backend= picks the decode kernel)
    prefill_attention(q, k, v, q_rot, cache, batch, attn_out, sm_scale=sm_scale, config=cfg.get("prefill"),
                      emulate=None if backend == "cuda" else emulate)
    return attn_out


# --------------------------------------------------------------------------------------------------
# Examples for tests and notebooks
# --------------------------------------------------------------------------------------------------

def make_example(query_lens, seq_lens, num_decode_reqs, *, hq=4, hkv=1, d=32, block_size=16,
                 dtype=torch.float32, seed=0, spare_blocks=3, device=None):
    """A cache holding every request's history (positions [0, seq_len - query_len), stored with the
    store kernel), shuffled pages, and the step's q, k, v. Returns (q, k, v, cache, batch)."""
    dev = torch.device(device or DEVICE)
    g = torch.Generator().manual_seed(seed)
    R = len(query_lens)
    pages = [triton.cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(pages) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g)
    width = max(pages + [1])
    bt = torch.full((R, width), -1, dtype=torch.int32)
    i = 0
    for r in range(R):
        bt[r, : pages[r]] = perm[i: i + pages[r]].to(torch.int32)
        i += pages[r]
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


# --------------------------------------------------------------------------------------------------
# Exercise graders (raise AssertionError with a message that teaches; see workbook.check.grade)
# --------------------------------------------------------------------------------------------------

def check_value_quant(fn) -> None:
    """Exercise 1: fn(v float32 [M, D]) -> (codes uint8 [M, D] in 0..15, scale fp16 [M], zero fp16 [M])."""
    g = torch.Generator().manual_seed(11)
    v = torch.randn(6, 32, generator=g) * torch.tensor([1, 0.01, 100, 1, 3, 1.0])[:, None]
    v[3] = 0.25  # a constant row: scale 0
    ref = quantize_values(v)
    got = fn(v.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise AssertionError(f"return (codes, scale, zero), got {type(got).__name__}")
    codes, scale, zero = got
    for name, t, dt, shape in (("codes", codes, torch.uint8, (6, 32)), ("scale", scale, torch.float16, (6,)),
                               ("zero", zero, torch.float16, (6,))):
        if not isinstance(t, torch.Tensor) or t.dtype != dt or tuple(t.shape) != shape:
            raise AssertionError(f"{name} must be {str(dt)[6:]} {shape}, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if not torch.equal(zero, ref.zero):
        raise AssertionError("zero must be the row minimum rounded to fp16, so that the smallest value gets code 0")
    if not torch.equal(scale, ref.scale):
        r = int((scale != ref.scale).nonzero()[0])
        hint = ""
        if abs(float(scale[r]) * 16 / 15 - float(ref.scale[r])) < 1e-2 * float(ref.scale[r]):
            hint = " 4 bits give 16 codes 0..15, so 15 steps between min and max: scale = (max - min) / 15."
        raise AssertionError(f"row {r}: scale {float(scale[r]):g}, expected {float(ref.scale[r]):g}.{hint}")
    if int(codes.max()) > 15:
        raise AssertionError("codes must fit in 4 bits (0..15): clamp after rounding")
    bad = (codes != ref.codes).nonzero()
    if bad.numel():
        r, c = bad[0].tolist()
        x = float((v[r, c] - ref.zero[r].float()) / ref.scale[r].float()) if ref.scale[r] else 0.0
        hint = ""
        if r == 3:
            hint = " A constant row has scale 0: give it code 0 (dividing by 0 gives NaN)."
        elif int(codes[r, c]) == math.floor(x):
            hint = " Round to the nearest code (floor(x + 1/2)), do not truncate."
        else:
            hint = " Code with the fp16-rounded scale and zero (the ones stored), or dequantization drifts."
        raise AssertionError(f"{len(bad)} codes differ; first at [{r}, {c}]: got {int(codes[r, c])}, expected "
                             f"{int(ref.codes[r, c])} ((v - zero) / scale = {x:.3f}).{hint}")


def check_unwritten_rows(fn) -> None:
    """Exercise 2: fn(query_start_loc list, num_decode_reqs, num_rows) -> sorted list of the rows of
    attn_out that neither the decode path nor the prefill path writes."""
    cases = [([0, 1, 2, 7], 2, 7, []), ([0, 5, 9], 0, 12, [9, 10, 11]), ([0, 1, 2, 7], 2, 8, [7]),
             ([0, 1, 2, 3], 3, 3, []), ([0, 1, 2, 3], 3, 4, [3]), ([0, 4], 0, 4, [])]
    for qsl, nd, n, want in cases:
        got = fn(list(qsl), nd, n)
        try:
            got = sorted(int(x) for x in got)
        except TypeError:
            raise AssertionError(f"return a list of row indices, got {got!r}") from None
        if got != want:
            hint = ""
            if want and got and got == list(range(want[0] + 1, n)):
                hint = " Off by one: query_start_loc[-1] itself is the first row nobody writes."
            elif not got and want:
                hint = (" Rows past query_start_loc[-1] (padding added for a CUDA graph) have no writer: "
                        "torch.empty leaves garbage there.")
            elif got and not want:
                hint = " The decode rows [0, nd) and prefill rows [nd, qsl[-1]) are all written."
            raise AssertionError(f"query_start_loc={qsl}, num_decode_reqs={nd}, attn_out rows={n}: got {got}, "
                                 f"expected {want}.{hint}")


def merge_splits_reference(outs: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """outs [S, D] (each split's normalized output), lse2 [S] (log2 of each split's sum of 2^score;
    -inf for an empty split) -> the merged output [D]."""
    w = torch.exp2(lse2 - lse2.max())
    return (w[:, None] * outs).sum(0) / w.sum()


def check_merge_splits(fn) -> None:
    """Exercise 3: fn(outs [S, D], lse2 [S]) -> [D], the log-sum-exp merge of split outputs."""
    g = torch.Generator().manual_seed(3)
    for S, D, empty in ((2, 4, False), (5, 8, False), (4, 8, True)):
        outs = torch.randn(S, D, generator=g, dtype=torch.float64)
        lse = torch.randn(S, generator=g, dtype=torch.float64) * 4 + 30
        if empty:
            outs[1] = 0.0
            lse[1] = float("-inf")
        ref = merge_splits_reference(outs, lse)
        got = fn(outs.clone(), lse.clone())
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (D,):
            raise AssertionError(f"return a tensor [D={D}], got {getattr(got, 'shape', type(got).__name__)}")
        got = got.double()
        if torch.isnan(got).any():
            raise AssertionError(f"S={S}: NaN in the result. An empty split has lse = -inf: subtract the MAX lse "
                                 "(finite) before exponentiating, so its weight is exactly 0.")
        if not torch.allclose(got, ref, rtol=1e-9, atol=1e-12):
            hint = ""
            if torch.allclose(got, outs.mean(0)) or torch.allclose(got, outs[~torch.isinf(lse)].mean(0)):
                hint = " A plain average ignores how much softmax mass each split holds: weight by 2^lse."
            else:
                w = torch.exp(lse - lse.max())
                if torch.allclose(got, (w[:, None] * outs).sum(0) / w.sum()):
                    hint = " The lse here is in base 2 (the kernels use exp2): weight by 2^(lse - max), not e^."
            raise AssertionError(f"S={S}, D={D}: got {got.tolist()[:3]}..., expected {ref.tolist()[:3]}...{hint}")


# --------------------------------------------------------------------------------------------------
# Benchmark (GPU)
# --------------------------------------------------------------------------------------------------

def _fill_cache_fast(cache: TurboQuantCache, k_bf16, v_bf16, pages: torch.Tensor, chunk_tokens: int = 1 << 16):
    """Quantize a request-major bf16 cache [B, Hkv, T, D] into pages (pure torch, in chunks): the
    benchmark's setup, far faster than one store-kernel program per token at millions of tokens."""
    B, hkv, T, d = k_bf16.shape
    bs = cache.block_size
    H = cache.rotation
    bnd = cache.boundaries[:-1]
    for b in range(B):
        for t0 in range(0, T, chunk_tokens):
            t1 = min(T, t0 + chunk_tokens)
            kk = k_bf16[b, :, t0:t1].float().transpose(0, 1)  # [t, Hkv, D]
            vv = v_bf16[b, :, t0:t1].float().transpose(0, 1)
            norm = torch.linalg.vector_norm(kk, dim=-1)
            codes = sign_magnitude(torch.bucketize((kk / norm.clamp_min(1e-30).unsqueeze(-1)) @ H, bnd))
            c = cache.centroids[codes]
            ks = (norm / torch.linalg.vector_norm(c, dim=-1)).half()
            qv = quantize_values(vv)
            pos = torch.arange(t0, t1, device=kk.device)
            page, off = pages[b, pos // bs].long(), pos % bs
            for h in range(hkv):
                cache.k_codes[page, h, off] = pack_nibbles(codes[:, h].to(torch.uint8))
                cache.k_scale[page, h, off] = ks[:, h]
                cache.v_codes[page, h, off] = pack_nibbles(qv.codes[:, h])
                cache.v_scale[page, h, off] = qv.scale[:, h]
                cache.v_zero[page, h, off] = qv.zero[:, h]


def decode_point(B, T, hq, hkv, d, block_size, timer, eager, configs, seed=0):
    """One (batch, context) point: ours (each config) vs SDPA on the bf16 cache of the same tokens."""
    import torch.nn.functional as F

    from .check import rel_err

    dev = DEVICE
    g = torch.Generator(device=dev).manual_seed(seed)
    k16 = torch.randn(B, hkv, T, d, device=dev, dtype=torch.bfloat16, generator=g)
    v16 = torch.randn(B, hkv, T, d, device=dev, dtype=torch.bfloat16, generator=g)
    q16 = torch.randn(B, hq, 1, d, device=dev, dtype=torch.bfloat16, generator=g)
    pages_per = triton.cdiv(T, block_size)
    num_blocks = B * pages_per
    perm = torch.randperm(num_blocks, device=dev, generator=g).to(torch.int32).view(B, pages_per)
    cache = allocate_cache(num_blocks, block_size, hkv, d, dev)
    _fill_cache_fast(cache, k16, v16, perm)
    batch = MixedBatch([1] * B, [T] * B, list(range(B + 1)), B, block_size,
                       torch.full((B,), T, dtype=torch.int32, device=dev),
                       torch.arange(B + 1, dtype=torch.int32, device=dev), perm.contiguous(),
                       torch.zeros(B, dtype=torch.int64, device=dev))
    q = q16[:, :, 0].contiguous()
    out = torch.empty(B, hq, d, dtype=torch.bfloat16, device=dev)

    def sdpa():
        return F.scaled_dot_product_attention(q16, k16, v16, enable_gqa=True)

    row = {"batch": B, "context": T, "Hq": hq, "Hkv": hkv, "D": d, "block_size": block_size}
    quant_bytes = B * hkv * T * slot_bytes(d)["total"]
    bf16_bytes = 2 * k16.numel() * 2
    row["quant_cache_bytes"], row["bf16_cache_bytes"] = quant_bytes, bf16_bytes
    row["sdpa_graph_us"] = timer(sdpa)
    row["sdpa_eager_us"] = eager(sdpa)
    row["sdpa_read_TBps"] = bf16_bytes / row["sdpa_graph_us"] / 1e6
    ref = sdpa()[:, :, 0].float()
    best = None

    def split(cfg):  # a config may name the backend: {"backend": "cuda", ...}
        cfg = dict(cfg)
        return cfg.pop("backend", "triton"), (cfg or None)

    for name, cfg in configs.items():
        def ours(cfg=cfg):
            be, c = split(cfg)
            return decode_attention(q, cache, batch, out, config=c, backend=be)   # rotation included
        try:
            t = timer(ours)
        except Exception as e:  # noqa: BLE001  (record, keep going)
            row[f"ours_{name}_error"] = f"{type(e).__name__}: {e}"[:300]
            continue
        row[f"ours_{name}_graph_us"] = t
        if best is None or t < row[f"ours_{best}_graph_us"]:
            best = name
    if best is None:
        return row
    be_best, cfg = split(configs[best])
    for be in ("triton", "cuda"):  # the best of each backend, beside the best overall
        times = [row[f"ours_{n}_graph_us"] for n, c in configs.items()
                 if split(c)[0] == be and f"ours_{n}_graph_us" in row]
        if times:
            row[f"{be}_best_graph_us"] = min(times)
            row[f"{be}_speedup_vs_sdpa"] = row["sdpa_graph_us"] / min(times)

    def ours_best():
        return decode_attention(q, cache, batch, out, config=cfg, backend=be_best)

    row["best_config"] = best
    row["ours_graph_us"] = row[f"ours_{best}_graph_us"]
    row["ours_eager_us"] = eager(ours_best)
    row["ours_read_TBps"] = quant_bytes / row["ours_graph_us"] / 1e6
    row["speedup_vs_sdpa"] = row["sdpa_graph_us"] / row["ours_graph_us"]
    ours_best()
    row["rel_err_vs_sdpa_bf16"] = rel_err(out.float(), ref)  # quantization error included
    del k16, v16, cache
    return row


def _mixed_step_point(timer, smoke: bool = False):
    """zeros vs empty for attn_out in a mixed step (store + decode + prefill)."""
    nd, ctx, pre_q, pre_ctx, shape = 32, 4096, [512, 256], [1024, 256], dict(hq=32, hkv=8, d=128)
    if smoke:
        nd, ctx, pre_q, pre_ctx, shape = 2, 20, [5], [7], dict(hq=4, hkv=2, d=32)
    q, k, v, cache, batch = make_example([1] * nd + pre_q, [ctx] * nd + pre_ctx, nd, block_size=16,
                                         dtype=torch.bfloat16, **shape)
    res = {"decode_reqs": nd, "decode_context": ctx, "prefill_query_lens": pre_q, "prefill_context": pre_ctx,
           "attn_out_bytes": q.numel() * q.element_size()}
    for alloc in ("empty", "zeros"):
        res[f"{alloc}_graph_us"] = timer(lambda alloc=alloc: mixed_attention(q, k, v, cache, batch, alloc=alloc))
    res["zeros_over_empty"] = res["zeros_graph_us"] / res["empty_graph_us"]
    return res


def benchmark(smoke: bool = False):
    """H200: decode (Hq=32, Hkv=8, D=128, pages of 16 tokens, shuffled) for batch 8 x context 4k, 32k
    and 64k, batch 32 x 4k and 32k, and batch 128 x 16k, each launch configuration in ``configs``, against SDPA(enable_gqa=True) on a bf16 cache of the same tokens. GPU time from CUDA-graph
    replay (``bench.graph_time_us``), eager per-call time (``bench.time_us``) beside it; read rates;
    zeros vs empty in a mixed step; the key-MSE table. ``smoke=True`` runs the same code on tiny
    sizes with plain wall-clock timers (any device; for testing this function on a CPU)."""
    import time

    from .bench import graph_time_us, require_gpu, time_us

    if smoke:
        def timer(fn):  # wall clock of one call: exercises the code path, measures nothing of note
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        eager = timer
        shapes = [(2, 64)]
        hq, hkv, d, bs = 4, 2, 32, 16
        configs = {"n32_w1": {}, "n64_w2": {"BLOCK_N": 64, "num_warps": 2}}
    else:
        require_gpu("turboquant.benchmark")
        timer = lambda fn: graph_time_us(fn, n=10, windows=3)  # noqa: E731
        eager = time_us
        shapes = [(8, 4096), (8, 32768), (8, 65536), (32, 4096), (32, 32768), (128, 16384)]
        hq, hkv, d, bs = 32, 8, 128, 16
        configs = {"n64_w4_r128_waves8": {}, "n64_w4_r128_waves16": {"WAVES": 16},
                   "cuda_rounds1": {"backend": "cuda"}, "cuda_rounds2": {"backend": "cuda", "WAVES": 2},
                   "cuda_rounds4": {"backend": "cuda", "WAVES": 4}}
    t0 = time.time()
    res = {"shapes": [], "configs": configs, "slot_bytes": slot_bytes(d),
           "timing": "graph_us: GPU time per call from CUDA-graph replay (workbook.bench.graph_time_us, median of 3 "
                     "windows); eager_us: per-call time with host and launch (triton do_bench)"}
    for B, T in shapes:
        try:
            row = decode_point(B, T, hq, hkv, d, bs, timer, eager, configs)
        except torch.OutOfMemoryError as e:  # recorded, not fatal: the other points still run
            row = {"batch": B, "context": T, "error": f"OutOfMemoryError: {str(e)[:200]}"}
        res["shapes"].append(row)
        print({k_: (round(v_, 2) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)
        if ON_GPU:
            torch.cuda.empty_cache()
    try:
        res["mixed_step"] = _mixed_step_point(timer, smoke)
    except Exception as e:  # noqa: BLE001  (recorded; the decode figures above stand)
        if smoke:
            raise
        res["mixed_step"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("mixed", res["mixed_step"], flush=True)
    res["mse"] = mse_table(128 if not smoke else 32, n=4096 if not smoke else 256)
    res["elapsed_s"] = time.time() - t0
    ceilings = {}
    if not smoke:
        from .bench import copy_ceiling_GBps
        ceilings["copy_GBps"] = copy_ceiling_GBps()
    return res, ceilings


# --------------------------------------------------------------------------------------------------
# Pictures
# --------------------------------------------------------------------------------------------------

def plot_rotation_histograms(dim: int = 64, n: int = 2000, seed: int = 0):
    """Coordinates of spiky vectors (a few large channels, like real keys) before and after the
    Hadamard rotation, against the coordinate density of a random unit vector."""
    import matplotlib.pyplot as plt

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g) * 0.2
    x[:, :3] += torch.randn(n, 3, generator=g) * 4  # outlier channels
    u = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    y = u @ hadamard(dim)
    grid = torch.linspace(-1, 1, 801)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    for ax, data, title in ((axes[0], u, "unit keys, as they are"), (axes[1], y, "after the Hadamard rotation")):
        ax.hist(data.flatten().numpy(), bins=160, range=(-1, 1), density=True, color="#4C72B0", alpha=0.7,
                label="coordinates")
        ax.plot(grid.numpy(), coordinate_density(grid, dim).numpy(), "k-", lw=1,
                label=f"density of a random unit vector (d={dim})")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(-1, 1)
        ax.set_yscale("log")
        ax.set_ylim(1e-3, 30)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def plot_centroids(dim: int = 128, bits=(2, 3, 4)):
    import matplotlib.pyplot as plt

    s = 1 / math.sqrt(dim)
    grid = torch.linspace(-4.5 * s, 4.5 * s, 600)
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(grid.numpy(), coordinate_density(grid, dim).numpy(), "k-", lw=1)
    for i, b in enumerate(bits):
        c = lloyd_max_centroids(b, dim)
        ax.plot(c.numpy(), [-(i + 1) * 0.6] * len(c), "|", ms=14, mew=2, label=f"{b} bits: {len(c)} centroids")
    ax.set_xlabel(f"coordinate value (sigma = 1/sqrt({dim}) = {s:.4f})")
    ax.set_yticks([])
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title("Lloyd-Max centroids under the coordinate density", fontsize=10)
    fig.tight_layout()
    return fig


def draw_cache_layout(head_dim: int = 128, block_size: int = 16):
    """One page of the cache for one KV head, bytes drawn to scale, and the block table."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    sb = slot_bytes(head_dim)
    fig, ax = plt.subplots(figsize=(11, 3.4))
    parts = [("k_codes", head_dim // 2, "#4C72B0"), ("k_scale", 2, "#DD8452"), ("v_codes", head_dim // 2, "#55A868"),
             ("v_scale", 2, "#C44E52"), ("v_zero", 2, "#8172B3")]
    rows = 4
    for r in range(rows):
        x = 0
        for name, nb, col in parts:
            ax.add_patch(Rectangle((x, rows - r), nb, 0.8, color=col, alpha=0.85))
            if r == 0:
                ax.text(x + nb / 2, rows + 1.0, f"{name}\n{nb} B", ha="center", va="bottom", fontsize=8)
            x += nb + 3
        ax.text(-2, rows - r + 0.4, f"token {r}", ha="right", va="center", fontsize=8)
    ax.text(-2, 0.4, f"... {block_size} tokens per page", ha="right", fontsize=8)
    ax.text(0, -0.6, f"per (token, KV head): key {sb['key']} B + value {sb['value']} B = {sb['total']} B, vs bf16 "
                     f"{sb['bf16']} B ({sb['ratio']:.2f}x smaller). Byte j of a code row: coordinate 2j in the "
                     "low nibble, 2j+1 in the high nibble.", fontsize=8)
    ax.text(0, -1.4, "block_table[r] = [page ids]: position p of request r lives in page block_table[r][p // "
                     f"{block_size}], slot p % {block_size}; each array is [num_blocks, Hkv, {block_size}, ...]",
            fontsize=8)
    ax.set_xlim(-14, sum(p[1] + 3 for p in parts))
    ax.set_ylim(-1.8, rows + 2.2)
    ax.axis("off")
    ax.set_title(f"The 4bit_nc paged cache, one page of one KV head (D = {head_dim})", fontsize=10)
    fig.tight_layout()
    return fig


def plot_benchmark(rec: dict, label: str = ""):
    """Left: decode time (graph replay) ours vs SDPA per point. Right: speedup and read rates."""
    import matplotlib.pyplot as plt

    rows = [r for r in rec["results"]["shapes"] if "ours_graph_us" in r]
    names = [f"B{r['batch']}\n{r['context'] // 1024}k" for r in rows]
    idx = list(range(len(rows)))
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4))
    w = 0.27
    a.bar([i - w for i in idx], [r["sdpa_graph_us"] for r in rows], w, label="SDPA, bf16 cache")
    for j, (be, name) in enumerate((("triton", "Triton"), ("cuda", "CUDA C++"))):
        if any(f"{be}_best_graph_us" in r for r in rows):
            a.bar([i + j * w for i in idx], [r.get(f"{be}_best_graph_us", float("nan")) for r in rows], w,
                  label=f"TurboQuant 4bit_nc ({name})")
    if not any("triton_best_graph_us" in r or "cuda_best_graph_us" in r for r in rows):  # older records
        a.bar([i + w for i in idx], [r["ours_graph_us"] for r in rows], w, label="TurboQuant 4bit_nc")
    a.set_yscale("log")
    a.set_xticks(idx, names, fontsize=7)
    a.set_ylabel("GPU time per decode step [us]\n(CUDA-graph replay)")
    a.legend(fontsize=8)
    b.plot(idx, [r["speedup_vs_sdpa"] for r in rows], "o-", color="#D1495B", label="speedup vs SDPA (best kernel)")
    b.axhline(2.5, color="k", ls=":", lw=0.8, label="target 2.5x at 32k")
    b.axhline(1.0, color="k", lw=0.6)
    b2 = b.twinx()
    b2.plot(idx, [r["ours_read_TBps"] for r in rows], "s--", color="#4C9F70", label="ours (best): quantized bytes / time")
    b2.plot(idx, [r["sdpa_read_TBps"] for r in rows], "^--", color="#4C72B0", label="SDPA: bf16 bytes / time")
    b2.set_ylabel("TB/s read")
    b.set_xticks(idx, names, fontsize=7)
    b.set_ylabel("speedup")
    h1, l1 = b.get_legend_handles_labels()
    h2, l2 = b2.get_legend_handles_labels()
    b.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper left")
    fig.suptitle(label, fontsize=9)
    fig.tight_layout()
    return fig
