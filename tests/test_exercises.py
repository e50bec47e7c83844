"""Participant notebooks (workbook/exercises.py, ``python -m workbook exercises``).

The generator on small made-up notebooks (tags found, solution regions replaced, outputs cleared,
malformed metadata refused with a message that names the cell), the command line, the presentation of
the complete notebooks (marker, collapsed solutions), and then, for every exercise of every notebook,
the participant version executed ONCE, top to bottom, on this machine (nbclient, cell by cell):

* every cell runs without an error, with the stubs in place (what a participant who solves nothing sees);
* right after an exercise's grader cell ran on the stub, its output is "not attempted" with the
  teaching line; then the complete notebook's solution region runs in the same kernel and the grader
  cell again, which must print "passed"; then the stub cell runs again, so the cells below run against
  the stub, as a participant's would.

The notebooks run two at a time (the CI machine has two cores), one at a time under pytest-xdist (the
other worker has the other core); WORKBOOK_EXERCISE_JOBS changes that.
"""
from __future__ import annotations

import ast
import asyncio
import copy
import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import workbook.__main__ as cli
from workbook import exercises as ex

NOTEBOOKS = sorted(ex.notebooks_dir().glob("*.ipynb"))
COMPLETE = {p.name: nbformat.read(p, as_version=4) for p in NOTEBOOKS}
WITH_EXERCISES = [name for name, nb in COMPLETE.items() if ex.exercises(nb, name)]
CASES = [(name, e.id) for name in WITH_EXERCISES for e in ex.exercises(COMPLETE[name], name)]

NOT_ATTEMPTED = re.compile(r"\[ \] .+: not attempted yet \(the stub raises NotImplementedError\)")
PASSED = re.compile(r"\[ok\] .+: passed")
CELL_TIMEOUT_S = 300


# --------------------------------------------------------------------------------------------------
# the generator, on made-up notebooks
# --------------------------------------------------------------------------------------------------

def _cell(kind, source, role=None, exercise=None, outputs=(), hidden=False):
    c = new_code_cell(source) if kind == "code" else new_markdown_cell(source)
    if role:
        c.metadata["tags"] = [role]
    if exercise is not None:
        c.metadata["workbook"] = {"exercise": exercise}
    if hidden:
        c.metadata["jupyter"] = {"source_hidden": True}
    if kind == "code":
        c.outputs = [nbformat.v4.new_output("stream", name="stdout", text=t) for t in outputs]
        c.execution_count = 1 if outputs else None
    return c


def _toy():
    """Intro cell with an output, exercise A (marker, wrong answer + reference), a plain cell, exercise B."""
    return new_notebook(cells=[
        _cell("code", "x = 1\nprint(x)", outputs=["1\n"]),
        _cell("markdown", "### Exercise A"),
        _cell("code", "def f(n):\n    raise NotImplementedError", "exercise", "A"),
        _cell("code", "grade('A', lambda: check(f))", "grader", "A", outputs=["[ ] A: not attempted yet\n"]),
        _cell("markdown", ex.MARKER + " Collapsed below.", "solution", "A"),
        _cell("code", "def f(n):\n    return n + 1\ngrade('A (reference)', lambda: check(f))", "solution", "A",
              outputs=["[ok] A (reference): passed\n"], hidden=True),
        _cell("code", "y = 2", outputs=[]),
        _cell("code", "def g():\n    raise NotImplementedError", "exercise", "B"),
        _cell("code", "grade('B', lambda: check(g))", "grader", "B", outputs=["[ ] B: not attempted yet\n"]),
        _cell("markdown", ex.MARKER, "solution", "B"),
        _cell("code", "def g():\n    return 0", "solution", "B", hidden=True),
    ])


def test_tags_are_found():
    got = [(e.id, e.stub, e.grader, e.solution) for e in ex.exercises(_toy(), "toy")]
    assert got == [("A", 2, 3, [4, 5]), ("B", 7, 8, [9, 10])]
    assert ex.lint(_toy(), "toy") == []


