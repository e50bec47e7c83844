"""Command line of the workbook.

    python -m workbook check                      where kernels run, versions
    python -m workbook bench TOPIC [TOPIC ...]    GPU benchmarks -> workbook/data/<topic>.json
    python -m workbook execute NB.ipynb ... --out DIR   run notebooks top to bottom (nbclient), save with outputs

Topics: alloc (zeros vs empty), and every topic module with a ``benchmark()`` function
(nvfp4, fp8, turboquant, gdn, ...). ``benchmark()`` returns ``(results, ceilings)``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import workbook  # noqa: F401  (device choice first)

from . import bench
from .device import describe


def _cmd_check(_args) -> int:
    print(json.dumps(describe(), indent=1))
    return 0


def _cmd_bench(args) -> int:
    for topic in args.topics:
        module = importlib.import_module("workbook.bench" if topic == "alloc" else f"workbook.{topic}")
        if not hasattr(module, "benchmark"):
            raise SystemExit(f"workbook.{topic} has no benchmark()")
        t0 = time.time()
        results, ceilings = module.benchmark()
        path = bench.save_record(topic, results, ceilings, Path(args.data) if args.data else None)
        print(f"[{topic}] {time.time() - t0:.0f} s -> {path}")
    return 0


def _cmd_execute(args) -> int:
    import nbformat
    from nbclient import NotebookClient

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for nb_path in map(Path, args.notebooks):
        nb = nbformat.read(nb_path, as_version=4)
        t0 = time.time()
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name=args.kernel,
                           resources={"metadata": {"path": str(nb_path.parent)}}).execute()
            print(f"[{nb_path.name}] executed in {time.time() - t0:.0f} s")
        except Exception as e:  # keep going: the partial notebook shows where it stopped
            print(f"[{nb_path.name}] FAILED after {time.time() - t0:.0f} s: {type(e).__name__}: {str(e)[-2000:]}")
            status = 1
        nbformat.write(nb, out / nb_path.name)
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m workbook", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="where kernels run, versions").set_defaults(fn=_cmd_check)
    b = sub.add_parser("bench", help="run GPU benchmarks and record them")
    b.add_argument("topics", nargs="+")
    b.add_argument("--data", help="directory for the JSON records (default workbook/data)")
    b.set_defaults(fn=_cmd_bench)
    e = sub.add_parser("execute", help="execute notebooks with nbclient and save them with outputs")
    e.add_argument("notebooks", nargs="+")
    e.add_argument("--out", required=True)
    e.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    e.add_argument("--kernel", default="python3")
    e.set_defaults(fn=_cmd_execute)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
