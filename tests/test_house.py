"""The house plan (DESIGN.md), held against the code: one role per module, imports that only run
downwards, no circle, files and functions along their seams, headers that describe the design."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "workbook"

TOPICS = ("start_here", "alloc", "nvfp4", "fp8", "turboquant", "gdn", "fusion")
CORE = ("device", "nvcc", "timing", "records", "coverage", "check", "exercises", "sass", "plots.common")
ROLES = ("benchmarks", "plots", "graders")
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 80
MAX_HEADER_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join(parts) or "workbook"] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Modules of the package that ``name`` imports (absolute or relative, at any depth)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package and package != "workbook" else []
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("workbook"):
                mod = node.module.removeprefix("workbook").lstrip(".")
            else:
                continue
            for alias in node.names:
                sub = f"{mod}.{alias.name}" if mod else alias.name
                found.add(sub if sub in MODULES else mod)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("workbook."):
                    found.add(alias.name.removeprefix("workbook."))
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _role(name: str) -> str:
    head = name.split(".")[0]
    if name in CORE:
        return "core"
    if head in ROLES:
        return head
    if name in TOPICS:
        return "topic"
    return "other"


def test_no_import_circle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in GRAPH[n]:
            if state.get(m) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in GRAPH:
        if n not in state:
            visit(n)


@pytest.mark.parametrize("name", [n for n in MODULES if _role(n) in ("core", "topic")])
def test_imports_run_downwards(name):
    """A topic module imports only the core (and kernels); the core imports no topic and no
    benchmark, picture or grader module."""
    bad = {m for m in GRAPH[name] if _role(m) in ROLES or (_role(m) == "topic" and _role(name) == "core")
           or m == "__main__"}
    assert not bad, f"workbook.{name} ({_role(name)}) imports {sorted(bad)}: imports run downwards"


def test_every_topic_has_its_rooms():
    for topic in TOPICS:
        assert topic in MODULES, topic
        if not (ROOT / "kernels" / f"{topic}.py").exists():
            continue                    # no launcher (alloc: notebook 01 launches torch's own kernels)
        src = MODULES[topic].read_text()
        assert re.search(r"^CONFIG\s*(:[^=]+)?=\s*\{", src, re.M), f"workbook/{topic}.py: one CONFIG dict"
        assert not re.search(r"^(TUNE_CONFIGS|DEFAULT_CONFIG|CONFIG_KEYS|\w+_CONFIG)\s*=", src, re.M), \
            f"workbook/{topic}.py: one CONFIG per topic"
    for topic in ("alloc", "nvfp4", "fp8", "turboquant", "gdn", "fusion"):
        assert f"benchmarks.{topic}" in MODULES, topic


def test_one_convention_per_concept():
    for name, path in MODULES.items():
        src = path.read_text()
        if name != "device":
            assert not re.search(r"def _?sm_count\b", src), f"{path.name}: sm_count lives in workbook.device"
            assert not re.search(r"def (_?resolve_emulate|_emulate)\b", src), \
                f"{path.name}: launchers call device.resolve_emulate(emulate, EMULATE_WHY)"
        if name != "timing":
            assert not re.search(r"\bdo_bench\(", src), f"{path.name}: timers live in workbook.timing"
            assert "Event(enable_timing" not in src, f"{path.name}: timers live in workbook.timing"


@pytest.mark.parametrize("path", list(MODULES.values()), ids=list(MODULES))
def test_files_and_functions_along_their_seams(path):
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_FILE_LINES, f"{path.relative_to(ROOT)}: {len(lines)} lines (house: <= {MAX_FILE_LINES})"
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= MAX_FUNCTION_LINES, \
                f"{path.relative_to(ROOT)}:{node.lineno} {node.name} has {n} lines (house: <= {MAX_FUNCTION_LINES})"


def _cu_header(path: Path) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, ln in enumerate(lines) if ln.startswith("#include"))


@pytest.mark.parametrize("path", sorted((ROOT / "kernels").rglob("*.py")) + sorted((ROOT / "kernels" / "cuda").glob("*.cu")),
                         ids=lambda p: p.name)
def test_source_headers_describe_the_design(path):
    if path.suffix == ".cu":
        n = _cu_header(path)
    else:
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        n = len(doc.splitlines())
    assert n <= MAX_HEADER_LINES, f"{path.relative_to(ROOT)}: a {n}-line header (house: <= {MAX_HEADER_LINES}; " \
                                  "measured history goes to the records or a notebook appendix)"
