"""The companion package of the allocate-then-overwrite workbook.

Import it before anything that defines Triton kernels: :mod:`workbook.device` decides once where the
kernels run and, without a GPU, switches Triton to its interpreter.
"""
from .device import DEVICE, INTERPRETED, ON_GPU  # noqa: F401  (sets TRITON_INTERPRET first)

__version__ = "0.1.0"