def test_participant_version_replaces_solutions_by_stubs_and_clears_outputs():
    nb = _toy()
    p = ex.participant_version(nb, "toy.ipynb")
    nbformat.validate(p)
    sources = [c.source for c in p.cells]
    assert not any("return n + 1" in s or "return 0" in s or ex.MARKER in s for s in sources)   # solutions gone
    assert "def f(n):\n    raise NotImplementedError" in sources and "def g():\n    raise NotImplementedError" in sources
    assert [c.cell_type for c in p.cells] == ["code", "markdown", "code", "code", "markdown", "code", "code", "code",
                                              "markdown"]
    notes = [c for c in p.cells if c.metadata.get("workbook", {}).get("replaces") == "solution"]
    assert [n.metadata["workbook"]["exercise"] for n in notes] == ["A", "B"]
    assert all("toy.ipynb" in n.source and "complete notebook" in n.source for n in notes)
    assert p.cells[0].outputs == nb.cells[0].outputs and p.cells[0].outputs          # other outputs kept
    for c in p.cells:
        if set(c.metadata.get("tags", [])) & {"grader", "exercise"}:
            assert c.outputs == [] and c.execution_count is None                      # graders cleared
    assert len({c.id for c in p.cells}) == len(p.cells)
    assert len(nb.cells) == 11 and nb.cells[5].outputs                                # the source is untouched
    assert p.metadata["workbook"] == {"participant_version_of": "toy.ipynb"}


def test_participant_versions_show_no_test_markers():
    """nbval's markers are for the complete notebooks; a participant sees code that is theirs to read."""
    nb = _toy()
    nb.cells[3].source = "# NBVAL_CHECK_OUTPUT\n" + nb.cells[3].source
    nb.cells[0].source = "  # NBVAL_IGNORE_OUTPUT\n" + nb.cells[0].source
    p = ex.participant_version(nb, "toy.ipynb")
    assert not any("NBVAL" in c.source for c in p.cells)
    assert p.cells[0].source == nb.cells[0].source.split("\n", 1)[1]          # the rest of the cell kept
    for path in ex.resolve_notebooks([]):
        real = ex.participant_version(nbformat.read(path, as_version=4), path.name)
        assert not [i for i, c in enumerate(real.cells) if "NBVAL" in c.source], path.name


# A participant version reads on its own: the cell above each stub states its exercise, and no
# markdown cell promises a cell the generator removed (a solution, a wrong answer shown beside it),
# unless the sentence says it is in the complete notebook.
_PROMISES_A_REMOVED_CELL = re.compile(
    r"solution (follows|below|passing)|follows,? (displayed|collapsed)|collapsed below|then (a plain |the )?"
    r"reference solution|wrong answers? (to show|the grader|below|follow)|graded below|shown below|"
    r"solution[^.]{0,40} follows", re.I)


def test_the_removed_cell_check_can_fail():
    assert _PROMISES_A_REMOVED_CELL.search("a grader, and then the reference solution passing the same grader")
    assert _PROMISES_A_REMOVED_CELL.search("a plain reference solution follows, displayed and graded")
    assert not _PROMISES_A_REMOVED_CELL.search("Both the kernel and the reference define what follows:")


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_participant_version_reads_without_the_removed_cells(name):
    p = ex.participant_version(COMPLETE[name], name)
    for i, c in enumerate(p.cells):
        if "exercise" in c.metadata.get("tags", []):
            fn = re.search(r"^def (\w+)", c.source, re.M).group(1)
            eid, above = c.metadata["workbook"]["exercise"], p.cells[i - 1]
            assert above.cell_type == "markdown" and re.search(rf"Exercise {re.escape(eid)}\b", above.source) \
                and f"`{fn}" in above.source, (f"{name}: the cell above exercise {eid}'s stub must be its statement (a "
                                               f"markdown cell naming 'Exercise {eid}' and `{fn}`), got {above.source[:80]!r}")
        if c.cell_type == "markdown" and c.metadata.get("workbook", {}).get("replaces") != "solution":
            for sentence in re.split(r"(?<=[.!?])\s+", c.source):
                assert not (_PROMISES_A_REMOVED_CELL.search(sentence) and "complete notebook" not in sentence), \
                    f"{name}, participant cell {i}: promises a cell the participant version removed: {sentence!r}"


