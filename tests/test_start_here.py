import pytest
import torch
import triton

from workbook.coverage import assert_fully_written, coverage
from workbook.start_here import environment_report, iota


@pytest.mark.parametrize("n, block", [(1, 64), (63, 64), (64, 64), (65, 64), (200, 64), (200, 16)])
def test_iota_writes_every_element(n, block):
    # the output is poisoned two ways (workbook.coverage) and its whole storage checked
    (cov,) = assert_fully_written(iota, n, config={"BLOCK": block})
    assert cov.storage_shape == (n,)
    assert torch.equal(iota(n, config={"BLOCK": block}).cpu(), torch.arange(n, dtype=torch.int32))


def test_a_short_grid_leaves_the_tail_unwritten():
    (cov,) = coverage(iota, 200, config={"BLOCK": 64}, grid=200 // 64)
    assert cov.unwritten_ranges("view") == "flat elements 192..199"


def test_config_as_a_triton_config():
    cfg = triton.Config({"BLOCK": 32}, num_warps=2)
    assert torch.equal(iota(70, config=cfg).cpu(), torch.arange(70, dtype=torch.int32))


def test_bad_input():
    with pytest.raises(ValueError, match=r"config\['BLOCK'\] must be a positive power of two"):
        iota(10, config={"BLOCK": 48})
    with pytest.raises(ValueError, match=r"unknown keys \['block'\]"):
        iota(10, config={"block": 64})
    with pytest.raises(TypeError, match="config must be a dict or a triton.Config"):
        iota(10, config=64)
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        iota(-1)


def test_the_default_config_is_CONFIG():
    from workbook.start_here import CONFIG

    assert CONFIG == {"BLOCK": 64, "num_warps": 4}
    (cov,) = coverage(iota, 200, grid=triton.cdiv(200, CONFIG["BLOCK"]))   # the default grid and config
    assert cov.view_fully_written


def test_environment_report():
    assert "a Triton kernel ran and wrote the right values: yes" in environment_report()


# ---- the grader of exercise 0 (notebook 00) --------------------------------------------------------

from workbook.check import grade  # noqa: E402
from workbook.graders.start_here import check_iota_grid, solution_iota_grid  # noqa: E402


def _verdict(capsys, fn):
    v = grade("exercise 0", lambda: check_iota_grid(fn))
    return v, capsys.readouterr().out


def _stub(n, block):
    raise NotImplementedError


def test_grid_grader_passes_the_solutions(capsys):
    import math

    import numpy as np
    import triton

    for fn in (solution_iota_grid, triton.cdiv, lambda n, b: math.ceil(n / b),
               lambda n, b: np.int64(-(-n // b))):
        v, out = _verdict(capsys, fn)
        assert v and v.status == "passed", out


def test_grid_grader_stub_is_not_attempted(capsys):
    v, out = _verdict(capsys, _stub)
    assert not v and v.status == "not attempted" and "not attempted yet" in out


@pytest.mark.parametrize("wrong, message", [
    (lambda n, b: n // b, "grid=0 leaves flat elements 0 unwritten"),             # floor division
    (lambda n, b: round(n / b), "Round the division UP"),                         # rounds 1/64 to 0
    (lambda n, b: n // b + 1, "n=64, block=64: grid=2 launches 1 program(s)"),  # one too many on multiples
    (lambda n, b: n, "write nothing"),                                            # one program per element
    (lambda n, b: n / b, "return a whole number of programs"),                    # a float
    (lambda n, b: -1, "cannot be negative"),
    (lambda n, b: (n + b) // b, "n=64, block=64: grid=2 launches 1 program(s)"),  # "round up" by adding a block
    (lambda n, b: n // b or 1, "n=65, block=64: grid=1 leaves flat elements 64 unwritten"),  # floor, at least 1
    (lambda n, b: __import__("numpy").ceil(n / b), "(float64). n / block is a float: round it up to an int"),       # ceil, still a float
])
def test_grid_grader_fails_wrong_answers_with_the_intended_message(capsys, wrong, message):
    v, out = _verdict(capsys, wrong)
    assert not v and v.status == "wrong", out
    assert message in out, out


def test_notebook_map_lists_exactly_the_notebooks_that_exist(tmp_path):
    from workbook.start_here import NOTEBOOKS, notebook_map

    (tmp_path / "01_allocate_then_overwrite.ipynb").write_text("{}")
    (tmp_path / "05_gated_deltanet.ipynb").write_text("{}")
    table = notebook_map(tmp_path)
    assert "`01_allocate_then_overwrite`" in table and "`05_gated_deltanet`" in table
    assert "`02_nvfp4_quant`" not in table and len(table.splitlines()) == 2 + 2
    assert len(notebook_map(tmp_path / "absent").splitlines()) == 2 + len(NOTEBOOKS)   # installed wheel
    assert "`00_start_here`" not in notebook_map()                                     # the repository's own
