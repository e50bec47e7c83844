"""The static audit (workbook/audit/): every pattern found in a small fixture, the zero fills that
are part of the result not reported, helpers followed across files, the reverse risk, broken files,
the JSON schema, exit codes and --exclude; and notebook 07's graders (workbook/graders/audit.py)."""
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch

from workbook import audit as A

SAMPLE = Path(__file__).resolve().parents[1] / "notebooks" / "audit_sample"

KERNELS = '''
import triton
import triton.language as tl

@triton.jit
def store_kernel(x, out, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    p_out = out + o
    tl.store(p_out, tl.load(x + o, mask=o < N), mask=o < N)

@triton.jit
def atomic_kernel(x, acc, N, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.atomic_add(acc + o, tl.load(x + o))

@triton.jit
def rmw_kernel(x, acc, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(acc + o, tl.load(acc + o) + tl.load(x + o))

@triton.jit
def _inner(ptr, o, v):
    tl.store(ptr + o, v)

@triton.jit
def indexed_store_kernel(idx, out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    b_i = tl.load(idx + o)
    tl.store(out + b_i, 1)

@triton.jit
def nested_kernel(x, out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    _inner(out, o, tl.load(x + o))
'''


def _audit(**files):
    return A.audit_sources({name + ".py": textwrap.dedent(src) for name, src in files.items()})


def _by_func(res):
    return {f.function: f for f in res.findings}


def _necessary(res):
    return {n["function"]: n["why"] for n in res.necessary}


def test_each_pattern_found():
    res = _audit(kern=KERNELS, eng='''
        import torch
        def launch_zeros(x):
            out = torch.zeros(x.shape[0], device=x.device)
            store_kernel[(1,)](x, out, x.shape[0], BLOCK=16)
            return out
        def launch_zeros_like(x):
            out = torch.zeros_like(x)
            store_kernel[(1,)](x, out=out, N=4, BLOCK=16)
            return out
        def new_zeros_copy(x):
            y = x.new_zeros(x.shape)
            y.copy_(x * 2)
            return y
        def zero_then_slice_all(z, z_out):
            z_out.zero_()
            z_out[:] = z
        def fill0_ellipsis(z, buf):
            buf.fill_(0)
            buf[...] = z + 1
        def full0_out(a, b):
            r = torch.full((4, 4), 0, dtype=torch.float32)
            torch.matmul(a, b, out=r)
            return r
        def full_like0(a):
            r = torch.full_like(a, 0)
            r.copy_(a)
            return r
        def nested_jit(x):
            out = torch.zeros_like(x)
            nested_kernel[(1,)](x, out, BLOCK=16)
            return out
    ''')
    f = _by_func(res)
    expect = {"launch_zeros": "torch.zeros", "launch_zeros_like": "torch.zeros_like", "new_zeros_copy": ".new_zeros",
              "zero_then_slice_all": ".zero_()", "fill0_ellipsis": ".fill_(0)", "full0_out": "torch.full(.., 0)",
              "full_like0": "torch.full_like(.., 0)", "nested_jit": "torch.zeros_like"}
    for fn, pattern in expect.items():
        assert fn in f, f"{fn} not reported: {res.report()}"
        assert f[fn].pattern == pattern
        assert f[fn].confidence == "high", f[fn]
        assert f[fn].kind == "zero-fill-then-overwrite"
    assert f["launch_zeros"].line == 4 and f["launch_zeros"].file == "eng.py"
    assert "store_kernel" in f["launch_zeros"].overwrite and "grid" in f["launch_zeros"].obligation
    assert "out=" in f["full0_out"].overwrite


