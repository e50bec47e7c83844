"""CUDA C++ versions of the NVFP4 and FP8 quant kernels and of the TurboQuant decode kernel, beside the
Triton ones (issue: "in Triton/CUDA"; engines ship these in CUDA C++).

* Sources: ``kernels/cuda/nvfp4.cu``, ``kernels/cuda/fp8.cu`` and ``kernels/cuda/turboquant.cu`` (packaged as
  ``workbook/kernels/cuda/*.cu``). Device code and ``extern "C"`` launchers taking raw pointers,
  sizes and a ``cudaStream_t``; no torch header, so each compiles on its own with ``nvcc``.
* Build: on first use on a GPU, ``nvcc`` compiles both into one shared library for the H200
  (``-gencode arch=compute_90,code=sm_90``), cached under ``$TORCH_EXTENSIONS_DIR`` (default
  ``~/.cache/torch_extensions``) in a folder named by a hash of the sources, the flags and nvcc's
  version: a second run (or process) loads it without compiling. Python calls the launchers through
  ``ctypes`` with ``data_ptr()``s and ``torch.cuda.current_stream().cuda_stream``. Why not
  ``torch.utils.cpp_extension.load``: it refuses to build when nvcc's CUDA major version differs
  from the one torch was built with (nvcc 13 beside a CUDA 12 torch), and a C launcher needs neither
  pybind11 nor torch's headers. The library links the CUDA runtime statically; it launches on the
  primary context that torch uses, on torch's current stream (CUDA graphs capture it).
* Launchers: ``workbook.nvfp4.nvfp4_quant(..., backend="cuda")`` and
  ``workbook.fp8.silu_mul_quant_fp8_packed / quant_fp8_packed(..., backend="cuda")`` allocate the
  same outputs as the Triton backend (NVFP4 adds a 4 KB scratch table; the functions here,
  ``_cuda_nvfp4_quant`` and ``_cuda_fp8_quant``, say why ``empty`` is right) and give the same bytes.
  ``workbook.turboquant.decode_attention(..., backend="cuda")`` calls ``_cuda_tq_decode``: the decode
  kernel rotates the raw queries itself and writes the split partials (the same ``empty`` buffers as the
  Triton path; the launcher there says why ``empty`` is right), then its merge kernel, launched as a
  programmatic dependent, writes the output rows; ``tq_decode_resident_warps`` sizes the splits from
  the runtime's occupancy.
* Importing this module needs no GPU and no CUDA toolkit; ``backend="cuda"`` without a GPU raises a
  ValueError that says so. ``compile_check`` (tests/test_cuda.py) compiles each source for sm_90 on a
  CPU-only machine where an ``nvcc`` is found.
* ``benchmark()`` (``python -m workbook bench cuda``): CUDA vs Triton vs the copy ceiling at the sizes
  of the Triton records -> workbook/data/cuda.json. ``show(topic)``: the notebook section.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .device import ON_GPU

__all__ = [
    "CUDA_DIR", "SOURCES", "ARCH_FLAGS", "BACKENDS", "find_nvcc", "compile_check", "build", "cache_dir",
    "check_backend", "nvfp4_launch_plan", "silu_mul_bf16_cuda", "silu_fast_is_exact", "sass_counts", "tq_decode_sass", "benchmark", "benchmark_table", "show", "MAPPING",
]

BACKENDS = ("triton", "cuda")


def _cuda_dir() -> Path:
    from workbook import kernels_dir  # the top-level kernels/ folder (package-dir), or the wheel's copy

    return kernels_dir() / "cuda"


CUDA_DIR = _cuda_dir()
SOURCES = {"nvfp4": CUDA_DIR / "nvfp4.cu", "fp8": CUDA_DIR / "fp8.cu", "turboquant": CUDA_DIR / "turboquant.cu"}
ARCH_FLAGS = ["-gencode", "arch=compute_90,code=sm_90"]   # the H200 (Hopper, sm_90)
# the CUDA runtime linked in statically and kept private (no cuda* symbol exported to clash with torch's)
_BUILD_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
                "-Xlinker", "--exclude-libs,ALL", *ARCH_FLAGS]


# --------------------------------------------------------------------------------------------------
# Finding nvcc, compiling
# --------------------------------------------------------------------------------------------------

def find_nvcc() -> tuple[str, list[str]] | None:
    """(path of an nvcc, extra include flags) or None. Looked for in $NVCC, $CUDA_HOME/bin,
    $CUDA_PATH/bin, PATH, /usr/local/cuda/bin, then pip's ``nvidia-cuda-nvcc`` (CUDA 13 wheels put it
    in ``nvidia/cu13/bin``; its headers are in ``nvidia/cu13/include`` and ``include/cccl``, from the
    ``nvidia-cuda-runtime``, ``-crt`` and ``-cccl`` wheels)."""
    cands = [os.environ.get("NVCC")]
    cands += [str(Path(h) / "bin" / "nvcc") for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if h]
    cands += [shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c, []
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("cu13", "cuda_nvcc"):
            nvcc = Path(root) / sub / "bin" / "nvcc"
            if nvcc.is_file():
                inc = Path(root) / sub / "include"
                return str(nvcc), [f"-I{inc}", f"-I{inc / 'cccl'}"]
    return None


def _nvcc_or_raise() -> tuple[str, list[str]]:
    found = find_nvcc()
    if found is None:
        raise RuntimeError("no nvcc found (looked in $NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, "
                           "/usr/local/cuda/bin and pip's nvidia-cuda-nvcc): the CUDA backend compiles "
                           "kernels/cuda/*.cu with nvcc on first use")
    return found


def _run(cmd: list[str]) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{res.stderr.strip()}")


def compile_check(topic: str, out_dir, arch: str = "sm_90") -> Path:
    """Compile ``kernels/cuda/<topic>.cu`` alone to a cubin for ``arch`` (device code only: no GPU
    needed) and return its path. Raises RuntimeError with nvcc's messages if it does not compile."""
    nvcc, extra = _nvcc_or_raise()
    out = Path(out_dir) / f"{topic}_{arch}.cubin"
    _run([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", *extra, "-o", str(out), str(SOURCES[topic])])
    return out


def cache_dir() -> Path:
    """Where built libraries are kept: $TORCH_EXTENSIONS_DIR (torch's extension cache, default
    ~/.cache/torch_extensions) / workbook_cuda."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    return Path(root) / "workbook_cuda"


_lib = None
_lock = threading.Lock()


def _build_key(nvcc: str, extra: list[str]) -> str:
    h = hashlib.sha256()
    for path in SOURCES.values():
        h.update(path.read_bytes())
    h.update(" ".join(_BUILD_FLAGS + extra).encode())
    h.update(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def build(verbose: bool = False):
    """The loaded library (``ctypes.CDLL``), compiled on first use and cached (see module doc)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        nvcc, extra = _nvcc_or_raise()
        where = cache_dir() / _build_key(nvcc, extra)
        so = where / "workbook_cuda.so"
        if not so.exists():
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=where) as tmp:   # build aside, then move: atomic
                part = Path(tmp) / so.name
                cmd = [nvcc, *_BUILD_FLAGS, *extra, "-o", str(part), *map(str, SOURCES.values())]
                if verbose:
                    print(" ".join(cmd))
                _run(cmd)
                os.replace(part, so)
        lib = ctypes.CDLL(str(so))
        vp, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        lib.nvfp4_quant_cuda.argtypes = [vp, vp, vp, vp, vp, i32, i32, i32, i32, i32, i32, i32, i32, vp]
        lib.nvfp4_quant_cuda.restype = i32
        lib.nvfp4_quant_cuda_plan.argtypes = [i32, i32, i32, i32] + [ctypes.POINTER(i32)] * 6
        lib.nvfp4_quant_cuda_plan.restype = i32
        lib.nvfp4_threshold_tables_cuda.argtypes = [vp, i32, i32, vp, i32, vp]
        lib.nvfp4_threshold_tables_cuda.restype = i32
        lib.silu_mul_quant_fp8_cuda.argtypes = [vp, vp, vp, i32, i32, i64, i64, i32, i32, i32, i32, vp]
        lib.silu_mul_quant_fp8_cuda.restype = i32
        lib.silu_mul_bf16_cuda.argtypes = [vp, vp, vp, i32, i32, i32, vp]
        lib.silu_mul_bf16_cuda.restype = i32
        lib.tq_decode_cuda.argtypes = [vp, i32, i64, ctypes.c_float] + [vp] * 10 + [i32] * 14 + [vp]
        lib.tq_decode_cuda.restype = i32
        lib.tq_decode_cuda_warps_per_sm.argtypes = [i32, ctypes.POINTER(i32)]
        lib.tq_decode_cuda_warps_per_sm.restype = i32
        lib.workbook_cuda_error_string.argtypes = [i32]
        lib.workbook_cuda_error_string.restype = ctypes.c_char_p
        _lib = lib
        return lib


def _check(lib, err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"{what}: CUDA error {err} ({lib.workbook_cuda_error_string(err).decode()})")


def _device_stream(t: torch.Tensor) -> tuple[int, int]:
    """(t's device index, torch's current stream on it): the launchers launch there."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(t.device).cuda_stream


def check_backend(backend, emulate=None, config=None) -> bool:
    """True for ``backend='cuda'`` (after checking that it can run here), False for 'triton'. The
    Triton-only keywords ``emulate`` and ``config`` are refused with the CUDA backend."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'triton' or 'cuda', got {backend!r}")
    if backend == "triton":
        return False
    if emulate is not None or config is not None:
        raise ValueError("emulate= and config= choose how the Triton kernel runs; backend='cuda' takes "
                         "neither (it always runs the GPU's conversion instructions, one launch shape)")
    if not ON_GPU:
        raise ValueError("backend='cuda' runs the CUDA C++ kernels (kernels/cuda/*.cu), which need a GPU, "
                         "and there is none here: use backend='triton' (the default; it runs in Triton's "
                         "interpreter on the CPU)")
    return True


