"""Command line of the workbook.

    python -m workbook doctor                     where kernels run, versions, what is missing, and a
                                                  smoke run of one small kernel per topic (alias: check)
    python -m workbook bench TOPIC [TOPIC ...]    GPU benchmarks -> workbook/data/<topic>.json
    python -m workbook execute NB.ipynb ... --out DIR   run notebooks top to bottom (nbclient), save with outputs
    python -m workbook exercises OUTDIR [NB ...]  participant notebooks: every solution region replaced by
                                                  its stub (workbook/exercises.py has the convention)
    python -m workbook audit PATH ... [--json] [--min-confidence high|medium|low] [--exclude GLOB]
                                  [--strict] [--jobs N]   (exit 1: findings; 3: files not audited)
                                                  allocate-then-overwrite candidates in Python sources

Bench topics: the registry of :mod:`workbook.benchmarks` (alloc, nvfp4, fp8, turboquant, gdn,
fusion, cuda); each runs ``workbook.benchmarks.<topic>.run()`` and writes its record. A command never
answers with a traceback: an unexpected error prints one line; add --traceback (or set
WORKBOOK_DEBUG=1) for the full trace.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
from pathlib import Path

_DEBUG_HINT = "rerun with --traceback (or WORKBOOK_DEBUG=1) for the full trace"


class CommandError(Exception):
    """An error the command explains in one line (exit code in ``code``)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or repr(e)
    return f"{type(e).__name__}: {text[:limit]}" + ("..." if len(text) > limit else "")


# --------------------------------------------------------------------------------------------------
# topics
# --------------------------------------------------------------------------------------------------

def topic_modules() -> list[str]:
    """The topics ``doctor`` smoke-tests, in the notebooks' order (the keys of :data:`SMOKE`)."""
    return list(SMOKE)


def bench_topics() -> list[str]:
    """The topics ``bench`` knows: the registry of :mod:`workbook.benchmarks`."""
    from workbook import benchmarks

    return benchmarks.topics()


# --------------------------------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------------------------------

# distribution -> (needed for, required). Required ones break every notebook when missing.
PACKAGES = {
    "torch": ("every notebook", True),
    "triton": ("every kernel", True),
    "numpy": ("every notebook", True),
    "matplotlib": ("the plots", True),
    "ipykernel": ("running notebooks (Jupyter's Python kernel)", True),
    "jupyterlab": ("reading the notebooks in JupyterLab", False),
    "nbclient": ("`python -m workbook execute`", False),
    "nbformat": ("`python -m workbook execute`", False),
    "pytest": ("the tests", False),
    "nbval": ("running the notebooks as tests", False),
    "tqdm": ("the progress bar of `python -m workbook bench`", False),
}


def _smoke_start_here():
    import torch

    from workbook.start_here import iota

    got = iota(100, config={"BLOCK": 32}).cpu()
    assert torch.equal(got, torch.arange(100, dtype=torch.int32)), "iota(100) did not write 0..99"
    return "iota(100): every element written, values exact"


def _equal_bytes(a, b) -> bool:
    import torch

    a, b = a.detach().cpu(), b.detach().cpu()
    if a.dtype.itemsize == 1 and b.dtype.itemsize == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.shape == b.shape and torch.equal(a, b)


def _smoke_nvfp4():
    import torch

    from workbook import DEVICE
    from workbook.nvfp4 import global_scale_of, nvfp4_quant, quantize_ref

    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    gs = global_scale_of(x)
    got, ref = nvfp4_quant(x.to(DEVICE), gs.to(DEVICE)), quantize_ref(x, gs)
    assert all(_equal_bytes(a, b) for a, b in zip(got, ref)), "codes or scales differ from quantize_ref"
    return "nvfp4_quant [3, 64]: codes and swizzled scales equal quantize_ref"


def _smoke_fp8():
    import torch

    from workbook import DEVICE
    from workbook.fp8 import silu_mul_quant_fp8_packed, silu_mul_quant_fp8_reference

    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(DEVICE)
    got, ref = silu_mul_quant_fp8_packed(x), silu_mul_quant_fp8_reference(x)   # both on DEVICE, as the tests
    assert all(_equal_bytes(a, b) for a, b in zip(got, ref)), "codes or packed scales differ from the reference"
    return "silu_mul_quant_fp8_packed [3, 256]: codes and packed UE8M0 scales equal the reference"


