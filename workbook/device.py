"""Where the workbook's kernels run, decided once.

``DEVICE`` is ``cuda`` when PyTorch sees a GPU and ``cpu`` otherwise. On a machine without a GPU the
Triton kernels run in Triton's interpreter, which needs ``TRITON_INTERPRET=1`` in the environment
*before* any ``@triton.jit`` function is defined. This module sets it, so import ``workbook`` (or
``workbook.device``) before anything that defines Triton kernels.

Set ``WORKBOOK_DEVICE=cpu`` to force the interpreter on a GPU machine (handy to see what a workshop
participant without a GPU sees).
"""
from __future__ import annotations

import functools
import os
import sys

import torch

__all__ = [
    "DEVICE", "ON_GPU", "INTERPRETED", "TritonImportOrderError",
    "describe", "require_launchable", "check_tensor", "same_device", "kernel_device", "resolve_config",
    "resolve_emulate", "sm_count", "shared_memory_per_sm", "SM_COUNT_WITHOUT_GPU", "cdiv", "next_pow2",
]


class TritonImportOrderError(RuntimeError):
    """Triton kernels were defined for a GPU on a machine that has none."""


_IMPORT_ORDER_HELP = (
    "No GPU here, so the workbook's Triton kernels must run in Triton's interpreter, which is switched "
    "on by TRITON_INTERPRET=1 *before* the kernels are defined. {what} Fix: restart the Python kernel "
    "and run `import workbook` before anything else that imports triton or torch.compile, or start "
    "Python/Jupyter with TRITON_INTERPRET=1 in the environment."
)


def _choose() -> tuple[torch.device, bool]:
    forced = os.environ.get("WORKBOOK_DEVICE", "").strip().lower()
    if forced not in ("", "cpu", "cuda"):
        raise ValueError(f"WORKBOOK_DEVICE must be 'cpu' or 'cuda', got {forced!r}")
    if forced == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("WORKBOOK_DEVICE=cuda but torch.cuda.is_available() is False")
    on_gpu = torch.cuda.is_available() and forced != "cpu"
    if not on_gpu:
        already = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
        os.environ["TRITON_INTERPRET"] = "1"
        if already:
            # Triton >= 3.4 reads the variable lazily (triton.knobs), so kernels defined from now on
            # are interpreted; older Tritons read it once at import and cannot be switched.
            knobs = getattr(sys.modules["triton"], "knobs", None)
            if knobs is None or not knobs.runtime.interpret:
                raise TritonImportOrderError(_IMPORT_ORDER_HELP.format(
                    what="triton was imported before TRITON_INTERPRET=1 was set, and this Triton "
                         "version cannot switch to the interpreter afterwards."))
    return torch.device("cuda" if on_gpu else "cpu"), on_gpu


DEVICE, ON_GPU = _choose()
INTERPRETED = not ON_GPU


def require_launchable(kernel) -> None:
    """Raise a clear error if ``kernel`` cannot be launched on ``DEVICE``.

    On a CPU-only machine a ``@triton.jit`` function defined before ``TRITON_INTERPRET=1`` was set is
    a compiled-for-GPU ``JITFunction`` and would fail deep inside Triton; say why instead.
    """
    if ON_GPU:
        return
    from triton.runtime.interpreter import InterpretedFunction

    from triton.runtime.autotuner import Autotuner, Heuristics

    fn = kernel
    while isinstance(fn, (Autotuner, Heuristics)):  # wrappers hold the jit function in .fn
        fn = fn.fn
    if not isinstance(fn, InterpretedFunction):
        name = getattr(fn, "__name__", repr(kernel))
        raise TritonImportOrderError(_IMPORT_ORDER_HELP.format(
            what=f"The kernel {name!r} was defined before TRITON_INTERPRET=1 was set (triton was "
                 "imported first), so it was compiled for a GPU."))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) in ints, for a launcher's host path: ``triton.cdiv`` is a JIT function, microseconds a call."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): ``triton.next_power_of_2`` without its JIT call."""
    return 1 << max(int(n) - 1, 0).bit_length()


