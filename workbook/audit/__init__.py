"""Static audit: where does a codebase zero-fill a buffer that is then overwritten?

``python -m workbook audit PATH...`` (or ``python -m workbook.audit PATH...``) reads Python sources with
:mod:`ast` and lists allocate-then-overwrite candidates, each with a confidence and a proof obligation,
and ``empty`` buffers written only in part; notebook 07 proves them with :mod:`workbook.coverage`. The
rules (what counts as a fill, an overwrite, a read; how confidence is decided) are in the docstring
of :mod:`workbook.audit.analyzer`. The package, in the order its modules import each other:

* ``results``: :class:`Finding`, :class:`Skipped`, :class:`AuditResult`, :func:`format_text`, :func:`to_json`;
* ``source``: the files, their defs found by text and parsed one at a time, the shared :mod:`ast` helpers;
* ``callees``, ``regions``, ``offsets``, ``kernel_use``: what a callee does by its name and words (``out=``,
  collectives, DLPack, an op's docstring), which part of a buffer a set of slices covers (and padding
  provenance), whether a Triton store's address can reach the whole buffer (not a start past index 0, a
  diagonal, a program id added to an arange), and how a Triton kernel uses a pointer; ``arguments``:
  which parameter a positional argument lands on once the starred arguments before it are expanded
  (unknown when a star's length is not shown);
* ``certainty``: how certain a reverse risk is: medium only when every write before the consumer is an
  unconditional, straight-line slice write and a part is provably outside them all; writes in a loop
  (a ``range`` loop's passes read as the range they cover), under an ``if``, a size a test picks, or a
  container kept in an attribute or at module level make it low, with the reason, or show it covered;
  ``rmw_launch``, ``caller_reads``, ``gathered``: what ``sites`` asks where the writes leave a gap (a later
  Triton launch that writes it, whole or under a select; callers that read only parts, or a whole return
  under a flag no call sets; all-gathered copies read only in part);
* ``analyzer``: follows one buffer through a function body to its decisive use (kernels and helpers too);
* ``sites``: the fills of each function and what they make: findings, necessary fills;
* ``driver``: :func:`audit_sources` runs the sites over in-memory sources (file by file, shared among
  forked worker processes on a large tree), each finding once;
* ``cli``: :func:`audit` over files and folders (each real file once; special files never opened), and
  the command line a CI gates on (:func:`add_arguments`, :func:`run`, :func:`main`; exit codes 0 clean,
  1 findings, 2 usage, 3 files not audited, ``--strict``).

Only :mod:`ast` and the standard library: no torch, no GPU.
"""
from .cli import add_arguments, audit, main, run
from .results import CONFIDENCES, AuditResult, Finding, Skipped, format_text, to_json
from .driver import audit_sources

__all__ = [
    "CONFIDENCES", "Finding", "Skipped", "AuditResult", "audit", "audit_sources", "format_text", "to_json",
    "add_arguments", "run", "main",
]
