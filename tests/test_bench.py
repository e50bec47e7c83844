"""Recorded GPU results: the schema, and the recorded H200 data the notebooks fall back to."""
import copy
import json

import pytest

from workbook import bench
from workbook.bench import DATA_DIR, SWEEP_SIZES, load_record, save_record, validate_record


def _records():
    """The GPU benchmark records: workbook/data/<topic>.json of every topic with a benchmark() (as
    `python -m workbook bench` and `doctor` see them); audit.json is a CPU run of the audit, not one."""
    import importlib

    names = []
    for p in DATA_DIR.glob("*.json"):
        module = importlib.import_module("workbook.bench" if p.stem == "alloc" else f"workbook.{p.stem}")
        if hasattr(module, "benchmark"):
            names.append(p.stem)
    return sorted(names)


@pytest.mark.parametrize("name", _records())
def test_every_recorded_result_follows_the_schema(name):
    rec = load_record(name)
    assert rec["name"] == name
    assert rec["meta"]["gpu"], "recorded results come from a GPU"
    assert rec["meta"]["device"].startswith("cuda")


def test_recorded_alloc_sweep_covers_4KiB_to_1GiB():
    rec = load_record("alloc")
    rows = rec["results"]["sweep"]
    assert [r["bytes"] for r in rows] == SWEEP_SIZES == [4096 * 4**i for i in range(10)]
    assert SWEEP_SIZES[-1] == 1 << 30
    for r in rows:
        for k in ("zeros_us", "empty_us", "zeros_overwrite_us", "empty_overwrite_us", "fill_us"):
            assert r[k] > 0
        assert r["overwrite_ratio"] == pytest.approx(r["zeros_overwrite_us"] / r["empty_overwrite_us"])
        assert r["fill_GBps"] == pytest.approx(r["bytes"] / r["fill_us"] / 1e3)
    assert rec["ceilings"]["copy_GBps"] > 1000
    g = rec["results"]["graph"]
    assert g["zeros_us"] > 0 and g["empty_us"] > 0 and g["n_buffers"] >= 10
    names = " ".join(e["name"] for e in rec["results"]["profile"]["zeros"])
    assert "Fill" in names, "the profiler view must show the fill kernel that zeros adds"
    assert "Fill" not in " ".join(e["name"] for e in rec["results"]["profile"]["empty"])


def test_schema_rejects_broken_records(tmp_path):
    good = load_record("alloc")
    for breaker, msg in [
        (lambda r: r.pop("meta"), "'meta' must be an object"),
        (lambda r: r.update(recorded="yesterday"), "ISO date"),
        (lambda r: r["meta"].pop("gpu"), "meta.gpu"),
        (lambda r: r["ceilings"].update(copy_GBps=-1), "positive"),
        (lambda r: r.update(schema=99), "'schema' must be 1"),
    ]:
        r = copy.deepcopy(good)
        breaker(r)
        with pytest.raises(ValueError, match=msg):
            validate_record(r)
    (tmp_path / "broken.json").write_text(json.dumps({"schema": 1}))
    with pytest.raises(ValueError):
        load_record("broken", tmp_path)
    with pytest.raises(FileNotFoundError, match="python -m workbook bench"):
        load_record("missing", tmp_path)


def test_save_and_load_round_trip(tmp_path):
    p = save_record("demo", {"x": [1, 2]}, {"copy_GBps": 1.0}, tmp_path)
    rec = load_record("demo", tmp_path)
    assert p.name == "demo.json" and rec["results"] == {"x": [1, 2]}
    assert "torch" in bench.recorded_label(rec)


def test_gpu_timers_refuse_without_gpu():
    if bench.ON_GPU:
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="recorded H200 results"):
        bench.time_us(lambda: None)


# ---- per-dtype fill figures, timers, and records that predate them ---------------------------------

import math  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from workbook.bench import (  # noqa: E402
    ALLOC_TIMERS, FILL_DTYPES, NotRecorded, check_zero_fill_prediction, fill_rate_table, fill_sweep, timer_of,
)
from workbook.check import grade  # noqa: E402


