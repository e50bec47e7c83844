"""Recorded GPU results: the schema, and the recorded H200 data the notebooks fall back to."""
import copy
import json

import pytest

from workbook import bench
from workbook.bench import DATA_DIR, SWEEP_SIZES, load_record, save_record, validate_record


def _records():
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


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