def _smoke_gdn():
    import torch

    from workbook import DEVICE
    from workbook.check import rel_err
    from workbook.gdn import gated_rmsnorm, gated_rmsnorm_ref

    gen = torch.Generator().manual_seed(0)
    x, z, w = (torch.randn(*s, generator=gen).to(DEVICE) for s in ((5, 2, 16), (5, 2, 16), (16,)))
    e = rel_err(gated_rmsnorm(x, z, w), gated_rmsnorm_ref(x, z, w))
    assert e <= 1e-5, f"relative error {e:.2e} against gated_rmsnorm_ref exceeds 1e-5"
    return f"gated_rmsnorm [5, 2, 16]: relative error {e:.1e} against the reference"


def _smoke_turboquant():
    from workbook.check import rel_err
    from workbook.turboquant import make_example, mixed_attention, reference_mixed_attention

    q, k, v, cache, batch = make_example([1, 3], [9, 5], 1)   # one decode request, one prefill chunk
    out = mixed_attention(q, k, v, cache, batch)
    e = rel_err(out, reference_mixed_attention(q, k, v, cache, batch))
    assert e <= 2e-3, f"relative error {e:.2e} against reference_mixed_attention exceeds 2e-3"
    return f"mixed_attention (1 decode + 1 prefill request): relative error {e:.1e} against the reference"


def _smoke_fusion():
    import torch

    from workbook import DEVICE
    from workbook.check import rel_err
    from workbook.fusion import add_rmsnorm, add_rmsnorm_ref

    gen = torch.Generator().manual_seed(0)
    x, r, w = (torch.randn(*s, generator=gen).to(DEVICE) for s in ((3, 40), (3, 40), (40,)))
    (out, h), (ref, ref_h) = add_rmsnorm(x, r, w), add_rmsnorm_ref(x, r, w)
    assert torch.equal(h, ref_h), "the new residual x + residual is not exact"
    e = rel_err(out, ref)
    assert e <= 1e-5, f"relative error {e:.2e} against add_rmsnorm_ref exceeds 1e-5"
    return f"add_rmsnorm [3, 40]: relative error {e:.1e} against the unfused chain"


# One small launch per topic against its reference, in the notebooks' order (raise on failure).
SMOKE = {"start_here": _smoke_start_here, "nvfp4": _smoke_nvfp4, "fp8": _smoke_fp8,
         "turboquant": _smoke_turboquant, "gdn": _smoke_gdn, "fusion": _smoke_fusion}


def run_smoke(topic: str) -> tuple[bool, str]:
    """Import ``workbook.<topic>`` and launch one small kernel against its reference: (ok, verdict)."""
    try:
        importlib.import_module(f"workbook.{topic}")
        return True, SMOKE[topic]()
    except Exception as e:  # noqa: BLE001 - doctor reports every failure as a verdict
        return False, _one_line(e)


COMPILER_FIX = ("install a C++ compiler: Debian/Ubuntu `sudo apt-get install -y g++`; on macOS the workbook runs in a "
                "Linux container (Triton has no macOS wheels): install g++ there the same way; or point "
                "CXX at a compiler")


def compile_smoke() -> tuple[bool, str]:
    """torch.compile of a two-op function on CPU tensors, the path notebook 06 takes without a GPU:
    Inductor generates C++ and needs a working C++ compiler (``torch._inductor.config.cpp.cxx``, from
    $CXX, default g++). (ok, verdict)."""
    import torch

    try:
        fn = torch.compile(lambda x: torch.relu(x) * 2 + 1, dynamic=False)
        out = fn(torch.arange(-2.0, 2.0))
        if not torch.equal(out, torch.tensor([1.0, 1.0, 1.0, 3.0])):
            return False, f"compiled result {out.tolist()} is wrong"
    except Exception as e:  # noqa: BLE001 - doctor reports every failure as a verdict
        text = _one_line(e, 200)
        if "CxxCompiler" in text or "C++ compiler" in text:
            return False, f"no working C++ compiler for torch.compile on the CPU ({text}): {COMPILER_FIX}"
        return False, text
    from torch._inductor import config as inductor_config

    return True, f"C++ compiler {inductor_config.cpp.cxx[-1]} works"


def _versions() -> tuple[dict, list[str], list[str]]:
    from importlib import metadata

    versions, missing_required, missing_optional = {}, [], []
    for dist, (why, required) in PACKAGES.items():
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            (missing_required if required else missing_optional).append(f"{dist} (needed for {why})")
    return versions, missing_required, missing_optional


