"""The audit's front: :func:`audit` (files and folders on disk) and the command line
``python -m workbook audit PATH...`` (:func:`add_arguments`, :func:`run`, :func:`main`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterable

from .results import CONFIDENCES, AuditResult, Skipped, format_text, to_json
from .driver import audit_sources
from .source import _iter_files


def audit(paths: Iterable[str] | str, exclude: Iterable[str] = ()) -> AuditResult:
    """Audit every ``.py`` file under ``paths`` (files or directories), skipping ``exclude`` globs
    (matched against the path relative to each given directory's parent, the file name, and each
    folder name). Files that cannot be read or parsed are listed in ``result.skipped``."""
    t0 = time.perf_counter()
    if isinstance(paths, (str, Path)):
        paths = [str(paths)]
    sources, unread = {}, []
    for full, rel in _iter_files(paths, list(exclude)):
        try:
            sources[rel] = full.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            unread.append(Skipped(rel, f"{type(e).__name__}: {e}"))
    res = audit_sources(sources)
    res.skipped = unread + res.skipped
    res.files = len(sources) + len(unread)
    res.seconds = time.perf_counter() - t0
    return res


# ---- command line ---------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The arguments of ``python -m workbook audit`` (call :func:`run` with the parsed namespace)."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="Python files or directories to audit")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--min-confidence", choices=CONFIDENCES, default="medium",
                        help="report (and fail on) findings at or above this confidence (default: medium)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="skip files/folders matching this glob (repeatable), e.g. 'tests' or '*/benchmarks/*'")
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the audit; exit code 1 when findings at or above --min-confidence exist, 2 for a bad path."""
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        print(f"audit: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    res = audit(args.paths, exclude=args.exclude)
    if args.json:
        print(json.dumps(to_json(res, args.min_confidence), indent=1))
    else:
        print(format_text(res, args.min_confidence))
    for s in res.skipped:
        print(f"audit: skipped {s.file}: {s.error}", file=sys.stderr)
    return 1 if res.at_least(args.min_confidence) else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbook audit",
                                description="List allocate-then-overwrite candidates (zero fills that are overwritten) "
                                            "and empty buffers written only through partial slices.")
    add_arguments(p)
    return run(p.parse_args(argv))