def _broken(mutate):
    nb = _toy()
    mutate(nb.cells)
    return nb


@pytest.mark.parametrize("mutate, words", [
    (lambda c: c[3].metadata.pop("workbook"), "cell 3 (id"),                                   # tag without id
    (lambda c: c[3].metadata.update(tags=["grader", "solution"]), "exactly one of the tags"),
    (lambda c: c[3].metadata.update(tags="grader"), "must be a list"),
    (lambda c: c[6].metadata.update(workbook={"exercise": "A"}), "cell 6"),                   # id without a tag
    (lambda c: c[7].metadata.update(workbook={"exercise": "A"}), "second 'exercise' cell"),
    (lambda c: c[2].metadata.update(workbook={"exercise": ""}), "non-empty string"),
    (lambda c: c[8].metadata.update(workbook={"exercise": "C"}), "exercise B has no 'grader'"),
    (lambda c: [x.metadata.update(workbook={"exercise": "C"}) for x in c[9:11]], "exercise B has no 'solution'"),
    (lambda c: c.insert(1, c.pop(4)), "order"),                                                # marker above the stub
    (lambda c: c.__setitem__(2, _cell("markdown", "stub?", "exercise", "A")), "must be a code cell"),
    (lambda c: c.pop(10), "no code cell"),
])
def test_malformed_metadata_is_refused_with_a_clear_message(mutate, words):
    with pytest.raises(ex.ExerciseFormatError) as e:
        ex.participant_version(_broken(mutate), "toy.ipynb")
    assert words in str(e.value) and str(e.value).startswith("toy.ipynb")


def test_lint_wants_the_marker_and_collapsed_solutions():
    nb = _broken(lambda c: (c[4].__setattr__("source", "The solution:"), c[5].metadata.pop("jupyter")))
    problems = ex.lint(nb, "toy")
    assert len(problems) == 2 and "beginning" in problems[0] and "source_hidden" in problems[1]


# --------------------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------------------

def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["exercises", "--help"])
    assert e.value.code == 0 and "OUTDIR" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "exercises" in capsys.readouterr().out


def test_cli_writes_named_notebooks_and_their_packages(capsys, tmp_path):
    name = WITH_EXERCISES[-1]
    rc, out, _ = _run(capsys, "exercises", str(tmp_path / "new" / "dir"), name.split("_")[0])
    assert rc == 0 and f"[{name}]" in out and "solutions replaced by their stubs" in out, out
    written = nbformat.read(tmp_path / "new" / "dir" / name, as_version=4)
    assert not any("solution" in c.metadata.get("tags", []) for c in written.cells)
    for d in ex.notebooks_dir().iterdir():          # the packages the notebooks import (audit_sample/)
        if (d / "__init__.py").is_file():
            assert (tmp_path / "new" / "dir" / d.name / "__init__.py").is_file()
    rc, _, err = _run(capsys, "exercises", str(tmp_path / "new" / "dir"), name)            # a participant's work
    assert rc == 1 and "already exists" in err and "--force" in err and err.count("\n") == 1
    rc, _, _ = _run(capsys, "exercises", "--force", str(tmp_path / "new" / "dir"), name)
    assert rc == 0