def test_zero_fills_that_are_the_result_not_reported():
    res = _audit(kern=KERNELS, eng='''
        import torch
        def atomics(x):
            acc = torch.zeros(16)
            atomic_kernel[(1,)](x, acc, 16, BLOCK=16)
            return acc
        def rmw(x):
            acc = torch.zeros(16)
            rmw_kernel[(1,)](x, acc, BLOCK=16)
            return acc
        def iadd(xs):
            acc = torch.zeros(4)
            for x in xs:
                acc += x
            return acc
        def index_add(x, idx):
            acc = torch.zeros(8, x.shape[1])
            acc.index_add_(0, idx, x)
            return acc
        def slice_iadd(x):
            acc = torch.zeros(8)
            acc[:4] += x
            return acc
        def read_first(x):
            m = torch.zeros(4)
            m = torch.maximum(m, x)
            return m
        def read_then_write(x, out):
            buf = torch.zeros_like(x)
            y = buf.sum()
            buf.copy_(x)
            return y
        def self_copy(x):
            buf = torch.zeros_like(x)
            buf.copy_(buf + x)
            return buf
        def partial_only(x, n):
            out = torch.zeros(8, 4)
            out[:n] = x
            return out
        def result_is_zeros(n):
            z = torch.zeros(n)
            return z
        def exclusive_branches(x, flag, caps):
            if flag:
                caps.zero_()
            else:
                torch.add(x, 1, out=caps)
        def slice_alias(x, n):
            out_padded = torch.zeros(16, 4)
            out_arg = out_padded[:n]
            torch.add(x, 1, out=out_arg)
            return out_padded
        def narrow_copy(x, k):
            buf = torch.zeros(4, 8)
            buf.narrow(1, 0, k).copy_(x)
            return buf
        def scatter(x, idx):
            out = torch.zeros(8)
            out.scatter_(0, idx, x)
            return out
    ''')
    assert res.findings == [], res.report()
    nec = _necessary(res)
    assert "atomics" in nec["atomics"] and "accumulate" in nec["atomics"]
    assert "accumulate" in nec["rmw"] and "accumulate" in nec["iadd"] and "index_add_" in nec["index_add"]
    assert nec["read_first"].startswith("read") and nec["read_then_write"].startswith("read")
    assert nec["partial_only"].startswith("partial") and nec["scatter"].startswith("partial")


def test_helpers_followed_across_files():
    res = _audit(kern=KERNELS, alloc='''
        import torch
        def make_out(x):
            return torch.zeros_like(x)
        def make_acc(n):
            buf = torch.zeros(n)
            return buf
        def make_pair(x):
            a = torch.zeros_like(x)
            b = torch.zeros(4)
            return a, b
    ''', eng='''
        def run(x):
            out = make_out(x)
            store_kernel[(1,)](x, out, 4, BLOCK=16)
            acc = make_acc(16)
            atomic_kernel[(1,)](x, acc, 16, BLOCK=16)
            a, b = make_pair(x)
            store_kernel[(1,)](x, a, 4, BLOCK=16)
            b += 1
            return out, acc, a, b
    ''')
    f = _by_func(res)
    assert set(f) == {"make_out", "make_pair"}, res.report()
    assert f["make_out"].file == "alloc.py" and f["make_out"].line == 4
    assert "eng.py" in f["make_out"].overwrite and "make_out()" in f["make_out"].overwrite
    assert f["make_pair"].variable == "a"           # element 0 is overwritten, element 1 accumulated
    assert f["make_out"].confidence == "medium"     # callers outside the files are not seen
    assert "make_acc" in _necessary(res)


def test_confidence_rules_and_flags():
    res = _audit(kern=KERNELS, eng='''
        import torch
        def unknown_kernel(x, flag):
            out = torch.zeros(round_up(x.shape[0], 128), 4)
            if flag:
                ext_kernel[(1,)](x, out)
            return out
        def unknown_kernel_plain(x):
            buf = torch.zeros(4)
            ext_kernel[(1,)](x, buf)
            return buf
        def custom_op(x):
            output = torch.zeros_like(x)
            torch.ops.my_ns.quant(output, x)
            return output
        def data_dependent(idx):
            out = torch.zeros(64, dtype=torch.int32)
            indexed_store_kernel[(1,)](idx, out, BLOCK=16)
            return out
        def through_view(x):
            s = torch.zeros(8, 4, dtype=torch.int32)
            t = s.T
            t.copy_(x)
            return s
    ''')
    f = _by_func(res)
    # a kernel or op not in the files is assumed to write its output-named argument: an assumption, so low,
    # and a conditional overwrite leaves the zeros where the condition is false: low too
    assert f["unknown_kernel"].confidence == "low" and f["unknown_kernel"].padding
    assert "CONDITIONAL" in f["unknown_kernel"].obligation and "PADDED" in f["unknown_kernel"].obligation
    assert f["unknown_kernel_plain"].confidence == "low"
    assert f["custom_op"].confidence == "low" and "custom op" in f["custom_op"].overwrite
    assert f["data_dependent"].confidence == "low" and "depends on loaded values" in f["data_dependent"].overwrite
    assert f["through_view"].view and "VIEW" in f["through_view"].obligation