def _aligned16(t: torch.Tensor) -> torch.Tensor:
    """t itself if its data starts on a 16-byte boundary (the kernels load 16 bytes at a time), else a
    contiguous copy (a fresh allocation is aligned)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


# --------------------------------------------------------------------------------------------------
# The launchers' CUDA halves (allocation exactly as the Triton launchers allocate)
# --------------------------------------------------------------------------------------------------

def _cuda_nvfp4_quant(x: torch.Tensor, global_scale, *, swizzled: bool = True, write_padding: bool = True,
                      alloc: str = "empty", check_finite: bool = False):
    """``nvfp4_quant(..., backend='cuda')``: the same checks, allocations and bytes as the Triton
    launcher, computed by ``nvfp4_quant_cuda`` (kernels/cuda/nvfp4.cu)."""
    from .nvfp4 import _check_inputs, round_up

    check_backend("cuda")
    M, K, global_scale = _check_inputs(x, global_scale, check_finite)
    if alloc not in ("empty", "zeros"):
        raise ValueError(f"alloc must be 'empty' or 'zeros', got {alloc!r}")
    n = K // 16
    # codes: the tiles of 128 rows x 32 blocks cover all M x K/16 blocks (each quantized whole, or as
    # row pieces by CTAs of the same launch, or as 4 narrow pieces by a second launch), and the thread
    # that owns a real block stores its 8 code bytes: every byte is written, so `empty` is safe.
    codes = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
    new = torch.empty if alloc == "empty" else torch.zeros
    if swizzled:
        sf_rows, sf_cols = round_up(M, 128), round_up(n, 4)
        # scales, swizzled: the CTA of each tile (128 x 32 blocks, or 128 x 8 in the narrow launch) gathers
        # its scale bytes (0 for padded entries: rows >= M, columns >= K/16) and stores its whole 512-byte
        # swizzled tiles (a CTA of a row piece: its 128- or 256-byte run of each; the pieces of a tile
        # make up its whole runs); the tiles cover the padded grid [Mp, Kp], so every byte of the storage,
        # padding included, is written: `empty` is safe (write_padding=False stores only the real
        # entries: the regression).
        sf = new((sf_rows, sf_cols), dtype=torch.uint8, device=x.device)
    else:
        sf_rows, sf_cols = M, n
        # scales, linear: the thread of each real block stores its byte; [M, K/16] is the whole
        # storage: `empty` is safe.
        sf = new((M, n), dtype=torch.uint8, device=x.device)
    if M == 0:
        return codes, sf.view(torch.float8_e4m3fn)
    if M * n >= 1 << 31:
        raise ValueError(f"x of shape {(M, K)} is too large for the CUDA kernel: it numbers the "
                         "16-element blocks below 2^31")
    lib = build()
    xa = _aligned16(x)
    gs = global_scale.reshape(1).contiguous()
    # the threshold table (128 scale bytes x 8 words), scratch: past one wave the table kernel writes it
    # whole before the quantizer reads it (within one wave each CTA builds its own in shared memory and
    # this one is not touched), so `empty` is safe
    table = torch.empty(1024, dtype=torch.int32, device=x.device)
    err = lib.nvfp4_quant_cuda(xa.data_ptr(), gs.data_ptr(), codes.data_ptr(), sf.data_ptr(), table.data_ptr(),
                               M, K, sf_rows, sf_cols, int(x.dtype == torch.bfloat16), int(swizzled),
                               int(write_padding), *_device_stream(x))
    _check(lib, err, "nvfp4_quant_cuda")
    return codes, sf.view(torch.float8_e4m3fn)


def nvfp4_launch_plan(M: int, K: int, dtype: torch.dtype = torch.bfloat16, device=None) -> dict:
    """How ``nvfp4_quant(..., backend='cuda')`` launches an [M, K] input on ``device`` (default: the
    current GPU), by the tail rule in kernels/cuda/nvfp4.cu: ``wide`` CTAs that each quantize a whole
    tile of 128 rows x 32 blocks; ``pieces`` CTAs of the same launch that each quantize ``piece_rows``
    (32 or 64) rows of one of the remaining tiles (0 unless the tiles fit in one wave and would leave
    at most half the SMs a tile more than the others); ``narrow`` CTAs of a second launch, 128 rows x 8
    blocks each (0 unless the tiles would leave a thin last wave after whole ones, or fit in one wave
    and would leave more than half, and at most 7/8, of the SMs a tile more); ``wide_tiles`` (all of
    [M, K] in wide tiles), ``slots`` (the wide CTAs the GPU holds at once: SMs x resident CTAs per SM) and
    ``sms``."""
    check_backend("cuda")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    if M < 0 or K < 0 or K % 16:
        raise ValueError(f"M must be >= 0 and K a multiple of 16 (the block size), got M={M}, K={K}")
    index = torch.cuda.current_device() if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    lib = build()
    out = {k: ctypes.c_int(0) for k in ("wide", "narrow", "slots", "pieces", "piece_rows", "sms")}
    _check(lib, lib.nvfp4_quant_cuda_plan(M, K, int(dtype == torch.bfloat16), index,
                                          *(ctypes.byref(v) for v in out.values())), "nvfp4_quant_cuda_plan")
    plan = {k: v.value for k, v in out.items()}
    plan["wide_tiles"] = -(-M // 128) * -(-(K // 16) // 32)
    return plan


def _nvfp4_threshold_tables(global_scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The quantizer's threshold table (nvfp4_threshold_table_kernel) for each fp32 global scale of
    ``global_scales`` (1-D, on a GPU): int32 [n, 128, 8], word [b, j] = X_j(b) in both 16-bit halves
    (word 7 of each row 0). For tests: a call builds one such table (past one wave) or one per CTA in
    shared memory (within one wave)."""
    check_backend("cuda")
    if global_scales.dim() != 1 or not global_scales.is_cuda:
        raise ValueError(f"global_scales must be a 1-D tensor on a GPU, got shape {tuple(global_scales.shape)} "
                         f"on {global_scales.device}")
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    gs = global_scales.to(torch.float32).contiguous()
    # one block per global scale writes all 1024 words of its table: empty is safe
    tables = torch.empty((gs.numel(), 128, 8), dtype=torch.int32, device=gs.device)
    lib = build()
    _check(lib, lib.nvfp4_threshold_tables_cuda(gs.data_ptr(), gs.numel(), int(dtype == torch.bfloat16),
                                                tables.data_ptr(), *_device_stream(gs)), "nvfp4_threshold_tables_cuda")
    return tables