@pytest.mark.parametrize("case", ["unknown", "file", "under_a_file", "unwritable", "source", "malformed"])
def test_cli_errors_are_one_line(capsys, tmp_path, monkeypatch, case):
    outdir, names = tmp_path / "out", [WITH_EXERCISES[0]]
    if case == "unknown":
        names = ["no_such_notebook"]
    elif case == "file":
        outdir.write_text("a file, not a directory")
    elif case == "under_a_file":
        (tmp_path / "f").write_text("a file")
        outdir = tmp_path / "f" / "out"
    elif case == "unwritable":
        outdir.mkdir()
        outdir.chmod(0o500)
        if os.access(outdir, os.W_OK):       # root ignores permissions
            pytest.skip("running as root: a read-only directory is still writable")
    elif case == "source":
        outdir = ex.notebooks_dir()
    elif case == "malformed":
        nb = _broken(lambda c: c[3].metadata.pop("workbook"))
        nbformat.write(nb, tmp_path / "toy.ipynb")
        names = [str(tmp_path / "toy.ipynb")]
    rc, out, err = _run(capsys, "exercises", str(outdir), *names)
    assert rc in (1, 2) and out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    words = {"unknown": "known notebooks: 00", "file": "not a directory", "under_a_file": "Not a directory",
             "unwritable": "ermission",
             "source": "overwrite them", "malformed": "cell 3"}[case]
    assert words in err
    assert not (ex.notebooks_dir() / "toy.ipynb").exists()


# --------------------------------------------------------------------------------------------------
# the complete notebooks
# --------------------------------------------------------------------------------------------------

def test_the_exercises_are_tagged():
    # every notebook that grades something has its graders tagged (a grader left untagged would keep its
    # solution in the participant version)
    for name, nb in COMPLETE.items():
        graded = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "not attempted" in json.dumps(c.outputs)]
        tagged = [e.grader for e in ex.exercises(nb, name)]
        assert set(graded) <= set(tagged), f"{name}: cells with a 'not attempted' output {graded}, tagged graders {tagged}"
    assert set(WITH_EXERCISES) >= {n for n in COMPLETE if n[:2] in ("00", "01", "02", "03", "04", "05", "07")}


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_solutions_sit_collapsed_below_a_marker(name):
    assert ex.lint(COMPLETE[name], name) == []


def _bound(source):
    from IPython.core.inputtransformer2 import TransformerManager

    tree = ast.parse(TransformerManager().transform_cell(source))
    names, loads = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            for t in ast.walk(node):
                if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                    names.add(t.id)
    for t in ast.walk(tree):
        if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Load):
            loads.add(t.id)
    return names, loads


def _names_only_solutions_define(nb, name) -> list[str]:
    """Cells outside the solution regions that use a name only a solution region defines (the
    participant version has no solution cells: such a cell would fail there)."""
    solution_cells = {i for e in ex.exercises(nb, name) for i in e.solution}
    only_in_solutions, defined, bad = set(), set(), []
    for i, c in enumerate(nb.cells):
        if c.cell_type != "code":
            continue
        names, loads = _bound(c.source)
        if i in solution_cells:
            only_in_solutions |= names - defined
        else:
            bad += [f"cell {i} uses {n}" for n in sorted((loads & only_in_solutions) - names)]
            defined |= names
            only_in_solutions -= names
    return bad


def test_a_cell_that_needs_a_solution_name_is_found():
    nb = _toy()
    assert _names_only_solutions_define(nb, "toy") == []
    nb.cells[5].source += "\nhelper = f"
    nb.cells[6].source = "y = helper(1)"
    assert _names_only_solutions_define(nb, "toy") == ["cell 6 uses helper"]


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_no_cell_outside_a_solution_needs_a_name_only_a_solution_defines(name):
    assert _names_only_solutions_define(COMPLETE[name], name) == []


# --------------------------------------------------------------------------------------------------
# every exercise, executed
# --------------------------------------------------------------------------------------------------

def _text(outputs) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") in ("execute_result", "display_data"):
            parts.append(o.get("data", {}).get("text/plain", ""))
        elif o.get("output_type") == "error":
            parts.append(f"{o.get('ename')}: {o.get('evalue')}")
    return "".join(parts).strip()


CHECK_OUTPUT = "NBVAL_CHECK_OUTPUT"
# what nbval leaves out of a comparison (nbval.plugin.IPyNbFile.skip_compare, without --nbdime)
_SKIP_COMPARE = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                 "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}


