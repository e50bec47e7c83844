"""Participant notebooks from one source: the exercise convention and its generator.

The notebooks in ``notebooks/`` are the complete versions (CI runs them). Their exercise cells are
marked with JupyterLab's own cell metadata, never found by matching text:

=================  ===============================================================================
cell               metadata
=================  ===============================================================================
stub               ``tags: ["exercise"]``, ``workbook: {"exercise": ID}``. A code cell, the
                   participant's starting point: a function with the name the grader calls, whose
                   body raises ``NotImplementedError``.
grader             ``tags: ["grader"]``, ``workbook: {"exercise": ID}``. A code cell after the
                   stub that grades it, ``grade("...", lambda: check_...(name))``: it prints
                   "not attempted yet" on the stub, "passed" on a right answer, a teaching message
                   otherwise, and never raises.
solution region    ``tags: ["solution"]``, ``workbook: {"exercise": ID}``, on every cell of the
                   region, after the grader: first a markdown marker beginning with
                   ``**Solution below; try first.**``, then the code (wrong answers the grader
                   catches, the reference solution, displays of its source), each code cell
                   collapsed with ``jupyter: {"source_hidden": true}`` (JupyterLab shows a ``…``).
                   The region binds the reference to the stub's name, so running the grader cell
                   again after it passes.
=================  ===============================================================================

``ID`` is the exercise's number in its notebook (a string: ``"1.1"``, ``"3"``). The stub and the
solution region are tied by it: one stub, one grader and one solution region per ID.

A participant version (:func:`participant_version`, ``python -m workbook exercises OUTDIR``) is the
complete notebook with every solution region replaced by its stub: the region's cells are removed,
so the stub cell above the grader is the participant's to fill in, and one markdown line in the
region's place says where the reference solution is. Outputs of stub and grader cells are cleared;
every other cell is kept as it is, outputs included.
"""
from __future__ import annotations

import copy
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ROLES", "MARKER", "ExerciseFormatError", "Exercise", "exercises", "participant_version",
           "lint", "notebooks_dir", "resolve_notebooks", "write_participant_notebooks"]

ROLES = ("exercise", "grader", "solution")
MARKER = "**Solution below; try first.**"


class ExerciseFormatError(ValueError):
    """A notebook's exercise metadata breaks the convention (the message names the cell and the rule)."""


@dataclass
class Exercise:
    """One exercise of a complete notebook: cell indices of its stub, grader and solution region."""

    id: str
    stub: int = -1
    grader: int = -1
    solution: list[int] = field(default_factory=list)


def _where(name: str, i: int, cell) -> str:
    return f"{name}: cell {i} (id {cell.get('id', '?')})"