def _cuda_fp8_quant(src: torch.Tensor, m: int, n: int, silu_mul: bool):
    """The CUDA half of workbook.fp8's launchers (inputs already checked there): src [M, 2N] (gate |
    up) when ``silu_mul``, else y [M, N]; bf16, contiguous. Returns (codes, scales) laid out as the
    Triton backend lays them out."""
    from .fp8 import GROUP_SIZE, num_packed_words, tma_aligned_rows

    check_backend("cuda")
    p = num_packed_words(n // GROUP_SIZE)
    tma_m = tma_aligned_rows(m)
    # codes: one warp per (row, packed word p) writes row m's columns [512p, 512p+512) (those < N);
    # the warps cover every row and word, so every code byte is written: empty is safe.
    codes = torch.empty(m, n, dtype=torch.float8_e4m3fn, device=src.device)
    # scales: storage int32 [P, tma_M]; warp (m, p) stores word p of row m whole (all 4 bytes, the
    # unused ones 0), so the view storage.T[:M, :] is fully written. Rows M..tma_M-1 of storage.T are
    # no element of the returned view and are not written, as in the Triton kernel (workbook.fp8
    # explains why no consumer can read them into a stored output): empty is safe.
    storage = torch.empty(p, tma_m, dtype=torch.int32, device=src.device)
    scales = storage.T[:m, :]
    if m == 0:
        return codes, scales
    if m * p >= 1 << 31:
        raise ValueError(f"M={m} x {p} packed words is too large for the CUDA kernel: it has one warp per "
                         "(row, word), numbered below 2^31")
    lib = build()
    xa = _aligned16(src)
    fast = silu_mul and silu_fast_is_exact()
    err = lib.silu_mul_quant_fp8_cuda(xa.data_ptr(), codes.data_ptr(), storage.data_ptr(), m, n,
                                      xa.stride(0), codes.stride(0), storage.stride(0), int(silu_mul),
                                      int(fast), *_device_stream(src))
    _check(lib, err, "silu_mul_quant_fp8_cuda")
    return codes, scales


_Q_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _cuda_tq_decode(q: torch.Tensor, q_scale: float, cache, batch, num_splits: int, split_len: int,
                    part_out: torch.Tensor, part_lse: torch.Tensor, out: torch.Tensor) -> None:
    """The CUDA half of ``workbook.turboquant.decode_attention(..., backend='cuda')`` (inputs checked
    and buffers allocated there): the decode kernel rotates the raw queries ``q`` [B, Hq, D]
    (fp32/fp16/bf16, [Hq, D] dense, 16-byte aligned rows) times ``q_scale`` and fills part_out
    [B, Hq, S, D] and part_lse [B, Hq, S] for every request, head and split; the merge kernel, launched
    as its programmatic dependent, writes rows [0, B) of ``out`` ([N, Hq, D] dense, q's dtype)
    (kernels/cuda/turboquant.cu)."""
    check_backend("cuda")
    lib = build()
    B, hq = part_out.shape[0], part_out.shape[1]
    t0, t1, t2, t3 = cache.key_table_words
    err = lib.tq_decode_cuda(
        q.data_ptr(), _Q_DTYPES[q.dtype], q.stride(0), ctypes.c_float(q_scale), batch.block_table.data_ptr(),
        batch.seq_lens.data_ptr(), cache.k_codes.data_ptr(),
        cache.k_scale.data_ptr(), cache.v_codes.data_ptr(), cache.v_scale.data_ptr(), cache.v_zero.data_ptr(),
        part_out.data_ptr(), part_lse.data_ptr(), out.data_ptr(), _Q_DTYPES[out.dtype],
        t0, t1, t2, t3, B, hq, cache.num_kv_heads, cache.block_size,
        batch.block_table.stride(0), batch.block_table.shape[1], num_splits, split_len, *_device_stream(q))
    _check(lib, err, "tq_decode_cuda")


_tq_warps: dict = {}


def tq_decode_resident_warps(device_index: int) -> int:
    """Warps of the CUDA decode kernel that the whole GPU holds at once (per-multiprocessor occupancy
    from the CUDA runtime, times the multiprocessors): the launcher sizes its splits to whole rounds."""
    if device_index not in _tq_warps:
        check_backend("cuda")
        lib = build()
        w = ctypes.c_int(0)
        _check(lib, lib.tq_decode_cuda_warps_per_sm(device_index, ctypes.byref(w)), "tq_decode_cuda_warps_per_sm")
        _tq_warps[device_index] = w.value * torch.cuda.get_device_properties(device_index).multi_processor_count
    return _tq_warps[device_index]


def silu_mul_bf16_cuda(gate: torch.Tensor, up: torch.Tensor, fast: bool) -> torch.Tensor:
    """The CUDA kernel's y = bf16(bf16(silu(gate)) * up) on 1-D bf16 tensors of the same size, with
    the FAST silu (ex2.approx, div.full) or torch's sequence (accurate expf, IEEE division)."""
    check_backend("cuda")
    from .device import check_tensor

    for name, t in (("gate", gate), ("up", up)):
        check_tensor(name, t, dtypes=(torch.bfloat16,), ndim=1, device="cuda")
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)} and {tuple(up.shape)}")
    y = torch.empty_like(gate)  # one thread per element writes it: every element written
    lib = build()
    _check(lib, lib.silu_mul_bf16_cuda(gate.data_ptr(), up.data_ptr(), y.data_ptr(), gate.numel(), int(fast),
                                       *_device_stream(gate)), "silu_mul_bf16_cuda")
    return y