def _comparable(outputs) -> dict:
    """Outputs as nbval compares them: streams of one name merged (\r and \b applied), every key but
    the skipped ones, data flattened by MIME type, the order kept within a key."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    flat: dict = {}
    for o in transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(copy.deepcopy(o)) for o in outputs])):
        for key, value in o.items():
            if key in _SKIP_COMPARE:
                continue
            if key == "data":
                for mime, v in value.items():
                    if mime not in _SKIP_COMPARE:
                        flat.setdefault(mime, []).append(v)
            else:
                flat.setdefault(key, []).append(value)
    return flat


def _differs(test_outputs, ref_cell) -> str | None:
    """nbval --nbval-lax's check of one cell: None when ``ref_cell`` is not marked NBVAL_CHECK_OUTPUT
    (or was never run), else None when the outputs agree and a short description when they do not."""
    if ref_cell.cell_type != "code" or CHECK_OUTPUT not in ref_cell.source or ref_cell.execution_count is None:
        return None
    got, want = _comparable(test_outputs), _comparable(ref_cell.outputs)
    if got == want:
        return None
    return f"cell id {ref_cell.get('id')}: outputs differ from the committed ones: got {got!r:.400}, expected {want!r:.400}"


# The regrade and the stub's second run are not in the complete notebook: whatever random numbers they
# draw are put back, so the cells below see the generators where nbval's run of the complete notebook
# leaves them (their checked outputs must match).
_SAVE_RNG = ("import random as _wb_random, numpy as _wb_np, torch as _wb_torch\n"
             "_wb_rng = (_wb_random.getstate(), _wb_np.random.get_state(), _wb_torch.get_rng_state())")
_RESTORE_RNG = ("_wb_random.setstate(_wb_rng[0]); _wb_np.random.set_state(_wb_rng[1]); "
                "_wb_torch.set_rng_state(_wb_rng[2]); del _wb_rng")


async def _run_participant(path: Path, complete, name: str) -> dict:
    """Execute the participant notebook at ``path``; per exercise: the grader's output on the stub and
    after the solution; every cell the complete notebook marks NBVAL_CHECK_OUTPUT compared with its
    committed outputs, as nbval --nbval-lax does. Stops at the first cell that errs."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    regions = {e.id: e for e in ex.exercises(complete, name)}
    by_id = {c.get("id"): c for c in complete.cells}
    stubs = {c.metadata["workbook"]["exercise"]: c for c in nb.cells if "exercise" in c.metadata.get("tags", [])}
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    result = {"error": None, "exercises": {}, "seconds": 0.0, "checked": 0, "mismatches": []}
    t0 = time.perf_counter()
    where = ""

    def check(outputs, ref_cell):
        if ref_cell is not None and CHECK_OUTPUT in ref_cell.get("source", ""):
            result["checked"] += 1
            bad = _differs(outputs, ref_cell)
            if bad:
                result["mismatches"].append(bad)

    try:
        async with client.async_setup_kernel():
            for i, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                where = f"cell {i} (id {cell.get('id')}): {cell.source[:80]!r}"
                await client.async_execute_cell(cell, i)
                check(cell.outputs, by_id.get(cell.get("id")))
                if "grader" not in cell.metadata.get("tags", []):
                    continue
                e = regions[cell.metadata["workbook"]["exercise"]]
                r = result["exercises"][e.id] = {"stub": _text(cell.outputs), "solution_errors": []}
                for j in e.solution:                       # insert the solution ...
                    if complete.cells[j].cell_type == "code":
                        where = f"exercise {e.id}'s solution, complete notebook's cell {j}"
                        sol = new_code_cell(complete.cells[j].source)
                        await client.async_execute_cell(sol, i)
                        check(sol.outputs, complete.cells[j])
                await client.async_execute_cell(new_code_cell(_SAVE_RNG), i)
                regrade = new_code_cell(cell.source)        # ... grade it again ...
                where = f"exercise {e.id}'s grader, run again after the solution"
                await client.async_execute_cell(regrade, i)
                r["solved"] = _text(regrade.outputs)
                where = f"exercise {e.id}'s stub, run again"
                await client.async_execute_cell(new_code_cell(stubs[e.id].source), i)   # ... and back to the stub
                await client.async_execute_cell(new_code_cell(_RESTORE_RNG), i)
    except CellExecutionError as err:
        result["error"] = f"{where}: {' '.join(str(err).split())[-600:]}"
    result["seconds"] = time.perf_counter() - t0
    return result


