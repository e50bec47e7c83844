import pytest
import torch

from workbook.coverage import assert_fully_written, coverage
from workbook.start_here import environment_report, iota


@pytest.mark.parametrize("n", [1, 63, 64, 65, 200])
def test_iota_writes_every_element(n):
    (cov,) = assert_fully_written(iota, n, block=64)
    assert cov.storage_shape == (n,)
    assert torch.equal(iota(n).cpu(), torch.arange(n, dtype=torch.int32))


def test_a_short_grid_leaves_the_tail_unwritten():
    (cov,) = coverage(iota, 200, block=64, grid=200 // 64)
    assert cov.unwritten_ranges("view") == "flat elements 192..199"


def test_bad_input():
    with pytest.raises(ValueError, match="block must be a power of two"):
        iota(10, block=48)
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        iota(-1)


def test_environment_report():
    assert "a Triton kernel ran and wrote the right values: yes" in environment_report()