_silu_fast: bool | None = None


def silu_fast_is_exact() -> bool:
    """Whether the FAST silu gives torch's ``F.silu(gate.float()).to(bf16)`` for every finite bf16
    gate on this GPU (65280 values: the whole input space, so a proof, as workbook.fp8.silu_impl
    proves Triton's cheaper variants). Checked once per process; the fused kernel uses FAST only if
    so, else torch's own sequence."""
    global _silu_fast
    if _silu_fast is None and torch.cuda.is_current_stream_capturing():
        return False  # no proof inside a graph capture (it copies and compares): torch's sequence
    if _silu_fast is None:
        g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        g = g[torch.isfinite(g.float())].to("cuda")
        ref = torch.nn.functional.silu(g.float()).to(torch.bfloat16)
        got = silu_mul_bf16_cuda(g, torch.ones_like(g), fast=True)
        _silu_fast = bool(torch.equal(got.view(torch.int16), ref.view(torch.int16)))
    return _silu_fast


# --------------------------------------------------------------------------------------------------
# SASS (instruction counts per element, from the cubin)
# --------------------------------------------------------------------------------------------------

def _cuobjdump() -> str | None:
    """cuobjdump from PATH, the CUDA toolkit, or the copy Triton ships (triton/backends/nvidia/bin)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    nv = find_nvcc()
    if nv and (Path(nv[0]).parent / "cuobjdump").is_file():
        return str(Path(nv[0]).parent / "cuobjdump")
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        p = Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if p.is_file():
            return str(p)
    return None


# elements one thread handles: nvfp4, one 16-element block; fp8, 2 x 8 columns per lane; the
# silu-only kernel of the proof, one
_ELEMENTS_PER_THREAD = {"nvfp4_quant_kernel": 16, "silu_mul_quant_fp8_kernel": 16, "silu_mul_bf16_kernel": 1}
_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def sass_counts(out_dir=None) -> dict:
    """Static SASS of each CUDA kernel for sm_90 (compiled here, no GPU needed): per kernel
    instantiation, the instructions up to the first EXIT-terminated main path's end (``main``, the
    out-of-line slow paths of IEEE division after it excluded), all of them (``total``), and
    ``main`` per element (a thread of either quant kernel handles 16 elements per block). The NVFP4
    quantizer loops over blocks: its ``main`` is the loop body that quantizes one block
    (:func:`_block_loop`); the threshold table, built before it (by a one-wave CTA, or by the table
    kernel once per call), is left out. A static count: every
    instruction of that path once, as a thread of a real block executes it. For a loop, ``loads_at``
    lists the positions in it of its global loads (the next step's x)."""
    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (CUDA toolkit or Triton's bundled copy)")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for topic in ("nvfp4", "fp8"):   # the quant kernels (the TurboQuant decode kernel is counted elsewhere)
            cubin = compile_check(topic, out_dir or tmp)
            sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
            name = None
            body: dict[str, list[str]] = {}
            addrs: dict[str, list[int]] = {}
            for line in sass.splitlines():
                if "Function :" in line:
                    name = line.split("Function :")[1].strip()
                    body[name], addrs[name] = [], []
                elif name and (mt := _INSTR.match(line)):
                    body[name].append(mt.group(1))
                    addrs[name].append(int(line.split("/*")[1].split("*/")[0], 16))
            for fn, ins in body.items():
                short = _short(fn)
                if short.startswith("nvfp4_threshold_table_kernel"):
                    continue   # the table kernel: 1024 threads once per call, not per element
                per_thread = _ELEMENTS_PER_THREAD[short.split("<")[0]]
                loop = _block_loop(ins, addrs[fn]) if short.startswith("nvfp4_quant_kernel") else None
                if loop is not None:
                    # a loop over the blocks: its body is what a thread runs per 16-element block
                    main = loop
                else:
                    # main path: up to the last EXIT before the first CALL target / BRA-to-self tail
                    last_exit = max((i for i, s in enumerate(ins) if s.split()[-1] == "EXIT" or s.endswith("EXIT")), default=len(ins) - 1)
                    main = ins[:last_exit + 1]
                out[f"{topic}:{short}"] = {
                    "total": len(ins), "main": len(main),
                    "main_per_element": round(len(main) / per_thread, 2),
                    "ops": _op_histogram(main),
                }
                if loop is not None:   # where the loop issues its global loads (the next block's x)
                    out[f"{topic}:{short}"]["loads_at"] = [i for i, s in enumerate(main) if "LDG" in s]
    return out


def _block_loop(ins: list[str], addrs: list[int]) -> list[str] | None:
    """The instructions of the smallest loop (a backward BRA and its target) that holds a scale
    conversion (F2FP): the NVFP4 quantizer's per-block body (the table built before the loop converts
    scale bytes too, outside any loop). None without one."""
    f2fps = [i for i, s in enumerate(ins) if "F2FP" in s]
    best = None
    for i, s in enumerate(ins):
        op = s.split()
        op = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
        if not op.startswith("BRA") or "0x" not in s:
            continue
        target = int(s.split("0x")[-1].split()[0].rstrip(";"), 16)
        if target > addrs[i] or target not in addrs:
            continue
        j = addrs.index(target)
        if any(j <= f <= i for f in f2fps) and (best is None or i - j < best[1] - best[0]):
            best = (j, i)
    return None if best is None else ins[best[0]:best[1] + 1]


def _short(mangled: str) -> str:
    """'nvfp4_quant_kernel<bf16=1,swizzled=1,write_padding=1>' from a mangled kernel name."""
    known = {"nvfp4_quant_kernel": ("bf16", "swizzled", "write_padding"), "nvfp4_threshold_table_kernel": ("bf16",),
             "silu_mul_quant_fp8_kernel": ("silu_mul", "fast_silu"),
             "silu_mul_bf16_kernel": ("fast_silu",)}
    name = next((k for k in known if k in mangled), mangled)
    keys = known.get(name, ())
    flags = re.findall(r"Lb([01])E", mangled)
    args = [f"{k}={v}" for k, v in zip(keys, flags)]
    if name == "nvfp4_quant_kernel":   # the tile width, an int argument: 32 (wide) or 8 (narrow) blocks
        args += [f"cols={v}" for v in re.findall(r"Li(\d+)E", mangled)]
    return f"{name}<{','.join(args)}>"


# SASS opcodes by what they do in the TurboQuant decode loop (the rest: addresses, masks, loop control)
_TQ_KINDS = {
    "dequant (prmt / lop3 / shifts / packed fp16 subtract)": ("PRMT", "LOP3", "SHF", "HADD2", "HFMA2"),
    "tensor cores and the P transpose (HMMA / MOVM)": ("HMMA", "MOVM"),
    "softmax arithmetic (FMUL/FFMA/FADD/FMNMX/MUFU/F2FP/FSEL)": ("FMUL", "FFMA", "FADD", "FMNMX", "MUFU", "F2FP",
                                                                 "FSEL", "FSETP"),
    "shuffles and votes (the softmax max)": ("SHFL", "VOTE", "WARPSYNC"),
    "shared memory (LDS, LDSM) and cp.async (LDGSTS, waits)": ("LDS", "LDSM", "LDGSTS", "LDGDEPBAR", "DEPBAR"),
    "global loads": ("LDG",),
}


def tq_decode_sass(out_dir=None) -> dict:
    """Static SASS of the CUDA decode kernel's main loop for sm_90 (compiled here with nvcc, no GPU
    needed): the loop is the backward branch whose body holds the matrix multiplies; one iteration is
    one 32-token step of one warp, i.e. 32 x 128 key codes + as many value codes = 256 cache elements
    per thread. Returns instructions per step, per element, the opcode histogram and per-element
    counts by kind (``_TQ_KINDS``). A static count: each instruction of the loop body once (the
    rescale branch, taken on few steps, included)."""
    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (CUDA toolkit or Triton's bundled copy)")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = compile_check("turboquant", out_dir or tmp)
        sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in sass.splitlines() if _INSTR.match(ln)]
    addr = [int(re.match(r"^\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) for ln in lines]
    ins = [_INSTR.match(ln).group(1) for ln in lines]
    def hmma(body):
        return sum(1 for b in body if "HMMA" in b.split()[0] or (b.startswith("@") and "HMMA" in b.split()[1]))

    best = None   # the shortest backward branch around one whole step's matrix multiplies (2 tiles x
    for i, s in enumerate(ins):   # 16 HMMA): the loop's own back edge. The out-of-line warp-divergence
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", s)   # paths after the function's end also jump
        if m and "BRA.DIV" not in s and int(m.group(1), 16) < addr[i]:   # back, over longer spans
            j = addr.index(int(m.group(1), 16))
            body = ins[j:i + 1]
            if hmma(body) >= 32 and (best is None or len(body) < len(best)):
                best = body
    if best is None:
        raise RuntimeError("no loop with matrix multiplies found in the decode kernel's SASS")
    hist = _op_histogram(best)
    per_elem = 256.0
    kinds = {k: 0 for k in _TQ_KINDS}
    other = 0
    for op, n in hist.items():
        kind = next((k for k, ops in _TQ_KINDS.items() if op in ops), None)
        if kind is None:
            other += n
        else:
            kinds[kind] += n
    kinds["addresses, masks, moves, loop control"] = other
    return {"loop_instructions_per_step": len(best), "cache_elements_per_thread_per_step": per_elem,
            "loop_instructions_per_element": round(len(best) / per_elem, 2), "ops": hist,
            "per_element_by_kind": {k: round(v / per_elem, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}}


def _op_histogram(ins: list[str]) -> dict:
    hist: dict[str, int] = {}
    for s in ins:
        op = s.split()
        op = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
        op = op.split(".")[0]
        hist[op] = hist.get(op, 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: -kv[1]))


# --------------------------------------------------------------------------------------------------
# Benchmark (GPU): CUDA vs Triton vs the copy ceiling, at the sizes of the Triton records
# --------------------------------------------------------------------------------------------------

METHODS = {
    "<peer>_us": "gpu_time_graph_replay: per-call GPU time, a CUDA graph of 20 calls replayed "
                 "(workbook.bench.graph_time_us: do_bench median of the replay / 20; nvfp4: median of "
                 "5 windows, as in the nvfp4 record)",
    "<peer>_eager_us": "eager_per_call: triton.testing.do_bench median of one Python call, L2 flushed "
                       "between runs (host work and the launch path included)",
    "<peer>_GBps": "bytes / <peer>_us (fewest bytes: inputs read once, outputs written once)",
    "<peer>_frac_of_copy": "<peer>_GBps / ceilings.copy_GBps",
    "ceilings.copy_GBps": "one 1 GiB fp32 device-to-device copy, do_bench median, bytes read + written",
    "nvfp4_heatmap": "the CUDA backend (swizzled scales) on workbook.nvfp4's heatmap grid, bf16 and fp16: "
                     "us = GPU time from CUDA-graph replay (graph_time_us), frac_of_copy = bytes / us / the "
                     "copy ceiling; copy_same_bytes_us = a device copy of the same bytes, same timer "
                     "(workbook.nvfp4.measure_heatmap); each quantizer timing after settle_s = HEATMAP_SETTLE_S "
                     "seconds of idle GPU, so that no cell inherits the clock of a power-capped cell before it "
                     "(the cells in order: K, then M, then bf16 before fp16); plan = the launch (nvfp4_launch_plan): wide CTAs "
                     "(whole tiles of 128 x 32 blocks), pieces (CTAs of the same launch on piece_rows rows of a "
                     "tile; > 0 where one wave would leave at most half the SMs a tile more), narrow CTAs "
                     "(128 x 8, a second launch; > 0 where the tail rule split a thin last wave, or a wave "
                     "that would leave more than half and at most 7/8 of the SMs a tile more), slots (wide "
                     "CTAs resident at once), sms",
    "power": "workbook.bench.power_probe: a CUDA graph of the calls replayed back to back for 2.5 s while "
             "nvidia-smi samples the SM clock, board power, power limit and clock-event reasons every 50 ms "
             "(the first 0.5 s dropped); power_capped_share = the share of samples with the software power "
             "cap active. The copy, then each size of POWER_SIZES with the CUDA and the Triton NVFP4 launcher",
    "sass_sm90": "CUDA kernels compiled for sm_90 here (nvcc, cuobjdump): static count of the instructions up "
                 "to the main path's EXIT (the out-of-line IEEE-division slow path excluded) / elements per thread",
    "sass_sm90_triton": "Triton kernels as this GPU compiled them (asm['sass']): static count of all "
                        "instructions but NOPs / elements per thread (workbook.nvfp4.sass_counts's method)",
}


POWER_SIZES = [(16384, 8192), (8192, 8192)]   # NVFP4 inputs (bf16) probed for power: many waves, 1.3 waves
HEATMAP_SETTLE_S = 0.5   # seconds the GPU idles before each heatmap cell's timing (METHODS["nvfp4_heatmap"])


def benchmark() -> tuple[dict, dict]:
    """``python -m workbook bench cuda``: for each size of the Triton records (nvfp4: BENCH_SIZES, bf16,
    swizzled scales; fp8: M in BENCH_M at N = BENCH_N, the fused SiLU-mul op), the CUDA and the
    Triton launcher's GPU time from CUDA-graph replay with eager per-call time beside it, the
    fraction of the copy ceiling, and whether both gave the reference's bytes; and the CUDA NVFP4
    backend over the Triton record's heatmap grid (``nvfp4_heatmap``, GPU time from graph replay)."""
    from . import fp8, nvfp4
    from .bench import copy_ceiling_GBps, graph_time_us, power_probe, require_gpu, time_us

    require_gpu("cuda.benchmark")
    build()
    ceiling = copy_ceiling_GBps()

    def timed(row, key, fn, nbytes, windows):
        fn(), fn()
        torch.cuda.synchronize()
        row[f"{key}_eager_us"] = round(time_us(fn), 3)
        row[f"{key}_us"] = round(graph_time_us(fn, windows=windows), 3)
        row[f"{key}_GBps"] = round(nbytes / (row[f"{key}_us"] * 1e-6) / 1e9, 1)
        row[f"{key}_frac_of_copy"] = round(row[f"{key}_GBps"] / ceiling, 3)

    nv_rows = []
    for M, K in nvfp4.BENCH_SIZES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        gs = nvfp4.global_scale_of(x)
        rc, rs = nvfp4.quantize_ref(x, gs)
        cc, cs = _cuda_nvfp4_quant(x, gs)
        tc, ts = nvfp4.nvfp4_quant(x, gs)
        nbytes = nvfp4._bytes_moved(M, K)
        row = {"M": M, "K": K, "bytes": nbytes,
               "exact_cuda": bool(torch.equal(cc, rc) and torch.equal(cs.view(torch.uint8), rs.view(torch.uint8))),
               "exact_triton": bool(torch.equal(tc, rc) and torch.equal(ts.view(torch.uint8), rs.view(torch.uint8))),
               "cuda_equals_triton": bool(torch.equal(cc, tc) and torch.equal(cs.view(torch.uint8), ts.view(torch.uint8)))}
        timed(row, "cuda", lambda: _cuda_nvfp4_quant(x, gs), nbytes, 5)
        timed(row, "triton", lambda: nvfp4.nvfp4_quant(x, gs), nbytes, 5)
        row["cuda_speedup_vs_triton"] = round(row["triton_us"] / row["cuda_us"], 3)
        nv_rows.append(row)
        print(f"  nvfp4 {M:>6}x{K:<5} cuda {row['cuda_us']:8.2f} us ({100 * row['cuda_frac_of_copy']:4.1f}% of copy)"
              f"  triton {row['triton_us']:8.2f} us ({100 * row['triton_frac_of_copy']:4.1f}%)  "
              f"exact cuda={row['exact_cuda']} triton={row['exact_triton']}", flush=True)
        del x, rc, rs, cc, cs, tc, ts
        torch.cuda.empty_cache()

    # the CUDA backend over the Triton record's heatmap grid (every (M, K) of nvfp4.HEATMAP_M x
    # HEATMAP_K, bf16 and fp16; a device copy of the same bytes beside each), the 85% target
    heat = nvfp4.measure_heatmap(ceiling, quant=_cuda_nvfp4_quant, settle_s=HEATMAP_SETTLE_S)
    for r in heat:   # each cell's launch plan (the tail rule: whole tiles, row pieces, narrow CTAs, wave size)
        plan = nvfp4_launch_plan(r["M"], r["K"], getattr(torch, r["dtype"]))
        r["plan"] = {k: plan[k] for k in ("wide", "pieces", "piece_rows", "narrow", "slots", "sms")}

    # power: the SM clock and board power while a copy and the CUDA quantizer run back to back (the
    # quantizer does arithmetic on every byte and can meet the power cap, which lowers the clock)
    power = {}
    try:
        src = torch.randn(1 << 28, device="cuda")
        dst = torch.empty_like(src)
        power["copy 1 GiB (fp32)"] = power_probe(lambda: dst.copy_(src), n=5)
        del src, dst
        for M, K in POWER_SIZES:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            gs = nvfp4.global_scale_of(x)
            power[f"cuda nvfp4 {M}x{K} bf16"] = power_probe(lambda: _cuda_nvfp4_quant(x, gs))
            power[f"triton nvfp4 {M}x{K} bf16"] = power_probe(lambda: nvfp4.nvfp4_quant(x, gs))
            del x
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001  (the timings are recorded regardless)
        power = {"error": f"{type(e).__name__}: {e}"}

    f_rows = []
    n = fp8.BENCH_N
    for m in fp8.BENCH_M:
        x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3
        q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
        qc, sc = _cuda_fp8_quant(x, m, n, True)
        qt, st = fp8.silu_mul_quant_fp8_packed(x)
        nbytes = fp8._bytes_moved(m, n)
        row = {"M": m, "N": n, "bytes": nbytes,
               "exact_cuda": bool(torch.equal(qc.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(sc, s_ref)),
               "exact_triton": bool(torch.equal(qt.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(st, s_ref)),
               "cuda_equals_triton": bool(torch.equal(qc.view(torch.uint8), qt.view(torch.uint8)) and torch.equal(sc, st))}
        timed(row, "cuda", lambda: _cuda_fp8_quant(x, m, n, True), nbytes, 1)
        timed(row, "triton", lambda: fp8.silu_mul_quant_fp8_packed(x), nbytes, 1)
        row["cuda_speedup_vs_triton"] = round(row["triton_us"] / row["cuda_us"], 3)
        f_rows.append(row)
        print(f"  fp8 M={m:>6} N={n} cuda {row['cuda_us']:8.2f} us ({100 * row['cuda_frac_of_copy']:4.1f}% of copy)"
              f"  triton {row['triton_us']:8.2f} us ({100 * row['triton_frac_of_copy']:4.1f}%)  "
              f"exact cuda={row['exact_cuda']} triton={row['exact_triton']}", flush=True)
        del x
        torch.cuda.empty_cache()

    try:
        sass = sass_counts()
    except Exception as e:  # a machine without cuobjdump still records the timings
        sass = {"error": f"{type(e).__name__}: {e}"}
    # the Triton kernels' SASS as this GPU runs them, counted the same way (None where unavailable)
    try:
        triton_sass = {"nvfp4 (512, 4) tile, large inputs": nvfp4.sass_counts(),
                       "nvfp4 (128, 1) tile, small inputs": nvfp4.sass_counts({"BLOCK_S": 128, "num_warps": 1}),
                       "fp8 fused, BLOCK_M = 8": _triton_fp8_sass()}
    except Exception as e:  # noqa: BLE001  (the timings are recorded regardless)
        triton_sass = {"error": f"{type(e).__name__}: {e}"}
    results = {
        "nvfp4": {"rows": nv_rows, "dtype": "bfloat16", "layout": "swizzled",
                  "bytes_model": "read M*K*2 (x) + write M*K/2 (codes) + the swizzled scales"},
        "nvfp4_heatmap": heat,
        "power": power,
        "fp8": {"rows": f_rows, "op": "fused silu-mul + quant (silu_mul_quant_fp8_packed)",
                "bytes_model": "read M*2N*2 (x, bf16) + write M*N (codes) + write M*ceil(N/512)*4 (scales)"},
        "sass_sm90": sass,
        "sass_sm90_triton": triton_sass,
        "build_flags": " ".join(_BUILD_FLAGS),
        "methods": METHODS,
        "timer": "<peer>_us: GPU time per call from CUDA-graph replay; <peer>_eager_us: eager per-call "
                 "time (do_bench, host included)",
    }
    return results, {"copy_GBps": round(ceiling, 1)}


def _triton_fp8_sass() -> dict | None:
    """GPU only: static SASS count of Triton's fused FP8 kernel in one fixed configuration (BLOCK_M = 8,
    not the size rule's default, kept so records compare; 4 warps, the proven SILU_IMPL, EMULATE=False), per element a thread handles; None where the SASS
    cannot be read."""
    import re

    from . import fp8
    from .kernels.fp8 import silu_mul_quant_fp8_kernel

    try:
        m, n, bm, warps = 64, 2048, 8, 4
        x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16)
        codes = torch.empty(m, n, dtype=torch.uint8, device="cuda")
        storage = torch.empty(n // 512, m, dtype=torch.int32, device="cuda")
        compiled = silu_mul_quant_fp8_kernel[(m // bm, n // 512)](
            x, codes, storage, m, n, x.stride(0), codes.stride(0), storage.stride(0), GROUP=128, BLOCK_M=bm,
            SILU_MUL=True, SILU_IMPL=fp8.silu_impl(), EMULATE=False, num_warps=warps)
        sass = compiled.asm["sass"]
    except Exception:  # no cuobjdump, or a Triton without asm["sass"]
        return None
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    ops = [o for o in ops if not o.startswith("NOP")]
    per_thread = bm * 512 / (32 * warps)
    return {"config": [bm, warps], "instructions": len(ops), "elements_per_thread": per_thread,
            "per_element": len(ops) / per_thread}


def benchmark_table(rec: dict, topic: str) -> str:
    """The recorded rows of ``topic`` ('nvfp4' or 'fp8') as a text table, labelled by timer."""
    rows = rec["results"][topic]["rows"]
    size = "K" if topic == "nvfp4" else "N"
    lines = ["GPU time per call (CUDA-graph replay) | eager per-call time (do_bench, host included)",
             f"{'M':>6} {size:>5} {'CUDA us':>9} {'%copy':>6} {'Triton us':>10} {'%copy':>6} "
             f"{'Triton/CUDA':>12} | {'CUDA eager':>10} {'Triton eager':>12}  exact"]
    for r in rows:
        lines.append(f"{r['M']:>6} {r[size]:>5} {r['cuda_us']:9.2f} {100 * r['cuda_frac_of_copy']:5.1f}% "
                     f"{r['triton_us']:10.2f} {100 * r['triton_frac_of_copy']:5.1f}% "
                     f"{r['cuda_speedup_vs_triton']:12.2f} | {r['cuda_eager_us']:10.2f} {r['triton_eager_us']:12.2f}  "
                     f"{r['exact_cuda'] and r['exact_triton'] and r['cuda_equals_triton']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The notebook section (notebook 02: show('nvfp4'); notebook 03: show('fp8'))
# --------------------------------------------------------------------------------------------------

# (CUDA C++ in kernels/cuda/<topic>.cu, its Triton counterpart in kernels/<topic>.py, note)
MAPPING = {
    "nvfp4": [
        ("quant_tile: rg = wide / n_wide; c = c0 + lane; r0 = rg * kRows + wrow; row(j) = r0 + j * kStepRows",
         "pid = tl.program_id(0); start = pid * BLOCK_S",
         "a CTA per tile of 128 rows x 32 blocks (registers capped so that 6 CTAs stay resident per SM; "
         "5 for fp16's narrow tiles), "
         "a thread per block, a warp per row of the tile; where the tiles would leave a thin last wave, "
         "the rest goes to a second launch of narrow tiles (128 x 8 blocks); where they fit in one wave "
         "but would leave up to half the SMs a tile more, those tiles are cut into row pieces of 32 or 64 "
         "rows in the same launch, and up to 7/8 of the SMs, into narrow tiles of a second launch "
         "(plan(): the tail rule). "
         "Triton has one program per BLOCK_S consecutive blocks of x read as one flat sequence (rows end "
         "to end)"),
        ("nxt0 = __ldcs(xw + 2 * b); nxt1 = __ldcs(xw + 2 * b + 1)", "b_w = tl.load(xw + base + o_x)",
         "16 elements as 8 int32 words (two 16-byte loads); in CUDA the next row's loads go out before "
         "this row's arithmetic"),
        ("absmax_x2 (max.xorsign.abs.bf16x2) x 7, unpack_pair, fmaxf(fabsf)",
         "tl.reduce(b_w, 1, _absmax_bf16x2); unpack_pairs; tl.maximum(tl.abs(..))",
         "block amax on packed pairs, the same PTX instruction"),
        ("fminf(div6_rn(__fmul_rn(gs, amax)), 448.f)", "b_sf_want = tl.minimum(div6_rn(b_gs * b_amax), 448.0)",
         "correctly rounded division by 6 in three FP32 operations"),
        ("sf_byte = e4m3_byte(...) (cvt.rn.satfinite.e4m3x2.f32)", "b_sf_want.to(tl.float8e4nv)", "the scale byte"),
        ("threshold_word: X_j(b) in closed form (one wave: by each CTA; else nvfp4_threshold_table_kernel); "
         "s_table[2 * sf_byte]",
         "b_u = tl.where(b_sf > 0.0, b_sf, 2^60) * 2^40; k175, k275, ...",
         "the E2M1 decision points: CUDA turns them into thresholds in x's own format (128 scale bytes x 7): "
         "within one wave each CTA builds them while its first loads of x are in flight, past one wave a "
         "small first kernel builds them once per call (programmatic dependent launch); Triton multiplies "
         "them by each block's scale"),
        ("code_pair: abs.bf16x2, then 3 x set.gt.u32.bf16x2 (a binary search: each mask picks the next "
         "threshold by a bitwise select and is one bit of the index)",
         "e2m1_pair_bits(tl.abs(b_lo*b_gs), tl.abs(b_hi*b_gs), ...): lt01 = tl.clamp(fma(a, -2^40, t), 0, 1)",
         "the E2M1 index, exact either way: CUDA finds the number of thresholds below |x| by a binary "
         "search, two elements per instruction, without converting x; Triton compares RN(|x| gs) with the scaled decision points "
         "(a binary search of saturating FMAs). On sm_100a+ the CUDA source converts with "
         "cvt.rn.satfinite.e2m1x2.f32 instead, under an arch guard: sm_90 has no such instruction"),
        ("code_pair: ... | ((w >> 12) & 0x00080008u); pack4(a); codes[blk] = quant_block(...)",
         "b_nib = b_pair | ((b_w >> 12) & 0x80008); tl.store(codes + base + o_x, ..)",
         "sign bits next to the indices (the same shift in both), two codes per byte, 8 bytes stored at once"),
        ("s_sf[sf_at(lr)] = sf_byte (row-major); then each thread gathers the words of 4 rows and stores 16 "
         "bytes of whole 512-byte tiles",
         "tl.store(sf + o_sf.to(tl.int64), b_sf_byte.to(tl.uint8), mask=m_b); padding programs",
         "the scale bytes. CUDA gathers a tile's bytes (0 for padding) in shared memory and stores whole "
         "512-byte swizzled tiles, so no 32-byte L2 sector is written 4 bytes at a time; write_padding=False "
         "stores the real entries only (the regression). Triton stores each byte at its swizzled address "
         "and writes the padding from separate padding programs"),
    ],
    "fp8": [
        ("warp = global thread / 32; m = warp / P; p = warp - m*P",
         "pid_m = tl.program_id(0); pid_p = tl.program_id(1)",
         "one warp per (row, packed word), where Triton has one program per (BLOCK_M rows, word)"),
        ("col = 512p + 256t + 8*lane; valid[t] = col < N", "o_n = o_g * GROUP + o_k; m_g = o_g * GROUP < N",
         "the 4 groups of word p; a half-warp holds one group of 128"),
        ("g[t], u[t] = 16-byte loads of gate and up", "b_gate, b_up = bf16_to_fp32(tl.load(..)), tl.load(p_in + N)", ""),
        ("silu_mul_bf16x2<FAST>(gw[i], uw[i]): bf16x2_rn(silu_f32(bf16_lo(g)), silu_f32(bf16_hi(g))), then "
         "bf16x2_rn(bf16_lo(s) * bf16_lo(u), bf16_hi(s) * bf16_hi(u))",
         "_silu_mul_bf16(b_gate, b_up, SILU_IMPL, EMULATE=False): round_to_bf16(div(gate, 1 + exp(-gate))), ...",
         "silu in fp32, rounded to bf16, times up, rounded to bf16 (two values per cvt.rn.bf16x2.f32). Both run "
         "torch's sequence (accurate expf, IEEE division) or a cheaper one proven identical on every bf16 gate"),
        ("amax = fmaxf over 8 values, then __shfl_xor_sync over 16 lanes",
         "b_amax = tl.max(tl.abs(b_y), axis=2)", "group amax"),
        ("e = ((abits>>23)&0xFF) - 135 + ((abits&0x7FFFFF) > 0x600000); e = max(e, -33); inv = (127-e)<<23",
         "b_e = ((b_abits >> 23) & 0xFF) - 135 + (...); tl.maximum(b_e, -33); b_inv", "UE8M0 exponent from the bits"),
        ("e4m3x2(y*inv, ...) (cvt.rn.satfinite.e4m3x2.f32), 8-byte store",
         "b_v.to(tl.float8e4nv); tl.store(codes + ..., b_q, mask=m_x)", "codes"),
        ("word = e0 | e1<<8 | e2<<16 | e3<<24 (two __shfl_sync); lane 0: scales[p*stride_sp + m] = word",
         "b_word = tl.sum(b_byte << (8 * o_j)); tl.store(scales + pid_p * stride_sp + o_m, b_word, mask=m_m)",
         "the whole packed word built in registers and stored once; rows M..tma_M-1 untouched"),
    ],
}


def show(topic: str):
    """The CUDA section of a notebook: the source of kernels/cuda/<topic>.cu (IPython Code), the
    line-by-line mapping to the Triton kernel, and the timings of workbook/data/cuda.json (GPU time
    from CUDA-graph replay beside eager per-call time; 'not recorded yet' without a record). On a GPU
    it also times both backends live at one size, labelled live."""
    from IPython.display import Code, Markdown, display

    from .bench import load_record, recorded_label

    if topic not in SOURCES:
        raise ValueError(f"topic must be one of {sorted(SOURCES)}, got {topic!r}")
    display(Markdown(f"**`kernels/cuda/{topic}.cu`** (CUDA C++; the Triton kernel is in `kernels/{topic}.py`). "
                     + _NOTES[topic]))
    display(Code(SOURCES[topic].read_text(), language="cuda"))

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| CUDA C++ | Triton | what |", "|---|---|---|"]
    rows += [f"| `{cell(c)}` | `{cell(t)}` | {cell(w)} |" for c, t, w in MAPPING[topic]]
    display(Markdown("\n".join(rows)))
    try:
        rec = load_record("cuda")
        text = f"CUDA vs Triton, {recorded_label(rec)}\n{benchmark_table(rec, topic)}"
        sass = {k.split(":", 1)[1]: v for k, v in rec["results"].get("sass_sm90", {}).items()
                if k.startswith(f"{topic}:") and "quant" in k}
        if sass:
            text += ("\nSASS for sm_90 (static count per element: the main path / 16 elements per thread; "
                     "NVFP4: the loop body that quantizes one block / 16): ") + ", ".join(
                f"{k} {v['main_per_element']}" for k, v in sass.items())
    except (FileNotFoundError, KeyError, ValueError):
        text = "CUDA vs Triton on the H200: not recorded yet (run `python -m workbook bench cuda` on a GPU)"
    print(text)
    if ON_GPU:
        print(_live(topic))


_NOTES = {
    "nvfp4": ("The same bytes as the Triton kernel, by another route (the header comment of the source says why "
              "each step is exact): the E2M1 index is the count of thresholds below |x|, found by a binary search "
              "(three comparisons in x's own format, two elements at a time) against a table of 128 scale bytes x 7 decision points (built by each CTA "
              "while its first loads are in flight when the tiles fit in one wave, else once per call by a small "
              "first kernel); and each CTA quantizes a tile of 128 rows x 32 blocks and "
              "stores its scale bytes as whole 512-byte swizzled tiles. Blackwell has an instruction for the "
              "E2M1 rounding, `cvt.rn.satfinite.e2m1x2.f32`, but only on its arch-specific targets (sm_100a and "
              "later); the source uses it there, under an arch guard. The E4M3 scale uses the hardware "
              "conversion `cvt.rn.satfinite.e4m3x2.f32`."),
    "fp8": ("The conversions are the hardware ones (`cvt.rn.bf16x2.f32`, `cvt.rn.satfinite.e4m3x2.f32`). SiLU "
            "runs torch's sequence (accurate `expf`, IEEE division) unless a cheaper one (`ex2.approx`, "
            "`div.full`) has been proven to give the same bf16 on every one of the 65280 finite bf16 gates on "
            "this GPU: the proof the Triton launcher runs for its own variants."),
}


def _live(topic: str) -> str:
    """One live measurement per backend on this GPU (graph replay and eager), labelled live."""
    from . import fp8, nvfp4
    from .bench import graph_time_us, time_us

    if topic == "nvfp4":
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        gs = nvfp4.global_scale_of(x)
        fns = {"cuda": lambda: _cuda_nvfp4_quant(x, gs), "triton": lambda: nvfp4.nvfp4_quant(x, gs)}
        size = "M=4096, K=4096"
    else:
        x = torch.randn(4096, 2 * fp8.BENCH_N, device="cuda", dtype=torch.bfloat16)
        fns = {"cuda": lambda: _cuda_fp8_quant(x, 4096, fp8.BENCH_N, True),
               "triton": lambda: fp8.silu_mul_quant_fp8_packed(x)}
        size = f"M=4096, N={fp8.BENCH_N}"
    parts = [f"{k} {graph_time_us(f):.2f} us (graph replay), {time_us(f):.2f} us (eager)" for k, f in fns.items()]
    return f"live on this GPU, {size}: " + "; ".join(parts)
