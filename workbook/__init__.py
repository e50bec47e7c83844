"""The companion package of the allocate-then-overwrite workbook.

Import it before anything that defines Triton kernels: :mod:`workbook.device` decides once where the
kernels run and, without a GPU, switches Triton to its interpreter.
"""
from .device import DEVICE, INTERPRETED, ON_GPU  # noqa: F401  (sets TRITON_INTERPRET first)

__version__ = "0.1.0"


def kernels_dir():
    """The folder that holds the device code: the repository's top-level ``kernels/`` (mapped to
    ``workbook.kernels`` by setuptools' package-dir), or ``workbook/kernels/`` in a wheel.

    Found through a module file, not ``workbook.kernels.__file__``/``__path__``: an editable install
    may present the mapped folder as a namespace package with neither (seen with setuptools 81)."""
    from pathlib import Path

    from .kernels import common

    return Path(common.__file__).resolve().parent
