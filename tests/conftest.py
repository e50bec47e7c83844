"""Import the workbook first: without a GPU it switches Triton to its interpreter before any kernel
is defined (see workbook/device.py)."""
import pytest
import torch

import workbook  # noqa: F401  (must precede any triton import)
from workbook.device import DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def device():
    return DEVICE
