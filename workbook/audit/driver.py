"""The audit's driver: :func:`audit_sources` runs the sites (:mod:`workbook.audit.sites`) over in-memory
sources, then follows allocation helpers to their callers.

Built for a tree of thousands of files in seconds:

* only the functions that hold a candidate are parsed (:mod:`workbook.audit.source`: each outermost
  def once, found through an index of the defs by line);
* the files are analysed one at a time, in order, and what each one yields (findings, necessary
  fills, suppressions, skips, allocation helpers) is kept apart (:class:`_FileResult`), so that a
  process pool (``jobs`` > 1, where the platform forks) can split the files among workers and merge
  their results back in file order; the allocation helpers are then followed here, over all files;
* a finding is reported once: deduplicated by (file, line, variable, kind), then sorted by
  confidence, file and line;
* the cyclic garbage collector is paused during a run: the audit makes millions of AST nodes and no
  cycles worth collecting, and collections that each walk every live node doubled its time.
"""
from __future__ import annotations

import ast
import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
import warnings
from dataclasses import dataclass, field

from .analyzer import _Project
from .results import _RANK, AuditResult, Finding, Skipped
from .sites import _analyze_function, _follow_helpers
from .source import _candidate_lines, _Func, _Source

_POOL_MIN_BYTES = 4_000_000     # candidate text below this is audited in-process: a pool costs more
_PARTS_PER_JOB = 4              # parts per worker, each in a fresh process: balance, and a lower peak memory


def audit_sources(sources: dict[str, str], jobs: int = 1) -> AuditResult:
    """Audit in-memory sources ``{display name: python source}`` (what :func:`audit` does after reading).

    Only the functions that hold a fill or an ``empty`` allocation are parsed, plus those the analysis
    follows (kernels, helpers, callers); a file whose function does not parse alone is parsed whole,
    and a file that does not parse is named in ``skipped``. ``jobs`` > 1 lets a process pool of that
    many workers share the files when there are many (0: one per CPU); the result is the same."""
    t0 = time.perf_counter()
    with _gc_paused():
        srcs = {name: _Source(name, text) for name, text in sources.items()}
        res = _audit(srcs, _jobs(jobs))
        del srcs   # freed while the collector is paused: it would walk every parsed node once more
    res.files = len(sources)
    res.seconds = time.perf_counter() - t0
    return res


def _jobs(jobs: int) -> int:
    if jobs and jobs > 0:
        return jobs
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(8, os.cpu_count() or 1))


@contextlib.contextmanager
def _gc_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@dataclass
class _FileResult:
    """What the analysis of one file's candidates yields (skips may name other files it followed)."""

    findings: list = field(default_factory=list)
    necessary: list = field(default_factory=list)
    helper_sites: list = field(default_factory=list)
    suppressed: list = field(default_factory=list)
    skipped: list = field(default_factory=list)


def _candidate(src: _Source) -> bool:
    t = src.text
    return "zero" in t or "empty" in t or "full" in t or "fill_" in t


def _analyze_file(project: _Project, src: _Source, done: set[int]) -> _FileResult:
    out = _FileResult()
    n_skip, n_supp = len(project.skipped), len(getattr(project, "suppressed", ()))
    for line0 in _candidate_lines(src):
        d = src.enclosing_def(line0)
        if d is None:
            continue
        for fn in project.load(src.name, d[0], d[1]):
            if id(fn.node) in done:
                continue
            done.add(id(fn.node))
            try:
                _analyze_function(project, fn, out.findings, out.necessary, out.helper_sites)
            except Exception as e:  # never stop a CI run on one odd function
                project.skipped.append(Skipped(fn.file, f"audit error in {fn.qualname}: {type(e).__name__}: {e}"))
    out.skipped = project.skipped[n_skip:]
    out.suppressed = list(getattr(project, "suppressed", [])[n_supp:])
    return out


def _analyze_files(project: _Project, names: list[str]) -> list[_FileResult]:
    done: set[int] = set()
    return [_analyze_file(project, project.sources[n], done) for n in names]


def _audit(srcs: dict[str, _Source], jobs: int) -> AuditResult:
    skipped: list[Skipped] = []
    project = _Project(srcs, skipped)
    names = [n for n, s in srcs.items() if _candidate(s)]
    per_file = _analyze_in_pool(project, names, jobs) if jobs > 1 else None
    if per_file is None:
        per_file = _analyze_files(project, names)
    findings: list[Finding] = []
    necessary: list[dict] = []
    helper_sites: list = []
    suppressed: list = []
    skips: list[Skipped] = []
    for r in per_file:   # in file order, whichever process analysed them
        findings += r.findings
        necessary += r.necessary
        helper_sites += r.helper_sites
        suppressed += r.suppressed
        skips += r.skipped
    n_skip, n_supp = len(project.skipped), len(getattr(project, "suppressed", ()))
    try:
        _follow_helpers(project, helper_sites, findings, necessary)
    except Exception as e:
        project.skipped.append(Skipped("<helpers>", f"audit error while following helpers: {type(e).__name__}: {e}"))
    skips += project.skipped[n_skip:]
    suppressed += getattr(project, "suppressed", [])[n_supp:]
    return AuditResult(_dedupe_findings(findings), _dedupe_skips(skips, srcs), len(srcs), 0.0,
                       _dedupe(necessary, ("file", "line", "variable", "pattern")),
                       _dedupe(suppressed, ("file", "line", "variable", "kind")))


