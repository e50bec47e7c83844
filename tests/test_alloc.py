"""Notebook 01's topic: the demos (workbook/alloc.py) on this machine, the recorded alloc figures and
their readers (workbook/benchmarks/alloc.py), the benchmark's pieces on a GPU, the pictures, and the
graders of exercises 1.1 and 1.2 (workbook/graders/alloc.py) against their solutions, their stubs and
tables of wrong answers.
The record schema itself is tests/test_records.py; the timers are tests/test_timing.py."""
import copy

import numpy as np
import pytest
import torch

from workbook import alloc, records
from workbook.benchmarks import alloc as alloc_bench
from workbook.benchmarks.alloc import SMOKE_SIZES, SWEEP_SIZES, fill_rate_table, fill_sweep
from workbook.check import grade
from workbook.device import ON_GPU
from workbook.graders.alloc import (check_pad_rows, check_zero_fill_prediction, solution_pad_rows,
                                    solution_zero_fill_prediction)
from workbook.records import Measurement, NotRecorded, load_record, time_keys, validate_record

FILL_DTYPES = alloc.FILL_DTYPES


# ---- the recorded figures ---------------------------------------------------------------------------

def test_recorded_alloc_sweep_covers_4KiB_to_1GiB():
    rec = load_record("alloc")
    rows = rec["results"]["sweep"]
    assert [r["bytes"] for r in rows] == SWEEP_SIZES == [4096 * 4**i for i in range(10)]
    assert SWEEP_SIZES[-1] == 1 << 30 and SMOKE_SIZES == [4 << 10, 256 << 10, 16 << 20, 1 << 30]
    for r in rows:
        for k in ("zeros_eager_us", "empty_eager_us", "zeros_overwrite_eager_us", "empty_overwrite_eager_us",
                  "fill_eager_us", "zeros_overwrite_graph_us", "empty_overwrite_graph_us"):
            assert r[k] > 0, k
        assert r["overwrite_eager_ratio"] == pytest.approx(r["zeros_overwrite_eager_us"] / r["empty_overwrite_eager_us"])
        assert r["overwrite_graph_ratio"] == pytest.approx(r["zeros_overwrite_graph_us"] / r["empty_overwrite_graph_us"])
        assert r["fill_eager_GBps"] == pytest.approx(r["bytes"] / r["fill_eager_us"] / 1e3)
        assert set(r["fill_by_dtype"]) == set(FILL_DTYPES)
        for per in r["fill_by_dtype"].values():
            assert set(per) == {"eager_us", "eager_GBps", "graph_us", "graph_GBps"}
            assert per["eager_GBps"] == pytest.approx(r["bytes"] / per["eager_us"] / 1e3)
            assert per["graph_GBps"] == pytest.approx(r["bytes"] / per["graph_us"] / 1e3)
    assert rec["ceilings"]["copy_GBps"] > 1000
    g = rec["results"]["graph"]
    assert g["zeros_graph_us"] > 0 and g["empty_graph_us"] > 0 and g["n_buffers"] >= 10
    assert g["ratio"] == pytest.approx(g["zeros_graph_us"] / g["empty_graph_us"])
    names = " ".join(e["name"] for e in rec["results"]["profile"]["zeros"])
    assert "Fill" in names, "the profiler view must show the fill kernel that zeros adds"
    assert "Fill" not in " ".join(e["name"] for e in rec["results"]["profile"]["empty"])
    assert all(e["profiler_us"] > 0 for a in ("zeros", "empty") for e in rec["results"]["profile"][a])
    assert all("FillFunctor" in k for k in rec["results"]["fill_kernels"].values())
    ev = rec["results"]["fill_events"]
    assert ev["GBps"] == pytest.approx(ev["bytes"] / ev["fill_events_us"] / 1e3)
    assert rec["results"]["stale_bytes"]["replays"][1][-1] == 100.0


def test_recorded_timers_and_notes_are_what_the_benchmark_writes():
    """The record names the timers run() names, and every timer it names took a figure of it."""
    rec = load_record("alloc")
    assert rec["timers"] == alloc_bench.TIMERS and rec["results"]["notes"] == alloc_bench.NOTES
    keys = " ".join(path for path, _ in time_keys(rec["results"]))
    for timer in rec["timers"]:
        assert f"{timer}_us" in keys, timer