def test_reverse_risk_partial_slices_of_empty():
    res = _audit(eng='''
        import torch
        def padded_rows(x, w, num_tokens):
            out = torch.empty(x.shape[0], w.shape[1])
            out[:num_tokens] = x[:num_tokens] @ w
            return out
        def same_bound(n, x):
            out = torch.empty(n, 4)
            out[:n] = x
            return out
        def complementary(d, p, nd):
            out = torch.empty(d.shape[0] + p.shape[0], 4)
            out[:nd] = d
            out[nd:] = p
            return out
        def per_expert(ws):
            out = torch.empty(len(ws), 4)
            for e in range(len(ws)):
                out[e] = ws[e]
            return out
        def whole(x):
            out = torch.empty_like(x)
            out[:] = x
            return out
    ''')
    f = _by_func(res)
    assert set(f) == {"padded_rows"}, res.report()
    assert f["padded_rows"].kind == "empty-partial-write" and f["padded_rows"].partial
    assert "out[:num_tokens]" in f["padded_rows"].overwrite and "cover" in f["padded_rows"].obligation


def test_complementary_slices_over_zeros_are_a_whole_write():
    res = _audit(eng='''
        import torch
        def mixed(d, p, nd):
            out = torch.zeros(d.shape[0] + p.shape[0], 4)
            out[:nd] = d
            out[nd:] = p
            return out
    ''')
    (f,) = res.findings
    assert f.function == "mixed" and f.partial and "disjoint and cover" in f.obligation


