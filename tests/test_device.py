"""Where kernels run: one DEVICE, the interpreter fallback, and the import-order message."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import workbook
from workbook.device import DEVICE, INTERPRETED, ON_GPU, check_tensor, describe


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (from a file: compiled @triton.jit needs one)."""
    import tempfile

    e = dict(os.environ)
    e.pop("TRITON_INTERPRET", None)
    e.update(env)
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "script.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(code))
        return subprocess.run([sys.executable, script], capture_output=True, text=True, env=e, timeout=300)


def test_one_device_chosen_once():
    assert workbook.DEVICE is DEVICE
    assert DEVICE.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert INTERPRETED == (not ON_GPU)
    if INTERPRETED:
        assert os.environ.get("TRITON_INTERPRET") == "1"


def test_cpu_fallback_runs_a_triton_kernel_in_the_interpreter():
    r = _python("""
        import workbook, torch, triton, triton.language as tl
        @triton.jit
        def add_one(p_x, n: tl.constexpr):
            o = tl.arange(0, n)
            tl.store(p_x + o, tl.load(p_x + o) + 1)
        workbook.device.require_launchable(add_one)
        x = torch.arange(8, dtype=torch.float32, device=workbook.DEVICE)
        add_one[(1,)](x, 8)
        print(workbook.DEVICE, workbook.INTERPRETED, x.tolist())
    """, WORKBOOK_DEVICE="cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0:2] == ["cpu", "True"]
    assert "[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]" in r.stdout


def test_kernel_defined_before_workbook_gets_a_clear_message():
    r = _python("""
        import triton, triton.language as tl
        @triton.jit
        def k(p_x):
            pass
        import workbook
        workbook.device.require_launchable(k)
    """, WORKBOOK_DEVICE="cpu")
    assert r.returncode != 0
    assert "TritonImportOrderError" in r.stderr
    assert "TRITON_INTERPRET=1" in r.stderr and "import workbook" in r.stderr


def test_bad_device_override_is_named():
    r = _python("import workbook", WORKBOOK_DEVICE="tpu")
    assert r.returncode != 0 and "WORKBOOK_DEVICE must be 'cpu' or 'cuda'" in r.stderr


def test_check_tensor_names_argument_and_rule():
    x = torch.randn(4, 6)
    with pytest.raises(TypeError, match=r"x must have dtype in \(float16, bfloat16\), got float32"):
        check_tensor("x", x, dtypes=(torch.float16, torch.bfloat16))
    with pytest.raises(ValueError, match=r"x must be 3-D, got shape \(4, 6\)"):
        check_tensor("x", x, ndim=3)
    with pytest.raises(ValueError, match="x must be contiguous"):
        check_tensor("x", x.T)
    with pytest.raises(ValueError, match="x is on cpu but must be on cuda"):
        check_tensor("x", x, device="cuda")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        check_tensor("x", [1, 2])


def test_describe_has_versions():
    d = describe()
    assert d["torch"] == torch.__version__ and d["triton"] and d["device"] == str(DEVICE)


def test_same_device_treats_cuda_as_the_current_cuda():
    from workbook.device import same_device

    assert same_device("cuda", "cuda:0") and same_device("cuda:0", "cuda")
    assert same_device("cpu", torch.device("cpu"))
    assert not same_device("cpu", "cuda") and not same_device("cuda:0", "cuda:1")


def test_resolve_config_is_the_one_config_rule():
    """Every launcher's config= goes through device.resolve_config: dict or triton.Config, nested
    dicts per kernel, unknown names and non-powers of two refused with the name in the message."""
    import triton

    from workbook.device import resolve_config

    d = {"BLOCK_M": 16, "num_warps": 4, "state": {"BV": 32}}
    assert resolve_config(None, d) == d and resolve_config(None, d)["state"] is not d["state"]
    assert resolve_config({"state": {"BV": 64}}, d)["state"] == {"BV": 64}
    got = resolve_config(triton.Config({"BLOCK_M": 32}, num_warps=8), d, pow2=("BLOCK_M",))
    assert got["BLOCK_M"] == 32 and got["num_warps"] == 8 and "num_stages" not in got
    with pytest.raises(ValueError, match=r"config has unknown keys \['BLOCK_N'\]"):
        resolve_config({"BLOCK_N": 8}, d)
    with pytest.raises(ValueError, match=r"config\['state'\] has unknown keys \['bv'\]"):
        resolve_config({"state": {"bv": 8}}, d)
    with pytest.raises(ValueError, match=r"config\['BLOCK_M'\] must be a positive power of two"):
        resolve_config({"BLOCK_M": 24}, d, pow2=("BLOCK_M",))
    with pytest.raises(TypeError, match="config must be a dict or a triton.Config"):
        resolve_config((16, 4), d)


def test_resolve_emulate_is_the_one_emulation_rule():
    """Every launcher's emulate= goes through device.resolve_emulate: None follows the device, a
    non-bool is refused, and emulate=False without a GPU names what the interpreter gets wrong."""
    from workbook.device import ON_GPU, resolve_emulate

    assert resolve_emulate(None, "x") is (not ON_GPU)
    assert resolve_emulate(True, "x") is True
    with pytest.raises(TypeError, match="emulate must be None, True or False"):
        resolve_emulate(1, "x")
    if not ON_GPU:
        with pytest.raises(ValueError, match="emulate=False needs a GPU: the reason here"):
            resolve_emulate(False, "the reason here")
    else:
        assert resolve_emulate(False, "x") is False


def test_host_path_integer_helpers_agree_with_triton():
    """cdiv and next_pow2 (launchers' host path, no JIT call) give triton.cdiv's and triton.next_power_of_2's answers."""
    import triton
    from workbook.device import cdiv, next_pow2
    for n in list(range(1, 300)) + [1023, 1024, 1025, 65535, 65536, 65537]:
        assert next_pow2(n) == triton.next_power_of_2(n), n
        for b in (1, 3, 16, 64, 128):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
    assert next_pow2(0) == 1 and cdiv(0, 64) == 0