def test_benchmark_refuses_without_gpu_and_a_measurement_reads_as_a_record():
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="measures a GPU"):
            alloc_bench.run(smoke=True)
    rec = load_record("alloc")
    live = records.as_record("alloc", Measurement(rec["results"], rec["timers"], rec["ceilings"]))
    validate_record(live)
    assert live["name"] == "alloc" and live["results"] is rec["results"]


def test_table_prints_every_size_with_both_timers():
    text = alloc_bench.table(load_record("alloc"))
    lines = text.splitlines()
    assert "zeros+ow" in lines[0] and "graph e+ow" in lines[0]
    assert len(lines) == 1 + len(SWEEP_SIZES) + 1 and "graph replay" in lines[-1]
    assert lines[1].split()[:2] == ["4", "KiB"] and lines[-2].split()[:2] == ["1", "GiB"]


# ---- the fill rows per dtype, and a record that lacks one ---------------------------------------------

def _synthetic_per_dtype_record():
    """A TEST FIXTURE, not a measurement: an alloc record in the schema run() writes, whose fill times
    follow a made-up model (a 4 us launch plus bytes / peak, the peak lower for 1- and 2-byte dtypes,
    as the element-size story predicts). Fixed numbers, so these tests do not change when the real
    record is re-recorded; machine and the other results are the real record's."""
    rec = copy.deepcopy(load_record("alloc"))
    peak = {"uint8": 3300, "float8_e4m3fn": 3300, "bfloat16": 3350, "float16": 3350, "int32": 4700, "float32": 4700}
    rec["ceilings"] = {"copy_GBps": 4250.0}
    rows = []
    for b in SWEEP_SIZES:
        per = {}
        for name, gbps in peak.items():
            us = 4.0 + b / (gbps * 1e3)
            per[name] = {"eager_us": us, "eager_GBps": b / us / 1e3, "graph_us": us - 2.0,
                         "graph_GBps": b / (us - 2.0) / 1e3}
        f = per["float32"]["eager_us"]
        rows.append({"bytes": b, "zeros_eager_us": f + 1.0, "empty_eager_us": 1.3, "zeros_overwrite_eager_us": 2 * f + 3.0,
                     "empty_overwrite_eager_us": f + 3.0, "fill_eager_us": f, "zeros_overwrite_graph_us": 2 * f,
                     "empty_overwrite_graph_us": f, "fill_eager_GBps": b / f / 1e3,
                     "overwrite_eager_ratio": (2 * f + 3.0) / (f + 3.0), "overwrite_graph_ratio": 2.0,
                     "fill_by_dtype": per})
    assert [set(r) for r in rows] == [set(r) for r in rec["results"]["sweep"]], "the fixture follows the record"
    rec["results"]["sweep"] = rows
    validate_record(rec)
    return rec


def test_fill_sweep_reads_every_dtype():
    rec = _synthetic_per_dtype_record()
    for name in FILL_DTYPES:
        rows = fill_sweep(rec, getattr(torch, name))
        assert [r["bytes"] for r in rows] == SWEEP_SIZES
        assert all(r["eager_us"] > 0 and r["graph_us"] > 0 and r["eager_GBps"] > 0 for r in rows)
    assert fill_sweep(rec, "uint8") == fill_sweep(rec, torch.uint8)
    table = fill_rate_table(rec)
    assert "not recorded" not in table and "copy ceiling" in table and table.count("TB/s") == len(FILL_DTYPES) + 1
    with pytest.raises(ValueError, match="dtype must be one of"):
        fill_sweep(rec, torch.complex64)


def test_a_record_without_a_dtype_says_so():
    rec = copy.deepcopy(load_record("alloc"))
    for r in rec["results"]["sweep"]:
        r["fill_by_dtype"].pop("uint8")
    with pytest.raises(NotRecorded, match="uint8: not recorded"):
        fill_sweep(rec, "uint8")
    table = fill_rate_table(rec)
    assert "uint8          not recorded" in table and "float32" in table and "TB/s" in table


# ---- the grader of notebook 01's exercise 1.1 -------------------------------------------------------

def _round_up(m, k):
    return (m + k - 1) // k * k


def _padded(x, multiple, rows=None, dtype="x", fill=None, pad=0, gap=0, add=False):
    """A pad_rows answer with one mistake switched on: ``rows`` allocated, a ``dtype`` other than x's,
    a whole-buffer ``fill`` ('zero_', 'setitem') before the data, ``pad`` the padding's value (None:
    unwritten), ``gap`` padding rows skipped after row M, ``add`` the data added into the buffer."""
    M, N = x.shape
    out = torch.empty(rows or _round_up(M, multiple), N, device=x.device, dtype=x.dtype if dtype == "x" else dtype)
    if fill == "zero_":
        out.zero_()
    elif fill == "setitem":
        out[:] = 0
    k = min(M, out.shape[0])
    if pad is not None:
        out[k + gap:] = pad
    if add:
        out[:k] += x[:k]
    else:
        out[:k] = x[:k]
    return out


