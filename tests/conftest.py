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


# Under pytest-xdist with --dist loadfile a worker takes whole files in collection order, so a long file
# collected late leaves the other worker idle at the end. These run longest (pytest's slowest
# durations in the CI runs behind workbook/data/cpu_times.json): they go first, the rest keep their
# order, and so do a file's tests and a notebook's cells. A plugin object, so that this conftest can
# hold another pytest_collection_modifyitems (below).
RUN_FIRST = ("tests/test_exercises.py", "tests/test_jupyterlab.py", "notebooks/06_buffers_block_fusion.ipynb",
             "tests/test_fusion.py")


class _LongFilesFirst:
    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        root = config.rootpath.resolve()

        def rank(item):
            try:
                rel = item.path.resolve().relative_to(root).as_posix()
            except ValueError:
                return len(RUN_FIRST)
            return RUN_FIRST.index(rel) if rel in RUN_FIRST else len(RUN_FIRST)

        items.sort(key=rank)          # stable: the order within a file is kept


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_LongFilesFirst(), "workbook-long-files-first")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def device():
    return DEVICE


@pytest.hookimpl(trylast=True)     # after -k/-m have deselected what they deselect
def pytest_collection_modifyitems(config, items):
    """One execution per notebook. tests/test_exercises.py runs each notebook that has exercises as a
    participant would (stubs in place, then every solution inserted and graded) and checks every cell
    marked NBVAL_CHECK_OUTPUT against the committed outputs, as nbval --nbval-lax does. When that test
    is selected for a notebook, nbval's own run of the same notebook is left out (reported as
    deselected); run alone (``pytest --nbval-lax notebooks/01_allocate_then_overwrite.ipynb``), nbval
    runs it as usual."""
    covered = {item.callspec.params["name"] for item in items
               if getattr(item, "originalname", "") == "test_participant_notebook_reproduces_the_checked_outputs"}
    if not covered:
        return
    drop = [item for item in items if item.path.suffix == ".ipynb" and item.path.name in covered]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item.path.suffix != ".ipynb" or item.path.name not in covered]
