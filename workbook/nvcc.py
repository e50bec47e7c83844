"""The CUDA C++ build: ``kernels/cuda/*.cu`` compiled by ``nvcc`` into one shared library, called
through ``ctypes``. The topics' launchers (``workbook.nvfp4``, ``workbook.fp8``,
``workbook.turboquant``) take ``backend="cuda"`` and call the library from here; this module knows no
topic's arguments beyond the C signatures it declares.

* Sources: ``kernels/cuda/<topic>.cu`` (packaged as ``workbook/kernels/cuda/*.cu``): device code and
  ``extern "C"`` launchers taking raw pointers, sizes and a ``cudaStream_t``; no torch header, so each
  compiles on its own.
* Build: on first use on a GPU, ``nvcc`` compiles them into one library for the H200
  (``-gencode arch=compute_90,code=sm_90``), cached under ``$TORCH_EXTENSIONS_DIR`` (default
  ``~/.cache/torch_extensions``) in a folder named by a hash of the sources, the flags and nvcc's
  version: a second process loads it without compiling. Why not ``torch.utils.cpp_extension.load``:
  it refuses to build when nvcc's CUDA major version differs from torch's, and a C launcher needs
  neither pybind11 nor torch's headers. The CUDA runtime is linked statically and kept private; the
  kernels launch on torch's primary context and current stream (CUDA graphs capture them).
* Importing this module needs no GPU and no CUDA toolkit; ``backend="cuda"`` without a GPU raises a
  ValueError that says so (:func:`check_backend`). :func:`compile_check` compiles one source for
  sm_90 on a CPU-only machine where an ``nvcc`` is found.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

from .device import ON_GPU

__all__ = [
    "CUDA_DIR", "SOURCES", "ARCH_FLAGS", "BACKENDS", "find_nvcc", "compile_check", "build", "cache_dir",
    "check_backend", "check_error", "device_stream", "aligned16", "cuobjdump", "BUILD_FLAGS",
]

BACKENDS = ("triton", "cuda")


def _cuda_dir() -> Path:
    from workbook import kernels_dir  # the top-level kernels/ folder (package-dir), or the wheel's copy

    return kernels_dir() / "cuda"


CUDA_DIR = _cuda_dir()
SOURCES = {"nvfp4": CUDA_DIR / "nvfp4.cu", "fp8": CUDA_DIR / "fp8.cu", "turboquant": CUDA_DIR / "turboquant.cu"}
ARCH_FLAGS = ["-gencode", "arch=compute_90,code=sm_90"]   # the H200 (Hopper, sm_90)
# the CUDA runtime linked in statically and kept private (no cuda* symbol exported to clash with torch's)
BUILD_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
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


def compile_check(topic: str, out_dir, arch: str = "sm_90", source=None) -> Path:
    """Compile ``kernels/cuda/<topic>.cu`` (or ``source``, another version of that file: a variant
    kept on a branch) alone to a cubin for ``arch`` (device code only: no GPU needed) and return its
    path. Raises RuntimeError with nvcc's messages if it does not compile."""
    nvcc, extra = _nvcc_or_raise()
    out = Path(out_dir) / f"{topic}_{arch}.cubin"
    src = SOURCES[topic] if source is None else Path(source)
    _run([nvcc, f"-arch={arch}", "-cubin", "-std=c++17", *extra, "-o", str(out), str(src)])
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
    h.update(" ".join(BUILD_FLAGS + extra).encode())
    h.update(subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.encode())
    return h.hexdigest()[:16]


def build(verbose: bool = False):
    """The loaded library (``ctypes.CDLL``), compiled on first use and cached (see module doc). The C
    signatures of every launcher are declared here, once."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        nvcc, extra = _nvcc_or_raise()
        where = cache_dir() / _build_key(nvcc, extra)
        so = where / "workbook_cuda.so"
        if not so.exists():   # say so once: the first compile takes about a minute, in silence otherwise
            print(f"workbook: compiling {', '.join(p.name for p in SOURCES.values())} with nvcc (first use of "
                  f"backend='cuda' with these sources; cached in {where})", file=sys.stderr, flush=True)
            where.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=where) as tmp:   # build aside, then move: atomic
                part = Path(tmp) / so.name
                cmd = [nvcc, *BUILD_FLAGS, *extra, "-o", str(part), *map(str, SOURCES.values())]
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
        lib.tq_decode_cuda.argtypes = [vp, i32, i64, ctypes.c_float] + [vp] * 10 + [i32] * 15 + [vp, i32]
        lib.tq_decode_cuda.restype = i32
        lib.tq_decode_cuda_warps_per_sm.argtypes = [i32, ctypes.POINTER(i32)]
        lib.tq_decode_cuda_warps_per_sm.restype = i32
        lib.workbook_cuda_error_string.argtypes = [i32]
        lib.workbook_cuda_error_string.restype = ctypes.c_char_p
        _lib = lib
        return lib


def check_error(lib, err: int, what: str) -> None:
    if err:
        raise RuntimeError(f"{what}: CUDA error {err} ({lib.workbook_cuda_error_string(err).decode()})")


def device_stream(t: torch.Tensor) -> tuple[int, int]:
    """(t's device index, torch's current stream on it): the launchers launch there."""
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(t.device).cuda_stream


def check_backend(backend, triton_only=()) -> bool:
    """True for ``backend='cuda'`` (after checking that it can run here), False for 'triton'.
    ``triton_only`` names the keywords the caller was given that only the Triton kernel takes (e.g.
    ``("config",)``): they are refused with the CUDA backend."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be 'triton' or 'cuda', got {backend!r}")
    if backend == "triton":
        return False
    if triton_only:
        given = " and ".join(f"{name}=" for name in triton_only)
        raise ValueError(f"{given} choose{'s' if len(triton_only) == 1 else ''} how the Triton kernel runs: "
                         f"backend='cuda' does not take {'it' if len(triton_only) == 1 else 'them'} (the CUDA "
                         "kernels always run the GPU's own conversion instructions)")
    if not ON_GPU:
        raise ValueError("backend='cuda' runs the CUDA C++ kernels (kernels/cuda/*.cu), which need a GPU, "
                         "and there is none here: use backend='triton' (the default; it runs in Triton's "
                         "interpreter on the CPU)")
    return True


def aligned16(t: torch.Tensor) -> torch.Tensor:
    """t itself if its data starts on a 16-byte boundary (the kernels load 16 bytes at a time), else a
    contiguous copy (a fresh allocation is aligned)."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def cuobjdump() -> str | None:
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
