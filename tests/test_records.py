"""The record schema (workbook/records.py) and the benchmark contract (workbook/benchmarks/): every
recorded file in workbook/data/ fits the one schema, the validator refuses what breaks it, and every
registered benchmark has the one signature and renders its own record on a CPU."""
import copy
import inspect
import json

import pytest

import workbook  # noqa: F401  (before triton: the interpreter switch)
from workbook import benchmarks, records
from workbook.device import ON_GPU
from workbook.timing import TIMERS

DATA = sorted(records.DATA_DIR.glob("*.json"))


def test_data_folder_holds_the_records():
    assert {p.stem for p in DATA} >= set(benchmarks.REGISTRY), "every benchmark topic has a record"


@pytest.mark.parametrize("path", DATA, ids=[p.stem for p in DATA])
def test_every_record_fits_the_schema(path):
    rec = json.loads(path.read_text())
    records.validate_record(rec)
    assert rec["name"] == path.stem
    assert set(rec["timers"]) <= set(TIMERS), "timers are named as workbook.timing names them"
    keys = [k for _, k in records.time_keys(rec["results"])]
    if rec["machine"]["device"].startswith("cuda"):
        assert keys, "a GPU record holds time figures"
        assert any(k.endswith("_graph_us") or k == "graph_us" for k in keys), \
            "GPU figures are GPU time from CUDA-graph replay (with eager time beside them)"


def _good() -> dict:
    return {"schema": records.SCHEMA, "name": "x", "recorded": "2026-12-01",
            "machine": {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "python": "3.12"},
            "timers": {"graph": "replay", "eager": "do_bench"}, "ceilings": {"copy_GBps": 4200.0},
            "results": {"rows": [{"M": 1, "ours_graph_us": 1.0, "ours_eager_us": 2.0}], "graph_us": 3.0}}


BROKEN = [
    ("schema", lambda r: r.update(schema=1), "'schema' must be 2"),
    ("date", lambda r: r.update(recorded="yesterday"), "ISO date"),
    ("machine", lambda r: r.pop("machine"), "'machine'"),
    ("gpu", lambda r: r["machine"].pop("gpu"), "machine.gpu"),
    ("unknown timer", lambda r: r["timers"].update(stopwatch="by hand"), "unknown timer"),
    ("bare us", lambda r: r["results"]["rows"][0].update(us=1.0), "_<timer>_us"),
    ("undeclared timer", lambda r: r["results"]["rows"][0].update(ours_profiler_us=1.0), "_<timer>_us"),
    ("timer field", lambda r: r["results"]["rows"][0].update(ours_timer="graph"), "timers are named once"),
    ("methods", lambda r: r["results"].update(methods={}), "timers are named once"),
    ("ceiling", lambda r: r["ceilings"].update(copy_GBps=0), "positive"),
]


@pytest.mark.parametrize("name,breaks,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_validator_names_what_breaks_the_schema(name, breaks, message):
    records.validate_record(_good())
    rec = copy.deepcopy(_good())
    breaks(rec)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        records.validate_record(rec)


def test_save_and_load_round_trip(tmp_path):
    m = records.Measurement(results={"rows": [{"ours_graph_us": 1.5, "ours_eager_us": 4.0}]},
                            timers={k: TIMERS[k] for k in ("graph", "eager")})
    path = records.save_record("demo", m, tmp_path)
    rec = records.load_record("demo", tmp_path)
    assert path.name == "demo.json" and rec["results"] == m.results
    assert rec["machine"]["device"] == ("cuda" if ON_GPU else "cpu")
    assert "recorded" in records.recorded_label(rec)
    with pytest.raises(ValueError, match="_<timer>_us"):
        records.save_record("bad", records.Measurement({"t_us": 1.0}, {"graph": "x"}), tmp_path)
    assert not (tmp_path / "bad.json").exists(), "a record that breaks the schema is never written"
    with pytest.raises(FileNotFoundError, match="bench nothing"):
        records.load_record("nothing", tmp_path)


def test_format_table_marks_missing_values():
    text = records.format_table([{"a": 1.234, "b": "capture failed"}, {"a": None}],
                                [("a", "a", ".2f"), ("b", "b", ".1f"), ("a+1", lambda r: (r["a"] or 0) + 1, ".0f")],
                                title="t")
    lines = text.splitlines()
    assert lines[0] == "t" and "1.23" in lines[2] and lines[2].split()[1] == "-" and lines[3].split()[0] == "-"


@pytest.mark.parametrize("topic", list(benchmarks.REGISTRY))
def test_every_benchmark_keeps_the_contract(topic):
    mod = benchmarks.module(topic)
    run = inspect.signature(mod.run)
    assert [p for p in run.parameters.values() if p.default is inspect.Parameter.empty] == [], \
        "run() needs no argument"
    for name, default in (("budget_s", None), ("smoke", False)):
        p = run.parameters[name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default == default, name
    table = inspect.signature(mod.table)
    assert list(table.parameters)[0] == "rec"
    text = mod.table(records.load_record(topic))
    assert isinstance(text, str) and text.strip(), "table() renders the recorded figures on any machine"
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="GPU"):
            mod.run(smoke=True)


def test_unknown_topic_is_named():
    with pytest.raises(ValueError, match="known: alloc"):
        benchmarks.module("nvfp5")


def test_carry_over_keeps_only_what_the_new_machine_may_carry():
    # a run that rewrites a record keeps its other tables on the same GPU model; on another, only the tables that
    # name their own machine (the rest would be filed under a machine that never measured them); never unasked ones
    old = {"machine": {"gpu": "GPU A"}, "timers": {"graph": "g", "ncu": "n"},
           "results": {"main": [1], "profile": {"x_ncu_us": 1.0}, "ab": {"machine": {"gpu": "GPU B"}, "rows": []}}}
    kept, timers = records.carry_over(old, ("profile", "ab"), "GPU A")
    assert kept == {"profile": old["results"]["profile"], "ab": old["results"]["ab"]} and timers == old["timers"]
    kept, timers = records.carry_over(old, ("profile", "ab"), "GPU C")
    assert kept == {"ab": old["results"]["ab"]} and timers == old["timers"]
    assert records.carry_over(old, ("profile",), "GPU C") == ({}, {})
    assert records.carry_over(None, ("profile",), "GPU A") == ({}, {})