def _cmd_doctor(args) -> int:
    import platform

    known = topic_modules()
    unknown = [t for t in args.topics if t not in known]
    if unknown:
        raise CommandError(f"unknown topic{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                           f"known topics: {', '.join(known)}", 2)
    broken = []
    versions, missing_required, missing_optional = _versions()
    try:
        from workbook.device import describe

        d = describe()
    except Exception as e:  # noqa: BLE001
        print(f"where kernels run: UNKNOWN ({_one_line(e)})")
        return 1
    if d["interpreted"]:
        where = "CPU, in Triton's interpreter (no GPU here; GPU figures in the notebooks are recorded ones)"
        if os.environ.get("TRITON_INTERPRET") != "1":
            broken.append("TRITON_INTERPRET is not 1 although there is no GPU")
    else:
        where = f"GPU: {d['gpu']} ({d['sm_count']} SMs, {d['gpu_memory_GiB']} GiB), CUDA {d['cuda']}"
    print(f"where kernels run: {where}")
    print(f"Python {platform.python_version()} on {platform.system()} {platform.machine()}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    for m in missing_required:
        print(f"MISSING: {m}")
    for m in missing_optional:
        print(f"missing (optional): {m}")
    broken += [f"missing {m}" for m in missing_required]
    from workbook.nvcc import find_nvcc   # the CUDA C++ backends (backend="cuda"): optional, GPU only

    nvcc = find_nvcc()
    print("CUDA C++ kernels (backend=\"cuda\", optional): " + (
        f"nvcc at {nvcc[0]}; they compile on first use" + ("" if not d["interpreted"] else ", on a GPU")
        if nvcc else "no nvcc found; backend=\"cuda\" is unavailable, the Triton kernels need none"))

    # the recorded GPU results the notebooks fall back to
    from workbook import records

    topics = bench_topics()   # data/ holds other records too (audit, cpu_times): only these are listed
    names = sorted(p.stem for p in Path(records.DATA_DIR).glob("*.json") if p.stem in topics)
    bad = []
    for name in names:
        try:
            records.load_record(name)
        except Exception as e:  # noqa: BLE001
            bad.append(f"{name}.json ({_one_line(e, 120)})")
    print("recorded GPU results (workbook/data/): " + (", ".join(names) or "none")
          + (f"; BROKEN: {'; '.join(bad)}" if bad else ""))
    broken += [f"broken record {b}" for b in bad]
    unrecorded = [t for t in topics if t not in names]
    if unrecorded:
        print(f"not recorded yet: {', '.join(unrecorded)} (without a GPU their notebooks have no recorded "
              f"GPU figures; record them on a GPU with `python3 -m workbook bench {' '.join(unrecorded)}`)")

    if d["interpreted"]:   # without a GPU, notebook 06 compiles its decoder for the CPU: Inductor's C++
        t0 = time.perf_counter()
        ok, verdict = compile_smoke()
        print(f"torch.compile on the CPU (notebook 06): [{'ok' if ok else 'FAILED'}] {verdict} "
              f"({time.perf_counter() - t0:.1f} s)")
        if not ok:
            broken.append("torch.compile on the CPU (a C++ compiler; see above)")

    print("smoke runs (one small kernel per topic, against its pure-torch reference):")
    for topic in args.topics or known:
        t0 = time.perf_counter()
        ok, verdict = run_smoke(topic)
        print(f"  [{'ok' if ok else 'FAILED'}] {topic}: {verdict} ({time.perf_counter() - t0:.1f} s)")
        if not ok:
            broken.append(f"topic {topic}")
    if broken:
        print("NOT READY: " + "; ".join(broken))
        return 1
    print("ready: every notebook's needs are met")
    return 0


# --------------------------------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _count_measurements(bar):
    """Advance ``bar`` once per ``triton.testing.do_bench`` call (every timing in the workbook goes
    through it: workbook.timing.time_us and graph_time_us import it at call time)."""
    import triton.testing

    original = triton.testing.do_bench

    def counted(*a, **k):
        try:
            return original(*a, **k)
        finally:
            bar.update(1)

    triton.testing.do_bench = counted
    try:
        yield
    finally:
        triton.testing.do_bench = original


class _Counter:
    """Stand-in for a tqdm bar where tqdm is not installed (a GPU box without internet access)."""

    def __init__(self, desc: str):
        self.desc, self.n = desc, 0

    def update(self, k: int = 1) -> None:
        self.n += k
        print(f"\r{self.desc}: {self.n} measurements", end="", file=sys.stderr, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        print(file=sys.stderr)


def _progress(desc: str):
    """A progress bar over the measurements (tqdm; total unknown, so it counts and shows the rate)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _Counter(desc)
    return tqdm(desc=desc, unit=" measurements", file=sys.stderr)


def _gpu_present() -> bool:
    from workbook.device import ON_GPU

    return ON_GPU


def _cmd_bench(args) -> int:
    known = bench_topics()
    unknown = [t for t in args.topics if t not in known]
    if unknown:
        raise CommandError(f"unknown topic{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                           f"known topics: {', '.join(known)}", 2)
    if args.budget is not None and not args.budget > 0:
        raise CommandError(f"--budget must be a positive number of seconds, got {args.budget}", 2)
    if not _gpu_present():
        raise CommandError("bench measures GPU time and this machine has no GPU (kernels run in Triton's "
                           "interpreter here); the notebooks show the H200 results recorded in workbook/data/.", 2)
    from workbook import benchmarks, records

    directory = Path(args.data) if args.data else None
    for topic in args.topics:
        t0 = time.time()
        with _progress(f"bench {topic}") as bar, _count_measurements(bar):
            path = benchmarks.record(topic, budget_s=args.budget, smoke=args.smoke, directory=directory)
        label = records.recorded_label(records.load_record(topic, directory))   # read back: the schema holds
        print(f"[{topic}] {bar.n} measurements in {time.time() - t0:.0f} s -> {path} ({label})")
    return 0


# --------------------------------------------------------------------------------------------------
# execute
# --------------------------------------------------------------------------------------------------

def _cell_error(nb) -> str:
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"in code cell {i} ({out.get('ename')}: {' '.join(str(out.get('evalue', '')).split())[:200]})"
    return ""


def _cmd_execute(args) -> int:
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as e:
        raise CommandError(f"execute needs nbclient and nbformat ({_one_line(e)}): "
                           "python3 -m pip install nbclient nbformat")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for nb_path in map(Path, args.notebooks):
        if not nb_path.is_file():
            print(f"[{nb_path}] not found: no such notebook file")
            status = 1
            continue
        try:
            nb = nbformat.read(nb_path, as_version=4)
        except Exception as e:  # noqa: BLE001 - not JSON, not a notebook
            print(f"[{nb_path.name}] not a readable notebook: {_one_line(e, 200)}")
            status = 1
            continue
        t0 = time.time()
        try:
            NotebookClient(nb, timeout=args.timeout, kernel_name=args.kernel,
                           resources={"metadata": {"path": str(nb_path.parent)}}).execute()
            print(f"[{nb_path.name}] executed in {time.time() - t0:.0f} s")
        except Exception as e:  # noqa: BLE001 - keep going: the partial notebook shows where it stopped
            where = _cell_error(nb) or _one_line(e, 200)
            print(f"[{nb_path.name}] FAILED after {time.time() - t0:.0f} s {where}; partial notebook saved")
            status = 1
        nbformat.write(nb, out / nb_path.name)
    return status


# --------------------------------------------------------------------------------------------------
# exercises
# --------------------------------------------------------------------------------------------------

def _cmd_exercises(args) -> int:
    try:
        import nbformat  # noqa: F401
    except ImportError as e:
        raise CommandError(f"exercises needs nbformat ({_one_line(e)}): python3 -m pip install nbformat")
    from . import exercises

    try:
        paths = exercises.resolve_notebooks(args.notebooks)
    except LookupError as e:
        raise CommandError(str(e), 2)
    try:
        written = exercises.write_participant_notebooks(args.outdir, paths, force=args.force)
    except exercises.ExerciseFormatError as e:
        raise CommandError(f"malformed exercise metadata in {e}")
    except (OSError, ValueError) as e:   # unwritable OUTDIR, a file in its place, an unreadable notebook
        raise CommandError(f"participant notebooks not written: {_one_line(e, 400)}")
    for path, ids in written:
        what = (f"{len(ids)} exercise{'s' if len(ids) != 1 else ''} ({', '.join(ids)}), solutions replaced by "
                "their stubs" if ids else "no exercises, copied as it is")
        print(f"[{path.name}] {what} -> {path}")
    return 0


# --------------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workbook", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traceback", action="store_true", help="show the full Python traceback of an unexpected error")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in ("doctor", "check"):
        d = sub.add_parser(
            name, help="where kernels run, versions, what is missing, and a smoke run per topic"
            + (" (alias of doctor)" if name == "check" else ""),
            description="Say where the kernels will run (GPU or Triton's interpreter), the versions and what "
                        "is missing, check the recorded GPU results, and launch one small kernel per topic "
                        "against its reference. Exit code 1 when something a notebook needs is broken.")
        d.add_argument("topics", nargs="*", help="topics to smoke-test (default: every topic)")
        d.set_defaults(fn=_cmd_doctor)
    b = sub.add_parser("bench", help="run GPU benchmarks and record them as JSON",
                       description="Run each topic's benchmark (workbook.benchmarks.<topic>.run) on the GPU "
                                   "with a progress bar over the measurements and write "
                                   "workbook/data/<topic>.json. Needs a GPU (exit code 2 without one, or for "
                                   "an unknown topic).")
    b.add_argument("topics", nargs="+", metavar="TOPIC",
                   help="alloc, nvfp4, fp8, turboquant, gdn, fusion or cuda (workbook.benchmarks.REGISTRY)")
    b.add_argument("--data", help="directory for the JSON records (default workbook/data)")
    b.add_argument("--budget", type=float, metavar="SECONDS",
                   help="time budget of each topic's run, where it can trade rows for time")
    b.add_argument("--smoke", action="store_true", help="the small set each notebook times live (seconds)")
    b.set_defaults(fn=_cmd_bench)
    e = sub.add_parser("execute", help="execute notebooks top to bottom and save them with outputs",
                       description="Execute each notebook with nbclient and save it, outputs included, "
                                   "into --out. A missing or failing notebook gets one line; the others "
                                   "still run. Exit code 1 if any failed.")
    e.add_argument("notebooks", nargs="+", metavar="NB.ipynb")
    e.add_argument("--out", required=True, help="directory for the executed notebooks")
    e.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    e.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    e.set_defaults(fn=_cmd_execute)
    x = sub.add_parser("exercises", help="write participant notebooks: each solution region replaced by its stub",
                       description="Write the participant version of every notebook in notebooks/ (or of the "
                                   "ones named) into OUTDIR: the cells tagged 'solution' are removed, so the "
                                   "stub above each grader is the participant's to fill in; outputs of stub and "
                                   "grader cells are cleared, every other cell is kept. The packages the "
                                   "notebooks import from their folder (audit_sample/) are copied beside them. "
                                   "The tags are described in workbook/exercises.py.")
    x.add_argument("outdir", metavar="OUTDIR", help="directory for the participant notebooks (created if missing)")
    x.add_argument("notebooks", nargs="*", metavar="NB",
                   help="notebooks to convert: a path, a file name, a stem or a number such as 02 (default: all)")
    x.add_argument("--force", action="store_true", help="overwrite notebooks already in OUTDIR")
    x.set_defaults(fn=_cmd_exercises)
    from . import audit  # ast only: no torch, no GPU
    a = sub.add_parser("audit", help="list zero fills that a kernel or assignment then overwrites, and empty "
                                     "buffers written only in part",
                       description=audit.__doc__.split("\n\n")[0] if audit.__doc__ else None)
    audit.add_arguments(a)
    a.set_defaults(fn=audit.run)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_trace = "--traceback" in argv          # accepted before or after the command
    args = _parser().parse_args([a for a in argv if a != "--traceback"])
    debug = wants_trace or os.environ.get("WORKBOOK_DEBUG", "") not in ("", "0")
    try:
        import workbook  # noqa: F401  (device choice first: sets TRITON_INTERPRET=1 without a GPU)

        return args.fn(args)
    except CommandError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:   # the reader stopped early (| head): nothing is wrong, nothing more to print
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141            # 128 + SIGPIPE, what a shell reports for a writer whose reader left
    except Exception as e:  # noqa: BLE001 - a command line answers in one line, not a traceback
        if debug:
            raise
        print(f"error: {_one_line(e)} ({_DEBUG_HINT})", file=sys.stderr)
        return 1


def _hard_exit(code: int) -> None:
    """Leave without the interpreter's teardown (torch's modules and a large heap: most of a second that a CI
    gate on the audit would wait for), after flushing what was printed. Only where nothing is left to clean up:
    the audit, whose worker processes have all been joined."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):   # a reader that stopped early (| head) is no error here
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    code = main()
    if next((a for a in sys.argv[1:] if not a.startswith("-")), None) == "audit":
        _hard_exit(code)
    sys.exit(code)
