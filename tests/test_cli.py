"""The command line (python -m workbook ...): help for every command, one-line errors instead of
tracebacks, doctor's verdicts and exit codes, bench's GPU guard, topic list and progress count."""
import json
import sys

import pytest
import torch

import workbook.__main__ as cli
from workbook.device import ON_GPU


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


@pytest.mark.parametrize("cmd, words", [
    ([], "doctor"), (["doctor"], "smoke"), (["check"], "smoke"), (["bench"], "progress bar"),
    (["execute"], "--out"),
])
def test_every_command_has_help(capsys, cmd, words):
    with pytest.raises(SystemExit) as e:
        cli.main(cmd + ["--help"])
    assert e.value.code == 0 and words in capsys.readouterr().out


def test_doctor_reports_device_versions_and_a_smoke_run(capsys):
    rc, out, _ = run(capsys, "doctor", "start_here")
    assert "CUDA C++ kernels (backend=\"cuda\", optional):" in out
    assert rc == 0, out
    assert ("Triton's interpreter" in out) != ON_GPU and "versions: torch" in out
    assert "[ok] start_here: iota(100)" in out and "ready" in out


def test_doctor_checks_the_bench_records_and_only_them(capsys, monkeypatch, tmp_path):
    import shutil

    import workbook.records as records

    shutil.copy(records.DATA_DIR / "alloc.json", tmp_path / "alloc.json")
    (tmp_path / "notes.json").write_text('{"not": "a bench record"}')   # other data: not checked
    monkeypatch.setattr(records, "DATA_DIR", tmp_path)
    rc, out, _ = run(capsys, "doctor", "start_here")
    assert rc == 0 and "recorded GPU results (workbook/data/): alloc\n" in out, out
    assert "not recorded yet: " in out and "nvfp4" in out
    (tmp_path / "nvfp4.json").write_text('{"schema": 0}')
    rc, out, _ = run(capsys, "doctor", "start_here")
    assert rc == 1 and "BROKEN: nvfp4.json" in out and "NOT READY: broken record nvfp4.json" in out, out


@pytest.mark.parametrize("topic", sorted(cli.SMOKE))
def test_every_smoke_launch_passes(topic):
    # the smoke launches call the topic modules' public API: this fails when that API moves
    ok, verdict = cli.run_smoke(topic)
    assert ok, verdict
    assert "no smoke launch" not in verdict


def test_doctor_fails_on_a_broken_topic_and_a_missing_package(capsys, monkeypatch):
    def broken():
        raise RuntimeError("kernel wrote garbage")
    monkeypatch.setitem(cli.SMOKE, "start_here", broken)
    monkeypatch.setitem(cli.PACKAGES, "no-such-distribution-here", ("a notebook", True))
    rc, out, _ = run(capsys, "check", "start_here")
    assert rc == 1
    assert "[FAILED] start_here: RuntimeError: kernel wrote garbage" in out
    assert "MISSING: no-such-distribution-here" in out and "NOT READY" in out


def test_topics_come_from_the_registries():
    assert {"start_here", "nvfp4", "fp8", "gdn"} <= set(cli.topic_modules())
    assert cli.topic_modules()[0] == "start_here"                      # in the notebooks' order
    assert cli.bench_topics()[0] == "alloc" and {"nvfp4", "fp8", "gdn", "cuda"} <= set(cli.bench_topics())
    assert "start_here" not in cli.bench_topics()   # no benchmark there


def test_doctor_unknown_topic_lists_the_known_ones(capsys):
    rc, _, err = run(capsys, "doctor", "nope")
    assert rc == 2 and "unknown topic 'nope'; known topics: start_here, " in err


def test_bench_unknown_topic_lists_the_known_ones(capsys):
    rc, _, err = run(capsys, "bench", "nvfp4", "nope")
    assert rc == 2 and "unknown topic 'nope'" in err and "alloc, " in err and "nvfp4" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.skipif(ON_GPU, reason="the no-GPU message")
def test_bench_without_a_gpu_is_one_line(capsys):
    rc, _, err = run(capsys, "bench", "alloc")
    assert rc == 2 and "no GPU" in err and len(err.strip().splitlines()) == 1


