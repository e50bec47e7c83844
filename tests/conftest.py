"""Import the workbook first: without a GPU it switches Triton to its interpreter before any kernel
is defined (see workbook/device.py).

Under pytest-xdist (the README's test command runs ``-n 2``) each worker gets its share of the cores
for torch's intra-op threads, and so do the processes it starts (nbval's notebook kernels, the
notebook runs of test_exercises, subprocess tests) through OMP_NUM_THREADS: two workers with two
threads each on two cores would only fight over them.
"""
import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _threads = max(1, (os.cpu_count() or 1) // max(1, _workers))
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(_threads))

import pytest  # noqa: E402
import torch  # noqa: E402

import workbook  # noqa: F401,E402  (must precede any triton import)
from workbook.device import DEVICE  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def device():
    return DEVICE