def _dedupe_findings(findings: list[Finding]) -> list[Finding]:
    """One finding per (file, line, variable, kind): the first in (confidence, file, line) order."""
    findings = sorted(findings, key=lambda f: (-_RANK[f.confidence], f.file, f.line))
    seen: set = set()
    out = []
    for f in findings:
        key = (f.file, f.line, f.variable, f.kind)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _dedupe(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    seen: set = set()
    out = []
    for r in rows:
        key = tuple(r.get(k) for k in keys)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _dedupe_skips(skips: list[Skipped], srcs: dict) -> list[Skipped]:
    """Each skip once, in the order of the files (a file followed by several workers is met by each)."""
    order = {name: i for i, name in enumerate(srcs)}
    uniq = {(s.file, s.error): s for s in skips}
    return sorted(uniq.values(), key=lambda s: (order.get(s.file, len(order)), s.file, s.error))


# ---- the process pool -----------------------------------------------------------------------------

_POOL_STATE: tuple | None = None    # (project, parts): set before the workers fork, read by them


def _parts(names: list[str], srcs: dict[str, _Source], n: int) -> list[list[str]]:
    """``names`` cut, in order, into ``n`` runs of about equal text (neighbouring files share kernels)."""
    total = sum(len(srcs[x].text) for x in names)
    parts, cur, acc = [], [], 0
    for x in names:
        cur.append(x)
        acc += len(srcs[x].text)
        if acc >= total * (len(parts) + 1) / n and len(parts) < n - 1:
            parts.append(cur)
            cur = []
    parts.append(cur)
    return [p for p in parts if p]


def _analyze_in_pool(project: _Project, names: list[str], jobs: int) -> list[_FileResult] | None:
    """The files' results from up to ``jobs`` forked workers at a time, each part of the files in a
    fresh one; None (analyse in-process instead) when the files are few, the platform does not fork,
    this process runs other threads (forking them is unsafe), or anything goes wrong in a worker."""
    global _POOL_STATE
    srcs = project.sources
    if sum(len(srcs[x].text) for x in names) < _POOL_MIN_BYTES or threading.active_count() > 1 \
            or "fork" not in multiprocessing.get_all_start_methods():
        return None
    parts = _parts(names, srcs, jobs * _PARTS_PER_JOB)
    _POOL_STATE = (project, parts)
    try:
        packed = _run_parts(len(parts), jobs)
        return [_unpack(project, r) for rs in packed for r in rs]
    except Exception as e:   # pickling, a worker lost, ...: the in-process run gives the same result
        warnings.warn(f"audit: the worker processes failed ({type(e).__name__}: {e}); auditing in one process",
                      RuntimeWarning, stacklevel=2)
        return None
    finally:
        _POOL_STATE = None


def _run_parts(n: int, jobs: int) -> list[list[_FileResult]]:
    """Parts ``0..n-1`` in forked processes, ``jobs`` at a time; a worker that dies (killed, out of
    memory) raises here instead of leaving the run waiting for it."""
    ctx = multiprocessing.get_context("fork")
    results: list = [None] * n
    running: dict = {}
    todo = list(range(n))
    while todo or running:
        while todo and len(running) < jobs:
            i = todo.pop(0)
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_part_main, args=(i, writer), daemon=True)
            proc.start()
            writer.close()
            running[reader] = (proc, i)
        for reader in multiprocessing.connection.wait(list(running)):
            proc, i = running.pop(reader)
            try:
                results[i] = reader.recv()
            except EOFError:
                proc.join()
                raise RuntimeError(f"worker {i} ended without a result (exit code {proc.exitcode})") from None
            finally:
                reader.close()
            proc.join()
            if isinstance(results[i], BaseException):
                raise results[i]
    return results


def _part_main(i: int, conn) -> None:
    try:
        out = _pool_part(i)
    except BaseException as e:   # handed back: the parent falls back to one process
        out = RuntimeError(f"{type(e).__name__}: {e}")
    try:
        conn.send(out)
    finally:
        conn.close()


def _pool_part(i: int) -> list[_FileResult]:
    project, parts = _POOL_STATE
    results = _analyze_files(project, parts[i])
    for r in results:
        r.helper_sites = [_pack_site(site) for site in r.helper_sites]
    return results


def _pack_site(site: tuple) -> tuple:
    """An allocation-helper site with its function and nodes as references (file, line, position):
    ASTs do not cross processes as the same objects."""
    fn = next((x for x in site if isinstance(x, _Func)), None)
    out = []
    for x in site:
        if isinstance(x, _Func):
            x = ("<func>", x.file, x.node.lineno, x.qualname)
        elif isinstance(x, ast.AST) and fn is not None:
            x = ("<node>", type(x).__name__, x.lineno, x.col_offset, x.end_lineno, x.end_col_offset)
        out.append(x)
    return tuple(out)


def _unpack(project: _Project, r: _FileResult) -> _FileResult:
    r.helper_sites = [_unpack_site(project, site) for site in r.helper_sites]
    return r


def _unpack_site(project: _Project, site: tuple) -> tuple:
    ref = next(x for x in site if isinstance(x, tuple) and x[:1] == ("<func>",))
    _, file, lineno, qualname = ref
    src = project.sources[file]
    k = src.def_at(lineno - 1)
    if k < 0:
        raise LookupError(f"no def at {file}:{lineno}")
    line0, ind, _name = src.defs[k]
    fn = next(f for f in project.load(file, line0, ind) if f.node.lineno == lineno)
    if fn.qualname != qualname:
        raise LookupError(f"{file}:{lineno} is {fn.qualname}, not {qualname}")
    out = []
    for x in site:
        if x is ref:
            x = fn
        elif isinstance(x, tuple) and x[:1] == ("<node>",):
            x = next(n for n in ast.walk(fn.node) if (type(n).__name__, getattr(n, "lineno", None),
                     getattr(n, "col_offset", None), getattr(n, "end_lineno", None),
                     getattr(n, "end_col_offset", None)) == x[1:])
        out.append(x)
    return tuple(out)
