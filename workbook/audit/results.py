"""What the audit returns: its findings (:class:`Finding`), the files it could not read
(:class:`Skipped`), the whole result (:class:`AuditResult`), and the two ways to print it: text
(:func:`format_text`) and the ``--json`` document (:func:`to_json`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

CONFIDENCES = ("low", "medium", "high")
_RANK = {c: i for i, c in enumerate(CONFIDENCES)}
_TAGS = {"zero-fill-then-overwrite": "zero fill then overwrite",
         "empty-partial-write": "REVERSE RISK: empty, partial writes",
         "trail-lost": "TRAIL LOST: not followed", "suppression-without-reason": "suppression without a reason"}


@dataclass
class Finding:
    """One candidate. ``kind`` is 'zero-fill-then-overwrite', 'empty-partial-write', 'trail-lost' (a zero
    fill whose buffer goes where the audit cannot follow) or 'suppression-without-reason'."""

    file: str
    line: int
    function: str
    variable: str
    kind: str
    pattern: str                 # the fill (or empty allocation) as written, e.g. "torch.zeros(...)"
    overwrite: str               # what overwrites it (or the partial writes), with its file:line
    confidence: str
    reasons: list[str]
    obligation: str
    padding: bool = False
    view: bool = False
    partial: bool = False
    code: str = ""               # the statement as written

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class Skipped:
    """A file the audit could not read or parse (or a function it could not analyze), and why.

    ``kind``: 'unreadable' (cannot be stat-ed, opened, read or listed), 'encoding' (not decodable as
    its coding says), 'syntax' (does not parse: only its defs that parse alone were audited),
    'special' (a named pipe, device or socket: never opened), 'folder' (a folder that cannot be
    listed), 'analysis' (an error of the audit itself in a function)."""

    file: str
    error: str
    kind: str = "analysis"


#: Exit codes of ``python -m workbook audit`` (:func:`exit_code`).
EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3


def exit_code(res: "AuditResult", min_confidence: str = "medium", strict: bool = False) -> int:
    """1 when findings at or above ``min_confidence`` exist; else 3 when something was not audited
    (a file unreadable, undecodable or unparsable, an audit error; special files count only when
    ``strict``); else 0. With ``strict`` any skip, special files included, gives 3, even over
    findings: a gate then cannot mistake an incomplete audit for a complete one."""
    if strict and res.skipped:
        return EXIT_SKIPPED
    if res.at_least(min_confidence):
        return EXIT_FINDINGS
    if any(s.kind != "special" for s in res.skipped):
        return EXIT_SKIPPED
    return EXIT_CLEAN


@dataclass
class AuditResult:
    """What :func:`workbook.audit.audit` returns; printing it prints :func:`format_text`."""

    findings: list[Finding]
    skipped: list[Skipped]
    files: int
    seconds: float
    necessary: list[dict] = field(default_factory=list)   # zero fills kept on purpose, with the reason
    suppressed: list[dict] = field(default_factory=list)  # findings marked '# audit: ok -- <why>', with the why

    def at_least(self, confidence: str) -> list[Finding]:
        return [f for f in self.findings if _RANK[f.confidence] >= _RANK[confidence]]

    def counts(self) -> dict[str, int]:
        return {c: sum(f.confidence == c for f in self.findings) for c in CONFIDENCES}

    def skipped_files(self) -> list[str]:
        """The files (in order, each once) that were not audited, or not wholly."""
        return list(dict.fromkeys(s.file for s in self.skipped))

    def report(self, min_confidence: str = "low") -> str:
        return format_text(self, min_confidence)

    __str__ = report
    _repr_pretty_ = lambda self, p, cycle: p.text(self.report())  # noqa: E731


def format_text(res: AuditResult, min_confidence: str = "low") -> str:
    """The text report: each finding at or above ``min_confidence`` in four lines, then one summary line."""
    shown = res.at_least(min_confidence)
    lines = []
    for f in shown:
        tag = _TAGS.get(f.kind, f.kind)
        flags = [n for n, v in (("padding", f.padding), ("view", f.view), ("partial slice", f.partial)) if v]
        lines.append(f"{f.where}: [{f.confidence}] {tag} ({f.pattern}) in {f.function}(): {f.code}"
                     + (f"  [{', '.join(flags)}]" if flags else ""))
        lines.append(f"    overwritten by: {f.overwrite}")
        lines.append(f"    why {f.confidence}: {'; '.join(f.reasons)}")
        lines.append(f"    to prove: {f.obligation}")
    for s in res.skipped:
        lines.append(f"skipped {s.file}: {s.error}")
    c = res.counts()
    lines.append(f"{len(shown)} finding(s) at or above '{min_confidence}' (high {c['high']}, medium {c['medium']}, "
                 f"low {c['low']}); {len(res.suppressed)} suppressed; {len(res.necessary)} zero fill(s) judged "
                 f"necessary; {res.files} file(s), "
                 f"{len(res.skipped_files())} skipped, {res.seconds:.2f} s")
    return "\n".join(lines)


def to_json(res: AuditResult, min_confidence: str = "low", strict: bool = False) -> dict:
    """The JSON document ``--json`` prints (schema version 1): ``files`` found, ``skipped_files`` (how
    many of them, or of the folders, were not audited, or not wholly: each named in ``skipped`` with
    its ``kind``) and the ``exit_code`` the command returns."""
    return {
        "schema": "workbook.audit/1",
        "min_confidence": min_confidence,
        "exit_code": exit_code(res, min_confidence, strict),
        "files": res.files,
        "skipped_files": len(res.skipped_files()),
        "seconds": round(res.seconds, 3),
        "counts": res.counts(),
        "findings": [dict(asdict(f), where=f.where) for f in res.at_least(min_confidence)],
        "skipped": [asdict(s) for s in res.skipped],
        "necessary": res.necessary,
        "suppressed": res.suppressed,
    }