def _synthetic_per_dtype_record():
    """A TEST FIXTURE, not a measurement: an alloc record in the schema benchmark() writes, whose fill
    times follow a made-up model (a 4 us launch plus bytes / peak, the peak lower for 1- and 2-byte
    dtypes, as the element-size story predicts). Fixed numbers, so these tests do not change when the
    real record is re-recorded; meta and the other results are the real record's."""
    rec = copy.deepcopy(load_record("alloc"))
    peak = {"uint8": 3300, "float8_e4m3fn": 3300, "bfloat16": 3350, "float16": 3350, "int32": 4700, "float32": 4700}
    rec["ceilings"] = {"copy_GBps": 4250.0}
    rows = []
    for b in SWEEP_SIZES:
        per = {}
        for name, gbps in peak.items():
            us = 4.0 + b / (gbps * 1e3)
            per[name] = {"us": us, "GBps": b / us / 1e3, "graph_us": us - 2.0, "graph_GBps": b / (us - 2.0) / 1e3}
        f = per["float32"]["us"]
        rows.append({"bytes": b, "zeros_us": f + 1.0, "empty_us": 1.3, "zeros_overwrite_us": 2 * f + 3.0,
                     "empty_overwrite_us": f + 3.0, "fill_us": f, "fill_GBps": b / f / 1e3,
                     "overwrite_ratio": (2 * f + 3.0) / (f + 3.0), "zeros_overwrite_graph_us": 2 * f,
                     "empty_overwrite_graph_us": f, "overwrite_graph_ratio": 2.0, "fill_by_dtype": per})
    rec["results"]["sweep"] = rows
    rec["results"]["timers"] = dict(ALLOC_TIMERS)
    validate_record(rec)
    return rec


def test_fill_sweep_degrades_gracefully_on_a_record_without_per_dtype_fields():
    rec = copy.deepcopy(load_record("alloc"))
    for r in rec["results"]["sweep"]:
        r.pop("fill_by_dtype", None)
    rec["results"].pop("timers", None)
    f32 = fill_sweep(rec, torch.float32)
    assert [r["us"] for r in f32] == [r["fill_us"] for r in rec["results"]["sweep"]]
    with pytest.raises(NotRecorded, match="uint8: not recorded yet"):
        fill_sweep(rec, "uint8")
    table = fill_rate_table(rec)
    assert "uint8          not recorded yet" in table and "float32" in table and "TB/s" in table
    assert "not recorded in this record" in timer_of(rec, "sweep.zeros_us")
    assert "not recorded yet" in timer_of(rec, "sweep.zeros_overwrite_graph_us")
    with pytest.raises(ValueError, match="dtype must be one of"):
        fill_sweep(rec, torch.complex64)


def test_fill_sweep_reads_per_dtype_fields_and_timers():
    rec = _synthetic_per_dtype_record()
    for name in FILL_DTYPES:
        rows = fill_sweep(rec, getattr(torch, name))
        assert [r["bytes"] for r in rows] == SWEEP_SIZES and all(r["us"] > 0 and r["graph_us"] > 0 for r in rows)
    assert "not recorded" not in fill_rate_table(rec)
    assert timer_of(rec, "sweep.fill_by_dtype.graph_us").startswith("graph replay")
    assert timer_of(rec, "sweep.zeros_us").startswith("eager")
    assert all(v.split(":")[0] in ("eager", "graph replay", "torch.profiler (CUPTI kernel activity) over one eager call of each",
                                   "CUDA events around back-to-back zero_() calls (no L2 flush)")
               for v in ALLOC_TIMERS.values())


def test_every_figure_of_the_alloc_sweep_has_a_timer():
    rec = _synthetic_per_dtype_record()
    for key in rec["results"]["sweep"][0]:
        if key.endswith("_us"):
            assert f"sweep.{key}" in ALLOC_TIMERS, key


# ---- the grader of notebook 01's exercise 1.2 -------------------------------------------------------

