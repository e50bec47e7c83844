"""The measured set-up figures: the timer measures what it says, and README shows the record."""
import json
import sys

import nbformat
import pytest

from workbook import cpu_times


def test_measure_sees_the_whole_process_tree():
    # a child that holds 200 MiB while its own child holds 150 MiB and burns CPU: all must be counted
    grandchild = ("b = bytearray(150 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
                  "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n")
    code = ("import subprocess, sys\n"
            "b = bytearray(200 * 2**20)\n"
            "for i in range(0, len(b), 4096): b[i] = 1\n"
            f"subprocess.run([sys.executable, '-c', {grandchild!r}], check=True)\n"
            "sys.exit(3)\n")
    m = cpu_times.measure([sys.executable, "-c", code], sample_s=0.1)
    assert m["returncode"] == 3
    assert 200 <= m["peak_rss_MiB"] < 300, m          # the largest process, not torch's memory of this one
    assert m["peak_total_rss_MiB"] >= 350, m          # both at once
    assert m["cpu_s"] >= 1.5, m                       # the grandchild's CPU time is included
    assert m["wall_s"] >= 1.5 and len(m["load_avg"]) == 2, m


def test_measure_timeout_kills():
    m = cpu_times.measure([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert m["returncode"] == -9 and m["wall_s"] < 20, m


def test_estimate_counts_words_cells_and_exercise_ids(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("word " * 300),
                nbformat.v4.new_code_cell("x = 1", metadata={"workbook": {"exercise": "1"}, "tags": ["exercise"]}),
                nbformat.v4.new_code_cell("grade()", metadata={"workbook": {"exercise": "1"}, "tags": ["grader"]}),
                nbformat.v4.new_code_cell("y = 2", metadata={"workbook": {"exercise": "2"}, "tags": ["exercise"]})]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    e = cpu_times.estimate_minutes(path)
    assert (e["markdown_words"], e["code_cells"], e["exercises"]) == (300, 3, 2)
    raw = 300 / cpu_times.READ_WPM + 3 * cpu_times.MIN_PER_CODE_CELL + 2 * cpu_times.MIN_PER_EXERCISE
    assert e["minutes"] % 5 == 0 and raw <= e["minutes"] < raw + 5


def test_record_covers_every_notebook():
    rec = cpu_times.load()
    stems = sorted(p.stem for p in cpu_times.NOTEBOOKS.glob("*.ipynb"))
    missing = [s for s in stems if s not in rec["notebooks"]]
    assert not missing, f"no CPU time recorded for {missing}: python3 -m workbook.cpu_times notebooks"
    for stem, e in rec["notebooks"].items():
        assert e["ok"], f"{stem} failed when it was timed"
        assert e["wall_s"] > 0 and e["cpu_s"] > 0 and e["peak_rss_MiB"] > 0, (stem, e)
        assert e["machine"]["gpu"] is None, f"{stem}: CPU figures must be measured without a GPU"


def test_readme_shows_the_record():
    assert cpu_times.update_readme(cpu_times.load(), check=True), (
        "README.md's generated block differs from workbook/data/cpu_times.json: "
        "run `python3 -m workbook.cpu_times readme`")


def test_readme_without_block_is_a_clear_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no block\n")
    with pytest.raises(ValueError, match="no generated block"):
        cpu_times.update_readme(cpu_times.load(), readme)


def test_render_marks_a_failed_run():
    rec = json.loads(json.dumps(cpu_times.load()))
    stem = next(iter(rec["notebooks"]))
    rec["notebooks"][stem]["ok"] = False
    assert f"| `{stem}` |" in cpu_times.render(rec) and "(FAILED)" in cpu_times.render(rec)