def same_device(a, b) -> bool:
    """``cuda`` and ``cuda:0`` are the same device when 0 is the current one; types must match."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    # a launch path calls this per argument: is_initialized() is a flag, is_available() reads the environment
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def kernel_device(device, name: str = "device") -> torch.device:
    """``device`` (None: :data:`DEVICE`) as a torch.device where the kernels run, else a ValueError naming it."""
    try:
        dev = torch.device(device or DEVICE)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must name a torch device such as {str(DEVICE)!r}, got {device!r}") from None
    if not same_device(dev, DEVICE):
        raise ValueError(f"{name} is {device!r} but the kernels run on {DEVICE}: allocate there (or pass None)")
    return dev


def check_tensor(name: str, t, *, dtypes=None, ndim=None, device=None, contiguous=True) -> None:
    """Validate a public argument; raise TypeError/ValueError naming the argument and the rule."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name} must have dtype in ({allowed}), got {str(t.dtype).replace('torch.', '')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if device is not None and not same_device(t.device, device):
        raise ValueError(f"{name} is on {t.device} but must be on {device} (the kernels' DEVICE or the other inputs' device)")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (stride {tuple(t.stride())} for shape {tuple(t.shape)}); call .contiguous() first")


def resolve_emulate(emulate, why: str) -> bool:
    """The kernels' one ``EMULATE`` switch from a launcher's ``emulate`` keyword: None -> emulate exactly
    when there is no GPU; True -> the exact emulation also on a GPU (tests run both paths there);
    False -> the GPU's own instructions, which need a GPU. ``why`` names what the interpreter cannot
    run or runs wrongly in that kernel (it goes into the error)."""
    if emulate is None:
        return not ON_GPU
    if not isinstance(emulate, bool):
        raise TypeError(f"emulate must be None, True or False, got {emulate!r}")
    if not emulate and not ON_GPU:
        raise ValueError(f"emulate=False needs a GPU: {why}, and there is no GPU here. Use emulate=None "
                         "(the default) or True.")
    return emulate


def resolve_config(config, defaults: dict, *, name: str = "config", pow2=()) -> dict:
    """The one public launch-configuration argument of every launcher: ``defaults`` updated with
    ``config`` (None, a dict, or a ``triton.Config``; a default that is itself a dict takes a nested
    dict, one per kernel of a multi-kernel launcher). Unknown names raise, so a typo is never
    ignored; the keys in ``pow2`` must be positive powers of two (``tl.arange`` sizes, warps)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in defaults.items()}
    if config is None:
        return out
    if hasattr(config, "kwargs") and hasattr(config, "num_warps"):       # triton.Config
        given = dict(config.kwargs)
        for attr in ("num_warps", "num_stages"):
            if attr in defaults and getattr(config, attr, None) is not None:
                given[attr] = getattr(config, attr)
        config = given
    if not isinstance(config, dict):
        raise TypeError(f"{name} must be a dict or a triton.Config, got {type(config).__name__}")
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; it takes {sorted(defaults)}")
    for k, v in config.items():
        out[k] = resolve_config(v, defaults[k], name=f"{name}[{k!r}]", pow2=pow2) if isinstance(defaults[k], dict) else v
    for k in pow2:
        v = out.get(k)
        if k in out and v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1)):
            raise ValueError(f"{name}[{k!r}] must be a positive power of two (tl.arange sizes and warps are), got {v!r}")
    return out


# What the launch rules assume where there is no GPU: an H200's figures, so that the interpreter runs
# the grid that the recorded GPU runs (it ignores warps and stages, not the grid).
SM_COUNT_WITHOUT_GPU = 132
SHARED_MEMORY_PER_SM_WITHOUT_GPU = 228 << 10


@functools.lru_cache(maxsize=None)
def _gpu_limits(index: int) -> tuple[int, int]:
    p = torch.cuda.get_device_properties(index)
    return p.multi_processor_count, getattr(p, "shared_memory_per_multiprocessor", SHARED_MEMORY_PER_SM_WITHOUT_GPU)


def sm_count() -> int:
    """Streaming multiprocessors of the GPU in use; :data:`SM_COUNT_WITHOUT_GPU` without one. Every
    launch rule that sizes a grid by the SM count asks here (read once per device: no host cost)."""
    return _gpu_limits(torch.cuda.current_device())[0] if ON_GPU else SM_COUNT_WITHOUT_GPU


def shared_memory_per_sm() -> int:
    """Shared memory per SM in bytes of the GPU in use; an H200's 228 KiB without one."""
    return _gpu_limits(torch.cuda.current_device())[1] if ON_GPU else SHARED_MEMORY_PER_SM_WITHOUT_GPU


def describe() -> dict:
    """Versions and the device, as recorded next to every measured result."""
    import platform

    info = {
        "device": str(DEVICE),
        "interpreted": INTERPRETED,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover - triton is a requirement
        info["triton"] = None
    if ON_GPU:
        info["gpu"] = torch.cuda.get_device_name(DEVICE)
        info["cuda"] = torch.version.cuda
        props = torch.cuda.get_device_properties(DEVICE)
        info["sm_count"] = props.multi_processor_count
        info["gpu_memory_GiB"] = round(props.total_memory / 2**30, 1)
    else:
        info["gpu"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info