def predict_solution(rec, nbytes, dtype):
    rows = fill_sweep(rec, dtype)
    below = max((r for r in rows if r["bytes"] <= nbytes), key=lambda r: r["bytes"])
    above = min((r for r in rows if r["bytes"] >= nbytes), key=lambda r: r["bytes"])
    t = 0.0 if above is below else math.log(nbytes / below["bytes"]) / math.log(above["bytes"] / below["bytes"])
    beta = below["GBps"] + t * (above["GBps"] - below["GBps"])     # GB/s, interpolated in log(size)
    return nbytes / (beta * 1e9) * 1e6


def _rows(rec, dtype):
    return {r["bytes"]: r for r in fill_sweep(rec, dtype)}


def _grade(capsys, fn, rec):
    v = grade("exercise 1.2", lambda: check_zero_fill_prediction(fn, rec))
    return v, capsys.readouterr().out


def test_prediction_grader_passes_the_solution_on_the_recorded_data(capsys):
    v, out = _grade(capsys, predict_solution, load_record("alloc"))
    assert v and v.status == "passed", out


def test_prediction_grader_passes_the_solution_and_numpy_scalars(capsys):
    rec = _synthetic_per_dtype_record()
    for fn in (predict_solution, lambda r, b, d: np.float64(predict_solution(r, b, d)),
               lambda r, b, d: np.float32(predict_solution(r, b, d)),
               lambda r, b, d: torch.tensor(predict_solution(r, b, d))):
        v, out = _grade(capsys, fn, rec)
        assert v and v.status == "passed", out
    assert "not recorded yet" not in out


def test_prediction_grader_stub_is_not_attempted(capsys):
    def stub(rec, nbytes, dtype):
        raise NotImplementedError

    v, out = _grade(capsys, stub, load_record("alloc"))
    assert not v and v.status == "not attempted"


def _beta_mid(rec, dtype):
    r = _rows(rec, dtype)
    return (r[256 << 20]["GBps"] + r[1 << 30]["GBps"]) / 2 * 1e9


