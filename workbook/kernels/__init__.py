"""Device code only: Triton ``@triton.jit`` functions, one module per topic (no allocation, no policy).

Imported as ``workbook.kernels.<topic>``, never as a top-level ``kernels`` package: a distribution
called ``kernels`` exists on PyPI, and a top-level name would shadow it or be shadowed by it.
CUDA C++ sources live in ``workbook/kernels/cuda/``.
"""
from .. import device as _device  # noqa: F401  (TRITON_INTERPRET must be set before triton.jit runs)