def exercises(nb, name: str = "notebook") -> list[Exercise]:
    """The exercises of a complete notebook, in order, after checking the convention (module
    docstring); a cell that breaks it raises :class:`ExerciseFormatError` naming the cell and the rule."""
    found: dict[str, Exercise] = {}
    for i, cell in enumerate(nb.cells):
        md = cell.get("metadata", {})
        tags = md.get("tags", [])
        if not isinstance(tags, list):
            raise ExerciseFormatError(f"{_where(name, i, cell)}: metadata.tags must be a list of strings, got {tags!r}")
        roles = [t for t in tags if t in ROLES]
        ex = md.get("workbook", {}).get("exercise") if isinstance(md.get("workbook"), dict) else None
        if not roles and ex is None:
            continue
        if len(roles) != 1:
            raise ExerciseFormatError(f"{_where(name, i, cell)}: an exercise cell carries exactly one of the tags "
                                      f"{', '.join(ROLES)} (metadata.tags), got {roles or 'none'}")
        role = roles[0]
        if not isinstance(ex, str) or not ex.strip():
            raise ExerciseFormatError(f"{_where(name, i, cell)}: a cell tagged {role!r} needs its exercise id in "
                                      f"metadata.workbook.exercise (a non-empty string), got {ex!r}")
        e = found.setdefault(ex, Exercise(ex))
        if role in ("exercise", "grader"):
            if cell.cell_type != "code":
                raise ExerciseFormatError(f"{_where(name, i, cell)}: the {role!r} cell of exercise {ex} must be a "
                                          f"code cell, not {cell.cell_type}")
            attr = "stub" if role == "exercise" else "grader"
            if getattr(e, attr) >= 0:
                raise ExerciseFormatError(f"{_where(name, i, cell)}: exercise {ex} has a second {role!r} cell "
                                          f"(the first is cell {getattr(e, attr)}); one per exercise")
            setattr(e, attr, i)
        else:
            e.solution.append(i)
    for e in found.values():
        missing = [r for r, v in (("exercise", e.stub), ("grader", e.grader)) if v < 0]
        if missing or not e.solution:
            missing += [] if e.solution else ["solution"]
            raise ExerciseFormatError(f"{name}: exercise {e.id} has no {' and no '.join(map(repr, missing))} cell "
                                      "(each exercise needs a stub, a grader and a solution region)")
        if not e.stub < e.grader < e.solution[0]:
            raise ExerciseFormatError(f"{name}: exercise {e.id}: its cells must come in the order stub (cell "
                                      f"{e.stub}), grader (cell {e.grader}), solution region (from cell "
                                      f"{e.solution[0]})")
        if not any(nb.cells[i].cell_type == "code" for i in e.solution):
            raise ExerciseFormatError(f"{name}: exercise {e.id}: its solution region has no code cell")
    return sorted(found.values(), key=lambda e: e.stub)


def lint(nb, name: str = "notebook") -> list[str]:
    """How a complete notebook's solutions are presented: each region opens with the marker, and its
    code cells are collapsed. Returns the problems found (empty when none)."""
    problems = []
    for e in exercises(nb, name):
        first = nb.cells[e.solution[0]]
        if first.cell_type != "markdown" or not first.source.startswith(MARKER):
            problems.append(f"{name}: exercise {e.id}: its solution region must open with a markdown cell "
                            f"beginning {MARKER!r} (cell {e.solution[0]})")
        for i in e.solution:
            c = nb.cells[i]
            if c.cell_type == "code" and not c.metadata.get("jupyter", {}).get("source_hidden"):
                problems.append(f"{_where(name, i, c)}: solution code of exercise {e.id} is not collapsed "
                                "(metadata.jupyter.source_hidden: true)")
    return problems


def _note_id(ex: str, taken: set[str]) -> str:
    base = "solution-note-" + re.sub(r"[^A-Za-z0-9_-]", "-", ex)
    cid, k = base[:64], 1
    while cid in taken:
        cid, k = f"{base[:58]}-{k}", k + 1
    return cid


_NBVAL_LINE = re.compile(r"^[ \t]*#[ \t]*NBVAL_[A-Z_]+[^\n]*(\n|$)", re.M)


def participant_version(nb, name: str = "notebook"):
    """A new notebook: ``nb`` with each solution region replaced by its stub (the region's cells
    removed, one markdown line in their place), the outputs of stub and grader cells cleared, and the
    test markers (``# NBVAL_CHECK_OUTPUT`` and the like: nbval's, for the complete notebooks) taken out
    of every code cell, so that a participant sees only code that is theirs to read."""
    import nbformat

    exs = exercises(nb, name)
    region_of = {i: e for e in exs for i in e.solution}
    cleared = {i for e in exs for i in (e.stub, e.grader)}
    taken = {c.get("id") for c in nb.cells}
    out = copy.deepcopy(nb)
    cells = []
    for i, cell in enumerate(out.cells):
        e = region_of.get(i)
        if e is not None:
            if i == e.solution[0]:
                note = nbformat.v4.new_markdown_cell(
                    f"*The reference solution of exercise {e.id} is in the complete notebook, `{name}` in the "
                    "workbook's `notebooks/` folder, collapsed below the line \"Solution below; try first\".*")
                note.id = _note_id(e.id, taken)
                taken.add(note.id)
                note.metadata["workbook"] = {"exercise": e.id, "replaces": "solution"}
                cells.append(note)
            continue
        if i in cleared:
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.source = _NBVAL_LINE.sub("", cell.source)
        cells.append(cell)
    out.cells = cells
    out.metadata["workbook"] = {"participant_version_of": name}
    nbformat.validate(out)
    return out