@pytest.fixture(scope="module")
def participant_runs(request, tmp_path_factory):
    # only the notebooks the selected tests ask for (pytest -k 07 runs one notebook)
    wanted = {item.callspec.params["name"] for item in request.session.items
              if "participant_runs" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")}
    names = [n for n in WITH_EXERCISES if n in wanted]
    out = tmp_path_factory.mktemp("participant")
    ex.write_participant_notebooks(out, [ex.notebooks_dir() / n for n in names])
    # two notebooks at a time on a 2-core machine; one under pytest-xdist (the other worker has the other core)
    jobs = max(1, int(os.environ.get("WORKBOOK_EXERCISE_JOBS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2")))
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is None:      # the kernels share the cores instead of each taking all of them
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))

    async def all_runs():
        gate = asyncio.Semaphore(jobs)

        async def one(name):
            async with gate:
                return name, await _run_participant(out / name, COMPLETE[name], name)

        return dict(await asyncio.gather(*(one(n) for n in names)))

    t0 = time.perf_counter()
    try:
        runs = asyncio.run(all_runs())
    finally:
        if threads is None:
            del os.environ["OMP_NUM_THREADS"]
    print(f"\nparticipant notebooks, {jobs} at a time: {time.perf_counter() - t0:.0f} s wall; "
          + ", ".join(f"{n[:2]} {r['seconds']:.0f} s" for n, r in runs.items()))
    return runs


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_participant_notebook_runs_top_to_bottom(participant_runs, name):
    run = participant_runs[name]
    assert run["error"] is None, f"{name}: {run['error']}"
    assert set(run["exercises"]) == {e.id for e in ex.exercises(COMPLETE[name], name)}


@pytest.mark.parametrize("name", WITH_EXERCISES)
def test_participant_notebook_reproduces_the_checked_outputs(participant_runs, name):
    """The same check nbval --nbval-lax makes of the complete notebook (tests/conftest.py leaves nbval's
    own run of these notebooks out when this test runs: one execution proves both)."""
    run = participant_runs[name]
    assert run["error"] is None, f"{name}: {run['error']}"
    assert not run["mismatches"], f"{name}: " + "\n".join(run["mismatches"])
    marked = sum(CHECK_OUTPUT in c.source for c in COMPLETE[name].cells if c.cell_type == "code")
    assert run["checked"] == marked, f"{name}: {run['checked']} of the {marked} NBVAL_CHECK_OUTPUT cells were checked"


@pytest.mark.parametrize("name, exercise", CASES, ids=[f"{n[:2]}-{e}" for n, e in CASES])
def test_grader_says_not_attempted_on_the_stub_and_passes_the_solution(participant_runs, name, exercise):
    run = participant_runs[name]
    r = run["exercises"].get(exercise)
    assert r is not None, f"{name}: exercise {exercise} was not reached ({run['error']})"
    assert NOT_ATTEMPTED.fullmatch(r["stub"]), f"{name} exercise {exercise}, the stub graded: {r['stub']!r}"
    assert PASSED.fullmatch(r.get("solved", "")), f"{name} exercise {exercise}, the solution graded: {r.get('solved')!r}"