WRONG_PREDICTIONS = {
    "copy ceiling": (lambda rec, b, d: b / (rec["ceilings"]["copy_GBps"] * 1e9) * 1e6,
                     ", 512 MiB", "the copy ceiling counts bytes read + written"),
    "float32 rate for every dtype": (lambda rec, b, d: predict_solution(rec, b, torch.float32),
                                     "uint8, 512 MiB", "that is the float32 rate"),
    "the 64 MiB row": (lambda rec, b, d: b / (_rows(rec, d)[64 << 20]["GBps"] * 1e9) * 1e6,
                       "float32, 512 MiB", "the 64 MiB row's bandwidth is lower"),
    "512e6 bytes": (lambda rec, b, d: 512e6 / _beta_mid(rec, d) * 1e6,
                    "float32, ", "bytes, not "),
    "averaged times": (lambda rec, b, d: (_rows(rec, d)[256 << 20]["us"] + _rows(rec, d)[1 << 30]["us"]) / 2,
                       "float32, 512 MiB", "averaging the TIMES of 256 MiB and 1 GiB"),
    "seconds": (lambda rec, b, d: b / _beta_mid(rec, d), "float32, 512 MiB", "that is in SECONDS"),
    "ignores nbytes": (lambda rec, b, d: predict_solution(rec, 512 << 20, d), "float32, 128 MiB",
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


# ---- CPU paths of the notebook's demos ----------------------------------------------------------------

def test_profile_leaves_no_kineto_marker_lines_on_stderr(capfd):
    res = bench.profile_zeros_vs_empty(1 << 16)
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "USDT" not in err, err
    # the fill kernel: aten::zero_ on the CPU; on a GPU PyTorch's FillFunctor elementwise kernel
    assert any("zero" in e["name"] or "FillFunctor" in e["name"] for e in res["zeros"]), res["zeros"]


def test_stale_bytes_and_reuse_demos_run_here():
    d = bench.stale_bytes_demo()
    assert len(d["replays"]) == 2 and d["mode"]
    assert d["replays"][1][-1] == 100.0, "the skipped element shows what was left there after step 1"
    r = bench.reuse_demo()
    assert set(r) >= {"same_block", "frac_previous_owner", "frac_zero", "frac_other"}
    assert abs(r["frac_previous_owner"] + r["frac_zero"] + r["frac_other"] - 1) < 1e-9


def test_torch_source_quotes_the_installed_headers_or_says_where_to_look():
    txt = bench.torch_source("ATen/native/cuda/thread_constants.h", "constexpr uint32_t num_threads()", "}")
    assert txt.startswith("torch ") and ("C10_WARP_SIZE" in txt or "not in this install" in txt or "not found" in txt)
    assert "not in this install" in bench.torch_source("ATen/native/cuda/NoSuchFile.cuh", "a", "b")


@pytest.mark.skipif(not bench.ON_GPU, reason="measures a GPU; the CPU tests check the recorded data instead")
def test_benchmark_pieces_produce_the_per_dtype_and_graph_fields_on_a_gpu():
    (row,) = bench.zeros_vs_empty_sweep(sizes=[1 << 20])
    for key in ("zeros_overwrite_graph_us", "empty_overwrite_graph_us", "overwrite_graph_ratio"):
        assert row[key] > 0, key
    assert set(row["fill_by_dtype"]) == set(FILL_DTYPES)
    for name, per in row["fill_by_dtype"].items():
        assert per["us"] > 0 and per["graph_us"] > 0 and per["GBps"] == pytest.approx(row["bytes"] / per["us"] / 1e3), name
    names = bench.fill_kernel_names(1 << 20)
    assert all("FillFunctor" in k for k in names.values()), names
    rec = {"results": {"sweep": [row], "timers": dict(ALLOC_TIMERS)}, "ceilings": {}, "recorded": "2026-01-01",
           "meta": {"gpu": "x", "torch": "x", "triton": "x"}}
    assert fill_sweep(rec, "uint8")[0]["graph_us"] > 0


def test_power_summary_counts_only_readable_samples_inside_the_window():
    """power_probe's summary: lines before the window (the ramp), after it, or unreadable are dropped;
    the cap share counts the software-power-cap bit (0x4) of the clock-event reasons, not any bit."""
    lines = [(0.5, "1980, 120.0, 700.00, 0x0000000000000000"),      # before the window: dropped
             (1.0, "1500, 699.5, 700.00, 0x0000000000000004"),      # capped
             (1.1, "1800, 650.0, 700.00, 0x0000000000000001"),      # another reason (idle): not the cap
             (1.2, "[N/A], 600.0, 700.00, 0x0000000000000000"),     # unreadable: dropped
             (1.3, "1700, 690.0, 700.00, 0x0000000000000084"),      # cap among other reasons
             (2.5, "1980, 300.0, 700.00, 0x0000000000000000")]      # after the window: dropped
    s = bench.power_summary(lines, 1.0, 2.0)
    assert s["samples"] == 3 and s["sm_clock_MHz"] == {"mean": 1667, "min": 1500, "max": 1800}, s
    assert s["power_W"] == {"mean": 679.8, "max": 699.5} and s["power_limit_W"] == 700.0, s
    assert s["power_capped_share"] == pytest.approx(2 / 3, abs=1e-3), s
    assert "error" in bench.power_summary(lines, 3.0, 4.0)


def test_gpu_power_probe_refuses_without_gpu():
    if bench.ON_GPU:
        pytest.skip("a GPU is present: the GPU test below runs the probe")
    with pytest.raises(RuntimeError, match="measures a GPU"):
        bench.power_probe(lambda: None)


@pytest.mark.skipif(not bench.ON_GPU, reason="measures a GPU")
def test_power_probe_samples_a_running_copy():
    src = torch.randn(1 << 24, device="cuda")
    dst = torch.empty_like(src)
    s = bench.power_probe(lambda: dst.copy_(src), seconds=0.8, n=5, settle_s=0.2)
    if "error" in s:
        pytest.skip(f"nvidia-smi unavailable here: {s['error']}")
    assert s["samples"] >= 3 and 0 < s["sm_clock_MHz"]["min"] <= s["sm_clock_MHz"]["mean"] <= s["sm_clock_MHz"]["max"], s
    assert 0 < s["power_W"]["mean"] <= s["power_W"]["max"] and s["power_limit_W"] > 0, s
    assert 0 <= s["power_capped_share"] <= 1, s