# --------------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------------

def notebooks_dir() -> Path:
    """The complete notebooks: ``notebooks/`` beside the ``workbook`` package (a source checkout)."""
    return Path(__file__).resolve().parent.parent / "notebooks"


def resolve_notebooks(names, source: Path | None = None) -> list[Path]:
    """Notebook paths for ``names``: a path to an ``.ipynb`` file, or a notebook of ``source`` named by
    its file name, its stem or its number (``02``). No names: every notebook of ``source``. An unknown
    name raises ``LookupError`` listing the known ones."""
    source = Path(source) if source is not None else notebooks_dir()
    known = sorted(source.glob("*.ipynb")) if source.is_dir() else []
    if not names:
        if not known:
            raise LookupError(f"no notebooks found in {source}")
        return known
    paths = []
    for n in names:
        p = Path(n)
        if p.suffix == ".ipynb" and p.is_file():
            paths.append(p)
            continue
        stem = p.name[:-len(".ipynb")] if p.name.endswith(".ipynb") else p.name
        hits = [k for k in known if k.stem == stem] or [k for k in known if k.stem.split("_")[0] == stem]
        if len(hits) != 1:
            raise LookupError(f"unknown notebook {n!r}; known notebooks: {', '.join(k.stem for k in known) or 'none'}")
        paths.append(hits[0])
    return paths


def _support_dirs(folder: Path) -> list[Path]:
    """Python packages beside the notebooks that they import (e.g. notebooks/audit_sample/)."""
    return sorted(d for d in folder.iterdir() if d.is_dir() and (d / "__init__.py").is_file())


def write_participant_notebooks(outdir, notebooks, force: bool = False) -> list[tuple[Path, list[str]]]:
    """Write the participant version of each notebook (paths) into ``outdir`` (created if missing),
    and copy the Python packages that sit beside them (the notebooks import them). Refuses to write
    into a notebook's own folder, and to overwrite a notebook in ``outdir`` (a participant's work)
    unless ``force``. Returns ``[(written path, exercise ids)]``. Everything is checked before the
    first file is written."""
    import nbformat

    outdir = Path(outdir)
    notebooks = [Path(p) for p in notebooks]
    if outdir.exists() and not outdir.is_dir():
        raise NotADirectoryError(f"OUTDIR {outdir} exists and is not a directory")
    for p in notebooks:
        if outdir.exists() and outdir.resolve() == p.resolve().parent:
            raise ValueError(f"OUTDIR {outdir} is the folder of the complete notebooks: the participant "
                             "versions would overwrite them; choose another directory")
    versions = []
    for p in notebooks:
        nb = nbformat.read(p, as_version=4)
        versions.append((p, participant_version(nb, p.name), [e.id for e in exercises(nb, p.name)]))
    existing = [outdir / p.name for p in notebooks if (outdir / p.name).exists()]
    if existing and not force:
        raise FileExistsError(f"{', '.join(str(e) for e in existing)} already exist{'s' if len(existing) == 1 else ''}"
                              " (a participant's work?); pass --force to overwrite")
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for p, nb, ids in versions:
        nbformat.write(nb, outdir / p.name)
        written.append((outdir / p.name, ids))
    for folder in sorted({p.resolve().parent for p in notebooks}):
        for d in _support_dirs(folder):
            shutil.copytree(d, outdir / d.name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
    return written
