"""What the audit returns: its findings (:class:`Finding`), the files it could not read
(:class:`Skipped`), the whole result (:class:`AuditResult`), and the two ways to print it: text
(:func:`format_text`) and the ``--json`` document (:func:`to_json`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

CONFIDENCES = ("low", "medium", "high")
_RANK = {c: i for i, c in enumerate(CONFIDENCES)}


@dataclass
class Finding:
    """One candidate. ``kind`` is 'zero-fill-then-overwrite' or 'empty-partial-write'."""

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
    """A file the audit could not read or parse (or a function it could not analyze), and why."""

    file: str
    error: str


@dataclass
class AuditResult:
    """What :func:`workbook.audit.audit` returns; printing it prints :func:`format_text`."""

    findings: list[Finding]
    skipped: list[Skipped]
    files: int
    seconds: float
    necessary: list[dict] = field(default_factory=list)   # zero fills kept on purpose, with the reason

    def at_least(self, confidence: str) -> list[Finding]:
        return [f for f in self.findings if _RANK[f.confidence] >= _RANK[confidence]]

    def counts(self) -> dict[str, int]:
        return {c: sum(f.confidence == c for f in self.findings) for c in CONFIDENCES}

    def report(self, min_confidence: str = "low") -> str:
        return format_text(self, min_confidence)

    __str__ = report
    _repr_pretty_ = lambda self, p, cycle: p.text(self.report())  # noqa: E731


def format_text(res: AuditResult, min_confidence: str = "low") -> str:
    """The text report: each finding at or above ``min_confidence`` in four lines, then one summary line."""
    shown = res.at_least(min_confidence)
    lines = []
    for f in shown:
        tag = {"zero-fill-then-overwrite": "zero fill then overwrite", "empty-partial-write": "REVERSE RISK: empty, partial writes"}[f.kind]
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
                 f"low {c['low']}); {len(res.necessary)} zero fill(s) judged necessary; {res.files} file(s), "
                 f"{len(res.skipped)} skipped, {res.seconds:.2f} s")
    return "\n".join(lines)


def to_json(res: AuditResult, min_confidence: str = "low") -> dict:
    """The JSON document ``--json`` prints (schema version 1)."""
    return {
        "schema": "workbook.audit/1",
        "min_confidence": min_confidence,
        "files": res.files,
        "seconds": round(res.seconds, 3),
        "counts": res.counts(),
        "findings": [dict(asdict(f), where=f.where) for f in res.at_least(min_confidence)],
        "skipped": [asdict(s) for s in res.skipped],
        "necessary": res.necessary,
    }