def _zeros_then_copy(x, multiple):
    out = torch.zeros(_round_up(x.shape[0], multiple), x.shape[1], device=x.device, dtype=x.dtype)
    out[: x.shape[0]] = x
    return out


_ZERO_FILLED = "`padded` was zero-filled ({}): that is the extra memset kernel this workbook removes. " \
               "Allocate it with torch.empty"

PAD_ROWS_WRONG = {
    "torch.zeros": (_zeros_then_copy, _ZERO_FILLED.format("torch.zeros")),
    "F.pad": (lambda x, m: torch.nn.functional.pad(x, (0, 0, 0, _round_up(x.shape[0], m) - x.shape[0])),
              _ZERO_FILLED.format("torch.nn.functional.pad")),
    "cat with new_zeros": (lambda x, m: torch.cat([x, x.new_zeros(_round_up(x.shape[0], m) - x.shape[0], x.shape[1])]),
                           _ZERO_FILLED.format("Tensor.new_zeros")),
    "empty then zero_()": (lambda x, m: _padded(x, m, fill="zero_"), _ZERO_FILLED.format("Tensor.zero_()")),
    "empty then out[:] = 0": (lambda x, m: _padded(x, m, fill="setitem"), _ZERO_FILLED.format("Tensor[...] = 0")),
    "padding forgotten": (lambda x, m: _padded(x, m, pad=None),
                          "M=13, N=6, multiple=8, float32: padded: 18 element(s) were NEVER WRITTEN (rows 13..15"),
    "off by one: out[M + 1:] = 0": (lambda x, m: _padded(x, m, gap=1), "were NEVER WRITTEN (rows 13..13"),
    "rounded down": (lambda x, m: _padded(x, m, rows=max(x.shape[0] // m * m, m)),
                     "expected shape [16, 6] (M rounded UP"),
    "a block too many on multiples": (lambda x, m: _padded(x, m, rows=(x.shape[0] // m + 1) * m),
                                      "M=16, N=3, multiple=8, float32: expected shape [16, 3]"),
    "dtype forgotten": (lambda x, m: _padded(x, m, dtype=torch.float32), "keep x's dtype torch.bfloat16"),
    "accumulated": (lambda x, m: _padded(x, m, add=True), "READ BEFORE WRITTEN, i.e. accumulated into (rows 0..12"),
    "padded with ones": (lambda x, m: _padded(x, m, pad=1), "rows 13..15 hold wrong values (padding rows)"),
    "a view of a larger buffer": (lambda x, m: _padded(x, m, rows=_round_up(x.shape[0], m) + m)[:_round_up(x.shape[0], m)],
                                  "must own exactly its [16, 6] storage"),
}


def _grade_pad(capsys, fn):
    v = grade("exercise 1.1", lambda: check_pad_rows(fn))
    return v, capsys.readouterr().out


def test_pad_rows_grader_passes_the_solutions_and_not_the_stub(capsys):
    def stub(x, multiple):
        raise NotImplementedError

    for fn in (solution_pad_rows, lambda x, m: _padded(x, m),
               lambda x, m: torch.cat([x, x.new_empty(_round_up(x.shape[0], m) - x.shape[0], x.shape[1]).fill_(0)])):
        v, out = _grade_pad(capsys, fn)
        assert v and v.status == "passed", out
    v, out = _grade_pad(capsys, stub)
    assert not v and v.status == "not attempted", out


@pytest.mark.parametrize("which", list(PAD_ROWS_WRONG))
def test_pad_rows_grader_fails_wrong_answers_with_the_intended_message(capsys, which):
    fn, message = PAD_ROWS_WRONG[which]
    v, out = _grade_pad(capsys, fn)
    assert not v and v.status == "wrong", out
    assert message in out, out


# ---- the grader of notebook 01's exercise 1.2 -------------------------------------------------------

def _rows(rec, dtype):
    return {r["bytes"]: r for r in fill_sweep(rec, dtype)}


def _grade(capsys, fn, rec):
    v = grade("exercise 1.2", lambda: check_zero_fill_prediction(fn, rec))
    return v, capsys.readouterr().out


def test_prediction_grader_passes_the_solution_on_the_recorded_data(capsys):
    v, out = _grade(capsys, solution_zero_fill_prediction, load_record("alloc"))
    assert v and v.status == "passed", out
    assert "not recorded" not in out


def test_prediction_grader_passes_the_solution_and_numpy_scalars(capsys):
    rec = _synthetic_per_dtype_record()
    sol = solution_zero_fill_prediction
    for fn in (sol, lambda r, b, d: np.float64(sol(r, b, d)), lambda r, b, d: np.float32(sol(r, b, d)),
               lambda r, b, d: torch.tensor(sol(r, b, d))):
        v, out = _grade(capsys, fn, rec)
        assert v and v.status == "passed", out


def test_prediction_grader_skips_a_dtype_the_record_lacks(capsys):
    rec = copy.deepcopy(load_record("alloc"))
    for r in rec["results"]["sweep"]:
        r["fill_by_dtype"].pop("int32")
    v, out = _grade(capsys, solution_zero_fill_prediction, rec)
    assert v and v.status == "passed" and "int32: not recorded in this record, so not checked" in out, out


def test_prediction_grader_stub_is_not_attempted(capsys):
    def stub(rec, nbytes, dtype):
        raise NotImplementedError

    v, out = _grade(capsys, stub, load_record("alloc"))
    assert not v and v.status == "not attempted"


def _beta_mid(rec, dtype):
    r = _rows(rec, dtype)
    return (r[256 << 20]["eager_GBps"] + r[1 << 30]["eager_GBps"]) / 2 * 1e9


WRONG_PREDICTIONS = {
    "copy ceiling": (lambda rec, b, d: b / (rec["ceilings"]["copy_GBps"] * 1e9) * 1e6,
                     ", 512 MiB", "the copy ceiling counts bytes read + written"),
    "float32 rate for every dtype": (lambda rec, b, d: solution_zero_fill_prediction(rec, b, torch.float32),
                                     "uint8, 512 MiB", "that is the float32 rate"),
    "the 64 MiB row": (lambda rec, b, d: b / (_rows(rec, d)[64 << 20]["eager_GBps"] * 1e9) * 1e6,
                       "float32, 512 MiB", "the 64 MiB row's bandwidth is lower"),
    "512e6 bytes": (lambda rec, b, d: 512e6 / _beta_mid(rec, d) * 1e6,
                    "float32, ", "bytes, not "),
    "averaged times": (lambda rec, b, d: (_rows(rec, d)[256 << 20]["eager_us"] + _rows(rec, d)[1 << 30]["eager_us"]) / 2,
                       "float32, 512 MiB", "averaging the TIMES of 256 MiB and 1 GiB"),
    "seconds": (lambda rec, b, d: b / _beta_mid(rec, d), "float32, 512 MiB", "that is in SECONDS"),
    "ignores nbytes": (lambda rec, b, d: solution_zero_fill_prediction(rec, 512 << 20, d), "float32, 128 MiB",
                       "your prediction does not change with nbytes"),
}


@pytest.mark.parametrize("which", list(WRONG_PREDICTIONS))
def test_prediction_grader_fails_wrong_answers_with_the_intended_message(capsys, which):
    fn, where, message = WRONG_PREDICTIONS[which]
    v, out = _grade(capsys, fn, _synthetic_per_dtype_record())
    assert not v and v.status == "wrong", out
    assert where in out and message in out, out


@pytest.mark.parametrize("which", ["the 64 MiB row", "averaged times", "seconds", "ignores nbytes"])
def test_prediction_grader_fails_wrong_answers_on_the_recorded_data_too(capsys, which):
    fn, _, message = WRONG_PREDICTIONS[which]
    v, out = _grade(capsys, fn, load_record("alloc"))
    assert not v and message in out, out


def test_prediction_grader_rejects_non_numbers(capsys):
    v, out = _grade(capsys, lambda rec, b, d: "120 us", load_record("alloc"))
    assert not v and "return a number of microseconds" in out


# ---- the demos and the profiler's view on this machine ---------------------------------------------------

def test_profile_leaves_no_kineto_marker_lines_on_stderr(capfd):
    res = alloc_bench.profile_zeros_vs_empty(1 << 16)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "USDT" not in err, err
    # the fill kernel: aten::zero_ on the CPU; on a GPU PyTorch's FillFunctor elementwise kernel
    assert any("zero" in e["name"] or "FillFunctor" in e["name"] for e in res["zeros"]), res["zeros"]
    assert all(set(e) == {"name", "count", "profiler_us"} for e in res["zeros"] + res["empty"])


def test_stale_bytes_and_reuse_demos_run_here():
    d = alloc.stale_bytes_demo()
    assert len(d["replays"]) == 2 and d["mode"]
    assert d["replays"][1][-1] == 100.0, "the skipped element shows what was left there after step 1"
    assert d["replays"][1][:-1] == [200.0 + i for i in range(7)]
    r = alloc.reuse_demo()
    assert set(r) >= {"same_block", "frac_previous_owner", "frac_zero", "frac_other"}
    assert abs(r["frac_previous_owner"] + r["frac_zero"] + r["frac_other"] - 1) < 1e-9


def test_torch_source_quotes_the_installed_headers_or_says_where_to_look():
    txt = alloc.torch_source("ATen/native/cuda/thread_constants.h", "constexpr uint32_t num_threads()", "}")
    assert txt.startswith("torch ") and ("C10_WARP_SIZE" in txt or "not in this install" in txt or "not found" in txt)
    assert "not in this install" in alloc.torch_source("ATen/native/cuda/NoSuchFile.cuh", "a", "b")


def test_pictures_draw_the_recorded_and_a_live_looking_record():
    import matplotlib.pyplot as plt

    from workbook.plots import alloc as alloc_plots

    rec = load_record("alloc")
    for draw in (alloc_plots.sweep_plot, alloc_plots.bandwidth_plot, alloc_plots.graph_plot):
        fig = draw(rec)
        title = fig.texts[0].get_text() if fig.texts else fig.axes[0].get_title()   # suptitle or title
        assert title.startswith("recorded ") and "H200" in title, title
        plt.close(fig)
    smoke = copy.deepcopy(rec)
    smoke["results"]["sweep"] = [r for r in rec["results"]["sweep"] if r["bytes"] in SMOKE_SIZES]
    fig = alloc_plots.sweep_plot(smoke, live=True)
    assert fig.texts[0].get_text().startswith("measured live: ")
    plt.close(fig)


# ---- the benchmark's pieces on a GPU ------------------------------------------------------------------------

@pytest.mark.skipif(not ON_GPU, reason="measures a GPU; the CPU tests check the recorded data instead")
def test_benchmark_pieces_produce_the_recorded_fields_on_a_gpu():
    (row,) = alloc_bench.zeros_vs_empty_sweep(sizes=[1 << 20])
    assert set(row) == set(load_record("alloc")["results"]["sweep"][0]), "the same fields as the record"
    for key in ("zeros_overwrite_graph_us", "empty_overwrite_graph_us", "overwrite_graph_ratio", "zeros_eager_us"):
        assert row[key] > 0, key
    assert set(row["fill_by_dtype"]) == set(FILL_DTYPES)
    for name, per in row["fill_by_dtype"].items():
        assert per["eager_us"] > 0 and per["graph_us"] > 0, name
        assert per["eager_GBps"] == pytest.approx(row["bytes"] / per["eager_us"] / 1e3), name
    names = alloc_bench.fill_kernel_names(1 << 20)
    assert all("FillFunctor" in k for k in names.values()), names
    g = alloc_bench.graph_decode_step(n_buffers=8)
    assert g["zeros_graph_us"] > 0 and g["empty_graph_us"] > 0 and g["n_buffers"] == 8
    ev = alloc_bench.fill_bandwidth_events(64 << 20, iters=5)
    assert ev["fill_events_us"] > 0 and ev["GBps"] > 100
    prof = alloc_bench.profile_zeros_vs_empty(1 << 20)
    assert any("FillFunctor" in e["name"] for e in prof["zeros"])
    assert not any("FillFunctor" in e["name"] for e in prof["empty"])


@pytest.mark.skipif(not ON_GPU, reason="measures a GPU")
def test_smoke_run_is_a_valid_record_with_the_notebooks_live_sizes():
    live = records.as_record("alloc", alloc_bench.run(smoke=True))
    assert [r["bytes"] for r in live["results"]["sweep"]] == SMOKE_SIZES
    assert set(live["timers"]) == {"eager", "graph"} and live["ceilings"]["copy_GBps"] > 100
    assert fill_sweep(live, "uint8")[0]["graph_us"] > 0
    assert alloc_bench.table(live).count("\n") == len(SMOKE_SIZES) + 1
