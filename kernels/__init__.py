"""Device code only: Triton ``@triton.jit`` functions, one module per topic, plus ``common`` for the
helpers more than one topic uses (no allocation, no policy, no I/O: the launchers in ``workbook/``
allocate and check). CUDA C++ sources go in ``cuda/`` beside these modules.

Where this lives. The folder is the repository's top-level ``kernels/`` (the house the workbook's
brief lays out), but Python only ever sees it as the subpackage ``workbook.kernels``: setuptools'
``package-dir`` maps it (pyproject.toml), so an editable install imports it from any directory and a
wheel holds it as ``workbook/kernels/``. Never ``import kernels``: a distribution called ``kernels``
exists on PyPI, and a top-level name would shadow it or be shadowed by it.

Names in kernel code (as flash-linear-attention writes them). Pointer arguments keep the tensor's
name (``x``, ``q``, ``h0``); ``p_`` marks only a computed pointer, ``o_`` an offset, ``m_`` a mask,
``b_`` a value held in registers; block sizes are ``BLOCK_*`` (or fla's ``BT``/``BK``/``BV``), one
style per file. Optional inputs arrive as ``None`` and become constexpr flags through
``@triton.heuristics``; no placeholder tensor is ever passed in their place. One compile-time switch,
``EMULATE``, means the same thing in every kernel: compute with exact integer/fp32 emulation what the
GPU does with an instruction Triton's interpreter cannot run or runs wrongly (inline PTX, the FP8 and
bf16 casts); tests run both paths on a GPU.
"""
from .. import device as _device  # noqa: F401  (TRITON_INTERPRET must be set before triton.jit runs)