def test_unparsable_and_unreadable_files_are_named_and_skipped(tmp_path, capsys):
    (tmp_path / "good.py").write_text("import torch\ndef f(x, o):\n    o.zero_()\n    o[:] = x\n")
    (tmp_path / "broken.py").write_text("import torch\ndef f(x:\n    out = torch.zeros(3)\n")
    (tmp_path / "latin1.py").write_bytes(b"x = '\xff\xfe'\nout = torch.zeros(3)\n")
    (tmp_path / "nul.py").write_bytes(b"def g():\n    a = torch.zeros(2)\x00\n")
    res = A.audit([str(tmp_path)])
    skipped = {s.file.split("/")[-1]: s.error for s in res.skipped}
    assert set(skipped) == {"broken.py", "latin1.py", "nul.py"}, skipped
    assert "SyntaxError" in skipped["broken.py"] and "line" in skipped["broken.py"]
    assert [f.function for f in res.findings] == ["f"]
    rc = A.main([str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and "skipped" in err and "broken.py" in err


def test_cli_json_exit_codes_and_exclude(tmp_path, capsys):
    pkg = tmp_path / "eng"
    (pkg / "tests").mkdir(parents=True)
    (pkg / "a.py").write_text("import torch\ndef f(x):\n    out = torch.zeros_like(x)\n    out.copy_(x)\n    return out\n")
    (pkg / "tests" / "b.py").write_text("import torch\ndef g(x):\n    tmp = torch.zeros_like(x)\n    ext[(1,)](x, tmp)\n")
    assert A.main([str(pkg), "--json", "--min-confidence", "low"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "workbook.audit/1" and doc["files"] == 2
    assert set(doc) >= {"min_confidence", "seconds", "counts", "findings", "skipped", "necessary"}
    assert doc["counts"] == {"low": 1, "medium": 0, "high": 1}
    keys = {"file", "line", "where", "function", "variable", "kind", "pattern", "overwrite", "confidence", "reasons",
            "obligation", "padding", "view", "partial", "code"}
    assert all(set(f) == keys for f in doc["findings"])
    assert {f["where"] for f in doc["findings"]} == {"eng/a.py:3", "eng/tests/b.py:3"}
    # threshold: the low finding alone does not fail a 'medium' gate
    assert A.main([str(pkg / "tests"), "--min-confidence", "medium"]) == 0
    assert "0 finding(s)" in capsys.readouterr().out
    assert A.main([str(pkg), "--exclude", "tests", "--min-confidence", "low", "--json"]) == 1
    assert [f["where"] for f in json.loads(capsys.readouterr().out)["findings"]] == ["eng/a.py:3"]
    assert A.main([str(pkg), "--exclude", "a.py", "--exclude", "*/tests/*", "--min-confidence", "low"]) == 0
    capsys.readouterr()
    assert A.main([str(tmp_path / "missing")]) == 2
    with pytest.raises(SystemExit):
        A.main([str(pkg), "--min-confidence", "certain"])


def test_add_arguments_and_run_for_the_workbook_cli(capsys):
    import argparse
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd")
    A.add_arguments(sub.add_parser("audit"))
    args = p.parse_args(["audit", str(SAMPLE), "--min-confidence", "high"])
    assert A.run(args) == 1
    out = capsys.readouterr().out
    assert "layers.py" in out and "[high]" in out


def test_python_dash_m_workbook_audit_runs_the_package():
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "workbook.audit", str(SAMPLE), "--min-confidence", "high"],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 1 and "[high]" in r.stdout, r.stderr


def test_sample_project_findings():
    """The sample engine of notebook 07: its true and false candidates, as the notebook relies on."""
    res = A.audit([str(SAMPLE)])
    f = _by_func(res)
    assert set(f) == {"scale_rows", "row_scales", "gate_into", "new_output", "project_tokens"}, res.report()
    # padded to a multiple of GROUP rows, written by a launch over the M real rows: the padding keeps its
    # zeros (group_scales reads them), so the audit no longer calls the zero fill a sure overwrite
    assert f["row_scales"].padding and f["row_scales"].confidence == "low"
    assert any("dimension 0 is padded" in r and "grid ((M,)) is bounded by the real count" in r
               for r in f["row_scales"].reasons), f["row_scales"].reasons
    assert f["new_output"].file.endswith("buffers.py") and "scale_rows_helper" in f["new_output"].overwrite
    # notebook 07 relies on it: out[:num_tokens] = ... then return out, a medium reverse risk
    assert f["project_tokens"].kind == "empty-partial-write" and f["project_tokens"].confidence == "medium"
    assert set(_necessary(res)) == {"token_histogram", "expert_sums"}


# ---- graders of notebook 07 -------------------------------------------------------------------------

from workbook.graders import audit as G  # noqa: E402


def test_the_verdicts_cover_what_the_audit_reports_on_the_sample():
    res = A.audit([str(SAMPLE)])
    assert set(G.SAMPLE_VERDICTS) == set(_by_func(res)) | set(_necessary(res))


def _stub(*args):
    raise NotImplementedError


def _verdicts(**changes):
    return lambda: dict(G.solution_verdicts(), **changes)


VERDICTS_WRONG = {
    "padding left to empty": (_verdicts(row_scales="empty"), "row_scales: 'empty' would change results.*padding"),
    "atomics on empty": (_verdicts(token_histogram="empty"), "atomic_adds"),
    "accumulator on empty": (_verdicts(expert_sums="empty"), "index_add_ accumulates"),
    "zeros everywhere": (lambda: {k: "zeros" for k in G.SAMPLE_VERDICTS}, "memset for nothing"),
    "empty everywhere": (lambda: {k: "empty" for k in G.SAMPLE_VERDICTS},
                         "(?s)4 of 7 verdicts are wrong.*project_tokens: 'empty' is what it does now, and that is the bug"),
    "zeros to hide the partial write": (_verdicts(project_tokens="zeros"), "a zero fill would only hide"),
    "a fix where nothing is broken": (_verdicts(gate_into="fix"), "gate_into: nothing to fix"),
    "one verdict only": (lambda: {"scale_rows": "empty"}, "missing"),
    "capitalised verdicts": (_verdicts(scale_rows="Empty"), "each verdict is one of"),
    "a list": (lambda: list(G.solution_verdicts().values()), "return a dict"),
}


@pytest.mark.parametrize("which", list(VERDICTS_WRONG))
def test_check_verdicts_fails_wrong_answers_with_the_intended_message(which):
    fn, message = VERDICTS_WRONG[which]
    with pytest.raises(AssertionError, match=message):
        G.check_verdicts(fn)


def test_graders_pass_the_solutions_and_report_the_stubs_not_attempted():
    from workbook.check import grade
    G.check_verdicts(G.solution_verdicts)
    G.check_mixed_batch_writer(G.solution_mixed_batch_writer)
    G.check_mixed_batch_writer(lambda dec, pre: torch.cat([dec, pre]))   # cat allocates and writes every row
    assert grade("stub", lambda: G.check_verdicts(_stub)).status == "not attempted"
    assert grade("stub", lambda: G.check_mixed_batch_writer(_stub)).status == "not attempted"


def _writer(dtype=None, alloc=torch.empty, rows=None, prefill_at=None, decode_first=True, fill=None):
    """A mixed-batch writer with one mistake switched on: the output's ``dtype`` (None: the inputs'),
    ``alloc``, ``rows`` allocated (a function of n = nd + npf), the row where the prefill rows start,
    the order of the two slices, a whole-buffer ``fill`` ('zero_', 'setitem') first."""
    def write(dec, pre):
        nd, n = dec.shape[0], dec.shape[0] + pre.shape[0]
        out = alloc(rows(n) if rows else n, dec.shape[1], dtype=dtype or dec.dtype, device=dec.device)
        if fill == "zero_":
            out.zero_()
        elif fill == "setitem":
            out[:] = 0
        first, second = (dec, pre) if decode_first else (pre, dec)
        at = first.shape[0] if prefill_at is None else prefill_at(nd)
        out[:first.shape[0]] = first
        out[at:at + second.shape[0]] = second[:max(0, min(second.shape[0], out.shape[0] - at))]
        return out
    return write


_ZERO_FILLED = ("nd=3, npf=5, D=4, float32: `out` was zero-filled ({}): that is the extra memset kernel this "
                "workbook removes. Allocate it with torch.empty: rows [0, nd) from the decode path and rows "
                "[nd, nd + npf) from the prefill path are disjoint and together cover every row")

MIXED_BATCH_WRONG = {
    "torch.zeros": (_writer(alloc=torch.zeros), _ZERO_FILLED.format("torch.zeros")),
    "empty then zero_()": (_writer(fill="zero_"), _ZERO_FILLED.format("Tensor.zero_()")),
    "empty then out[:] = 0": (_writer(fill="setitem"), _ZERO_FILLED.format("Tensor.fill_(0)")),
    "a float16 buffer": (_writer(dtype=torch.float16),
                         "nd=3, npf=5, D=4, float32: the output is float16, the inputs are float32: allocate with "
                         "the inputs' dtype"),
    "the dtype forgotten (float32 for bf16 inputs)": (
        lambda dec, pre: _writer(dtype=torch.float32)(dec, pre),
        "nd=0, npf=4, D=2, bfloat16: the output is float32, the inputs are bfloat16"),
    "a padded batch": (_writer(rows=lambda n: (n + 3) // 4 * 4 + 4), r"the output must be \[nd \+ npf, D\] = \[8, 4\], got \[12, 4\].*"
                       "padding that nobody writes"),
    "prefill one row too far": (_writer(prefill_at=lambda nd: nd + 1), "elements never written .*rows 3..3"),
    "slices swapped": (_writer(decode_first=False), "decode outputs go first"),
    "a tuple": (lambda dec, pre: (G.solution_mixed_batch_writer(dec, pre),), "return one tensor"),
}


@pytest.mark.parametrize("which", list(MIXED_BATCH_WRONG))
def test_check_mixed_batch_writer_fails_wrong_answers_with_the_intended_message(which):
    fn, message = MIXED_BATCH_WRONG[which]
    with pytest.raises(AssertionError) as e:
        G.check_mixed_batch_writer(fn)
    assert message in str(e.value) or re.search(message, str(e.value)), str(e.value)
