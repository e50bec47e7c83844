"""The audit's front: :func:`audit` (files and folders on disk) and the command line
``python -m workbook audit PATH...`` (:func:`add_arguments`, :func:`run`, :func:`main`).

Made to gate a CI run: every file met is either audited or named in ``skipped`` with why (unreadable,
undecodable, unparsable, a special file never opened), counted, and reflected in the exit code
(:func:`~workbook.audit.results.exit_code`: 0 clean, 1 findings, 2 usage, 3 files not audited;
``--strict`` makes every skip fatal); each real file is audited once whatever the paths given;
large trees are shared among worker processes (``--jobs``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Iterable

from .driver import audit_sources
from .results import CONFIDENCES, EXIT_USAGE, AuditResult, Skipped, exit_code, format_text, to_json
from .source import _iter_files, _read_source

EXIT_CODES = """exit codes:
  0  no finding at or above --min-confidence, and every file audited
  1  findings at or above --min-confidence (files not audited are still named and counted)
  2  bad usage, or a path given does not exist
  3  no such finding, but files were not audited (unreadable, not decodable, not parsable, or an
     audit error); named pipes, devices and sockets are skipped unopened, named, and count here
     only with --strict
  --strict: any file not audited gives 3, even when there are findings"""


def audit(paths: Iterable[str] | str, exclude: Iterable[str] = (), jobs: int = 0) -> AuditResult:
    """Audit every ``.py`` file under ``paths`` (files or directories), skipping ``exclude`` globs
    (matched against the path relative to each given directory's parent, the file name, and each
    folder name). Files that cannot be read, decoded or parsed, and special files (pipes, devices),
    are listed in ``result.skipped``; a file reached twice is audited once. ``jobs``: worker
    processes for a large tree (0: one per CPU; 1: none)."""
    t0 = time.perf_counter()
    if isinstance(paths, (str, Path)):
        paths = [str(paths)]
    files, unread = _iter_files(paths, list(exclude))
    found = len(files) + sum(s.kind != "folder" for s in unread)   # .py files met, audited or not
    sources = {}
    for full, rel in files:
        try:
            sources[rel] = _read_source(full)
        except UnicodeDecodeError as e:
            unread.append(Skipped(rel, f"UnicodeDecodeError: {e}", "encoding"))
        except SyntaxError as e:   # a coding line that names no codec
            unread.append(Skipped(rel, f"SyntaxError: {e.msg}", "encoding"))
        except OSError as e:
            unread.append(Skipped(rel, f"{type(e).__name__}: {e.strerror or e}", "unreadable"))
    res = audit_sources(sources, jobs=jobs)
    res.skipped = unread + res.skipped
    res.files = found
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
    parser.add_argument("--strict", action="store_true",
                        help="make any file not audited fatal: exit 3 even when there are findings, and for "
                             "special files (pipes, devices) too")
    parser.add_argument("--jobs", type=int, default=0, metavar="N",
                        help="worker processes for a large tree (default 0: one per CPU; 1: none); "
                             "the result does not depend on it")
    parser.epilog = EXIT_CODES
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the audit; the exit code is documented in :data:`EXIT_CODES` (``--help``)."""
    missing = [p for p in args.paths if not os.path.lexists(p)]
    if missing:
        print(f"audit: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    strict = getattr(args, "strict", False)
    res = audit(args.paths, exclude=args.exclude, jobs=getattr(args, "jobs", 0))
    code = exit_code(res, args.min_confidence, strict)
    if args.json:
        print(json.dumps(to_json(res, args.min_confidence, strict), indent=1))
    else:
        print(format_text(res, args.min_confidence))
    for s in res.skipped:
        print(f"audit: skipped {s.file}: {s.error}", file=sys.stderr)
    if res.skipped:
        names = res.skipped_files()
        print(f"audit: {len(names)} file(s) not audited, or not wholly (exit code {code}"
              f"{', --strict' if strict else ''}): {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}",
              file=sys.stderr)
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbook audit",
                                description="List allocate-then-overwrite candidates (zero fills that are overwritten) "
                                            "and empty buffers written only through partial slices.")
    add_arguments(p)
    return run(p.parse_args(argv))
