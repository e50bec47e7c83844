"""The audit's driver: :func:`audit_sources` runs the sites (:mod:`workbook.audit.sites`) over a set of
in-memory sources, parsing only the functions that hold a candidate, then follows allocation helpers
to their callers."""
from __future__ import annotations

import time

from .analyzer import _Project
from .results import _RANK, AuditResult, Finding, Skipped
from .sites import _analyze_function, _follow_helpers
from .source import _CAND_RE, _hit_lines, _Source


def audit_sources(sources: dict[str, str]) -> AuditResult:
    """Audit in-memory sources ``{display name: python source}`` (what :func:`audit` does after reading).

    Only the functions that hold a fill or an ``empty`` allocation are parsed, plus those the analysis
    follows (kernels, helpers, callers); a file whose function does not parse alone is parsed whole,
    and a file that does not parse is named in ``skipped``."""
    t0 = time.perf_counter()
    skipped: list[Skipped] = []
    srcs = {name: _Source(name, text) for name, text in sources.items()}
    project = _Project(srcs, skipped)
    findings: list[Finding] = []
    necessary: list[dict] = []
    helper_sites: list = []
    done: set[int] = set()
    for src in srcs.values():
        if "zero" not in src.text and "empty" not in src.text and "full" not in src.text and "fill_" not in src.text:
            continue
        for line0 in _hit_lines(src, _CAND_RE):
            if src.broken:
                break
            d = src.enclosing_def(line0)
            if d is None:
                continue
            for fn in project.load(src.name, d[0], d[1]):
                if id(fn.node) in done:
                    continue
                done.add(id(fn.node))
                try:
                    _analyze_function(project, fn, findings, necessary, helper_sites)
                except Exception as e:  # never stop a CI run on one odd function
                    skipped.append(Skipped(fn.file, f"audit error in {fn.qualname}: {type(e).__name__}: {e}"))
    try:
        _follow_helpers(project, helper_sites, findings, necessary)
    except Exception as e:
        skipped.append(Skipped("<helpers>", f"audit error while following helpers: {type(e).__name__}: {e}"))
    findings.sort(key=lambda f: (-_RANK[f.confidence], f.file, f.line))
    return AuditResult(findings, skipped, len(sources), time.perf_counter() - t0, necessary)
