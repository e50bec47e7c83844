"""Static audit: where does a codebase zero-fill a buffer that is then overwritten?

``python -m workbook audit PATH...`` (or ``python -m workbook.audit PATH...``) reads Python sources with
:mod:`ast` and lists allocate-then-overwrite candidates, each with a confidence and a proof obligation,
and ``empty`` buffers written only in part; notebook 07 proves them with :mod:`workbook.coverage`. The
rules (what counts as a fill, an overwrite, a read; how confidence is decided) are in the docstring
of :mod:`workbook.audit.analyzer`. The package, in the order its modules import each other:

* ``results``: :class:`Finding`, :class:`Skipped`, :class:`AuditResult`, :func:`format_text`, :func:`to_json`;
* ``source``: the files, their defs found by text and parsed one at a time, the shared :mod:`ast` helpers;
* ``analyzer``: follows one buffer through a function body to its decisive use (kernels and helpers too);
* ``sites``: the fills of each function and what they make: findings, necessary fills;
* ``driver``: :func:`audit_sources` runs the sites over in-memory sources;
* ``cli``: :func:`audit` over files and folders, and the command line (:func:`add_arguments`, :func:`run`,
  :func:`main`).

Only :mod:`ast` and the standard library: no torch, no GPU.
"""
from .cli import add_arguments, audit, main, run
from .results import CONFIDENCES, AuditResult, Finding, Skipped, format_text, to_json
from .driver import audit_sources

__all__ = [
    "CONFIDENCES", "Finding", "Skipped", "AuditResult", "audit", "audit_sources", "format_text", "to_json",
    "add_arguments", "run", "main",
]