def test_bench_counts_measurements_and_writes_the_record(capsys, monkeypatch, tmp_path):
    import triton.testing

    from workbook import benchmarks
    from workbook.records import Measurement

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **k: 1.0)
    seen = {}

    def fake_run(*, budget_s=None, smoke=False):
        from triton.testing import do_bench  # as workbook.timing.time_us does, at call time
        seen.update(budget_s=budget_s, smoke=smoke)
        return Measurement({"rows": [{"t_eager_us": 1e3 * do_bench(None)} for _ in range(3)]},
                           {"eager": "do_bench"}, {"copy_GBps": 1.0})

    monkeypatch.setattr(benchmarks.module("alloc"), "run", fake_run)
    monkeypatch.setattr(cli, "_gpu_present", lambda: True)
    rc, out, err = run(capsys, "bench", "alloc", "--data", str(tmp_path), "--budget", "30", "--smoke")
    assert rc == 0, err
    assert seen == {"budget_s": 30.0, "smoke": True}
    assert "[alloc] 3 measurements" in out and "measurements" in err   # the tqdm bar is on stderr
    assert str(tmp_path / "alloc.json") in out and "recorded " in out
    assert json.loads((tmp_path / "alloc.json").read_text())["results"] == {"rows": [{"t_eager_us": 1e3}] * 3}
    rc, _, err = run(capsys, "bench", "alloc", "--budget", "-1")
    assert rc == 2 and "--budget must be a positive number" in err
    assert triton.testing.do_bench.__name__ == "<lambda>"               # restored afterwards


def test_execute_missing_and_broken_notebooks_get_one_line(capsys, tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("this is not json")
    rc, out, _ = run(capsys, "execute", str(tmp_path / "missing.ipynb"), str(bad), "--out", str(tmp_path / "o"))
    assert rc == 1
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "not found" in lines[0] and "not a readable notebook" in lines[1]


def test_execute_names_the_failing_cell(capsys, tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("1 / 0")])
    nbformat.write(nb, tmp_path / "fails.ipynb")
    rc, out, _ = run(capsys, "execute", str(tmp_path / "fails.ipynb"), "--out", str(tmp_path / "o"), "--timeout", "60")
    assert rc == 1 and "in code cell 1 (ZeroDivisionError" in out, out
    assert (tmp_path / "o" / "fails.ipynb").exists()


def test_unexpected_errors_are_one_line_unless_asked(capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("something broke")
    monkeypatch.setattr(cli, "_cmd_doctor", boom)
    rc, _, err = run(capsys, "doctor")
    assert rc == 1 and err.strip() == ("error: RuntimeError: something broke (rerun with --traceback "
                                       "(or WORKBOOK_DEBUG=1) for the full trace)")
    with pytest.raises(RuntimeError, match="something broke"):
        cli.main(["--traceback", "doctor"])
    with pytest.raises(RuntimeError, match="something broke"):
        cli.main(["doctor", "--traceback"])
    monkeypatch.setenv("WORKBOOK_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something broke"):
        cli.main(["doctor"])


@pytest.mark.filterwarnings("ignore:'workbook.__main__' found in sys.modules:RuntimeWarning")
def test_python_dash_m_workbook_runs_main(capsys, monkeypatch):
    # what `python -m workbook bench nope` runs, in-process (a subprocess would re-import torch)
    import runpy

    monkeypatch.setattr(sys, "argv", ["python -m workbook", "bench", "nope"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("workbook", run_name="__main__", alter_sys=False)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and "known topics: alloc" in err


def test_bench_progress_without_tqdm(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)   # import fails: the plain counter stands in
    with cli._progress("bench x") as bar:
        bar.update(1)
        bar.update(1)
    assert bar.n == 2 and "bench x: 2 measurements" in capsys.readouterr().err


def test_audit_subcommand(capsys, tmp_path):
    """`python -m workbook audit` runs workbook.audit: findings -> exit 1 with file:line, none -> 0,
    a missing path -> 2 in one line."""
    src = tmp_path / "layer.py"
    src.write_text("import torch\n\ndef f(x):\n    out = torch.zeros_like(x)\n    out.copy_(x * 2)\n    return out\n")
    assert cli.main(["audit", str(tmp_path)]) == 1
    assert "layer.py:4" in capsys.readouterr().out
    (tmp_path / "layer.py").write_text("import torch\n\ndef f(x):\n    return x * 2\n")
    assert cli.main(["audit", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
    assert cli.main(["audit", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err


@pytest.mark.skipif(ON_GPU, reason="the CPU compile path is what notebook 06 takes without a GPU")
def test_doctor_is_not_ready_without_a_cxx_compiler(capsys, monkeypatch):
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, "no-such-cxx-compiler"))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)   # a cached kernel needs no compiler
    torch._dynamo.reset()          # an earlier doctor run in this process compiled the same function
    ok, verdict = cli.compile_smoke()
    assert not ok and "no working C++ compiler" in verdict and "apt-get install -y g++" in verdict, verdict
    rc, out, _ = run(capsys, "doctor", "start_here")
    assert rc == 1 and "torch.compile on the CPU (notebook 06): [FAILED]" in out, out
    assert "NOT READY: torch.compile on the CPU (a C++ compiler; see above)" in out, out