def test_the_executed_checks_can_fail(tmp_path):
    # a made-up notebook run the same way: exercise A's solution is right; B's forgets to bind the stub's
    # name (its grader still says "not attempted"); a later cell calls a stub (the run stops there)
    def check(fn):
        return f"from workbook.check import grade\ngrade('{fn}', lambda: {fn}(1) == 2 or (_ for _ in ()).throw(AssertionError('no')))"

    nb = new_notebook(cells=[
        _cell("code", "def f(n):\n    raise NotImplementedError", "exercise", "A"),
        _cell("code", check("f"), "grader", "A"),
        _cell("markdown", ex.MARKER, "solution", "A"),
        _cell("code", "def f(n):\n    return n + 1", "solution", "A", hidden=True),
        _cell("code", "def g(n):\n    raise NotImplementedError", "exercise", "B"),
        _cell("code", check("g"), "grader", "B"),
        _cell("markdown", ex.MARKER, "solution", "B"),
        _cell("code", "def g_solution(n):\n    return n + 1", "solution", "B", hidden=True),
        _cell("code", "f(1)"),
    ])
    nbformat.write(ex.participant_version(nb, "toy.ipynb"), tmp_path / "toy.ipynb")
    run = asyncio.run(_run_participant(tmp_path / "toy.ipynb", nb, "toy.ipynb"))
    a, b = run["exercises"]["A"], run["exercises"]["B"]
    assert NOT_ATTEMPTED.fullmatch(a["stub"]) and PASSED.fullmatch(a["solved"]), a
    assert NOT_ATTEMPTED.fullmatch(b["stub"]) and NOT_ATTEMPTED.fullmatch(b["solved"]), b   # would fail the test
    assert run["error"] and "NotImplementedError" in run["error"] and "f(1)" in run["error"], run["error"]


def test_the_output_check_is_nbvals_and_can_fail(tmp_path):
    # a made-up notebook: the grader draws random numbers (its second run, after the solution, must not
    # shift the numbers the cells below see), a checked solution cell, a checked cell whose committed
    # output is right and one whose committed output is wrong (the only mismatch to be reported)
    import torch

    torch.manual_seed(0)
    torch.rand(3)                                    # the grader's draw in the complete notebook's run
    expected = f"{torch.rand(1).item():.6f}\n"
    grader = ("from workbook.check import grade\ntorch.rand(3)\n"
              "grade('f', lambda: f(1) == 2 or (_ for _ in ()).throw(AssertionError('no')))")
    nb = new_notebook(cells=[
        _cell("code", "import torch\ntorch.manual_seed(0)"),
        _cell("code", "def f(n):\n    raise NotImplementedError", "exercise", "A"),
        _cell("code", grader, "grader", "A"),
        _cell("markdown", ex.MARKER, "solution", "A"),
        _cell("code", "# NBVAL_CHECK_OUTPUT\ndef f(n):\n    return n + 1\nprint('bound')", "solution", "A",
              outputs=["bound\n"], hidden=True),
        _cell("code", "# NBVAL_CHECK_OUTPUT\nprint(f'{torch.rand(1).item():.6f}')", outputs=[expected]),
        _cell("code", "# NBVAL_CHECK_OUTPUT\nprint('what the cell prints')", outputs=["what it printed once\n"]),
    ])
    nbformat.write(ex.participant_version(nb, "toy.ipynb"), tmp_path / "toy.ipynb")
    run = asyncio.run(_run_participant(tmp_path / "toy.ipynb", nb, "toy.ipynb"))
    assert run["error"] is None, run["error"]
    assert PASSED.fullmatch(run["exercises"]["A"]["solved"]), run
    assert run["checked"] == 3, run
    assert len(run["mismatches"]) == 1 and "what it printed once" in run["mismatches"][0], run["mismatches"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_cell_with_outputs_has_an_execution_count(path):
    """nbval (README: run a notebook you will teach with pytest --nbval-lax) refuses a code cell that carries outputs
    but no execution count ("unrun reference cell has outputs"): a cell re-run by hand must be given one."""
    nb = json.loads(path.read_text())
    bad = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c["outputs"]
           and c.get("execution_count") is None]
    assert not bad, f"{path.name}: code cells {bad} have outputs but no execution_count"
