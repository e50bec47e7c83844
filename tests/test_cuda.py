"""CUDA C++ kernels (kernels/cuda/*.cu) beside the Triton ones.

On any machine with an nvcc: each source compiles on its own for sm_90 (and the NVFP4 source also for
sm_100a, where its hardware E2M1 conversion is compiled in), and holds no torch header. Everywhere:
the Python side imports without CUDA and refuses backend='cuda' without a GPU, clearly. On a GPU:
the CUDA backend's bytes equal the Triton kernel's and the pure-torch reference's on odd shapes,
both scale layouts, fp16 and bf16; the whole storage is written (two poisons); bad inputs; CUDA
graphs. The build is workbook.nvcc, the launchers' CUDA halves live in workbook.nvfp4 / fp8, the SASS
counts in workbook.sass, the benchmark in workbook.benchmarks.cuda, the notebook section in
workbook.plots.cuda."""
import json
import re
from pathlib import Path

import pytest
import torch

import workbook  # noqa: F401  (device choice before triton)
from workbook import fp8, nvcc, nvfp4, records, sass
from workbook.benchmarks import cuda as bench_cuda
from workbook.benchmarks import nvfp4 as nvfp4_bench
from workbook.plots import cuda as plots_cuda
from workbook.check import assert_exact
from workbook.coverage import assert_fully_written, coverage, poisoned_allocations
from workbook.device import DEVICE, ON_GPU

from test_fp8 import check_against_reference, make_x as make_gate_up
from test_nvfp4 import make_x

gpu = pytest.mark.skipif(not ON_GPU, reason="the CUDA kernels run only on a GPU (their compile check runs here)")
NVCC = nvcc.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc found ($NVCC, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin, "
                                                     "pip's nvidia-cuda-nvcc): the compile check needs one")


def nvfp4_cuda(x, gs, **kw):
    """The CUDA backend of nvfp4_quant, through the public launcher."""
    return nvfp4.nvfp4_quant(x, gs, backend="cuda", **kw)


def _u8(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


# --------------------------------------------------------------------------------------------------
# Without a GPU: compile check, torch-free sources, imports, clear refusals
# --------------------------------------------------------------------------------------------------

@needs_nvcc
@pytest.mark.parametrize("topic", ["nvfp4", "fp8", "turboquant"])
def test_source_compiles_for_sm90(topic, tmp_path):
    cubin = nvcc.compile_check(topic, tmp_path, arch="sm_90")
    assert cubin.stat().st_size > 0


@needs_nvcc
def test_nvfp4_hardware_e2m1_path_compiles_for_sm100a(tmp_path):
    """cvt.rn.satfinite.e2m1x2.f32 exists only on arch-specific Blackwell targets: the source uses it
    under its arch guard there (and the exact emulation on sm_90, which the H200 runs)."""
    cubin = nvcc.compile_check("nvfp4", tmp_path, arch="sm_100a")
    assert cubin.stat().st_size > 0


def test_compile_check_reports_nvcc_errors(tmp_path, monkeypatch):
    if NVCC is None:
        pytest.skip("no nvcc found: nothing to report errors")
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k() { this is not C++; }\n")
    monkeypatch.setitem(nvcc.SOURCES, "bad", bad)
    with pytest.raises(RuntimeError, match="nvcc failed"):
        nvcc.compile_check("bad", tmp_path)


@needs_nvcc
def test_sm90_sass_uses_the_hardware_conversions():
    """In the sm_90 SASS: the E4M3 conversions are F2FP instructions (cvt.rn.satfinite.e4m3x2.f32), the
    NVFP4 amax is HMNMX2 on packed pairs, and the NVFP4 quantizer's per-block loop divides nothing and
    converts no element: 8 words x 3 packed comparisons (HSET2, the binary search of code_pair) against
    the threshold table; its loads of the next step come first in the loop."""
    if nvcc.cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled copy) to read the SASS")
    counts = sass.sass_counts()
    nv = [v for k, v in counts.items() if "nvfp4_quant_kernel" in k]
    f8 = [v for k, v in counts.items() if "silu_mul_quant_fp8_kernel" in k]
    assert len(nv) == 12 and len(f8) == 3, sorted(counts)   # 2 dtypes x 3 layouts x 2 tile widths
    for v in nv:
        assert v["ops"].get("F2FP", 0) == 1 and v["ops"].get("HMNMX2", 0) == 7, v["ops"]
        assert v["ops"].get("HSET2", 0) == 8 * 3 and v["ops"].get("LDS", 0) == 2, v["ops"]
        assert "MUFU" not in v["ops"] and "FCHK" not in v["ops"], v["ops"]
        assert v["main_per_element"] < 16, v
        # the next step's two 16-byte loads go out first, before the step's own arithmetic: a loop that
        # issues them at its end leaves their latency exposed where few CTAs share an SM (nvfp4.cu's
        # header, "The loop's bookkeeping")
        assert len(v["loads_at"]) == 2 and max(v["loads_at"]) < v["main"] // 8, v["loads_at"]
    for v in f8:
        assert v["ops"].get("F2FP", 0) >= 8, v["ops"]   # 2 x 4 e4m3x2 (+ the bf16x2 roundings)


@needs_nvcc
@pytest.mark.parametrize("key_table", [True, False])
def test_tq_decode_loop_feeds_the_tensor_cores_without_moving_operands(key_table):
    """The CUDA decode loop (one 32-token step), in both instantiations: 2 tiles x (8 + 8) HMMA and 2 x 2
    MOVM (the P transposes); no block barrier and no shared-memory store (only cp.async writes shared
    memory in the loop: the key table is filled before it), shuffles only for the softmax max (3 per head)
    and the copy slots (2). Key unpacking: with the table, 16 words x 4 bytes, each one PRMT (the address)
    and one LDS (the fp16 pair); with the register table, 16 words x 10 PRMT. Values: 8 pairs x 2 PRMT."""
    if nvcc.cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled copy) to read the SASS")
    s = sass.tq_decode_sass(key_table=key_table)
    ops = s["ops"]
    assert ops.get("HMMA") == 32 and ops.get("MOVM") == 4, ops
    assert "BAR" not in ops and "STS" not in ops, ops
    assert ops.get("SHFL", 0) <= 8, ops
    if key_table:
        assert ops.get("PRMT") == 16 * 4 + 8 * 2 and ops.get("LDS", 0) >= 16 * 4 + 12, ops   # + 4 LDS.128, 8 LDS.64
    else:
        assert ops.get("PRMT") == 16 * 10 + 8 * 2, ops
    assert s["loop_instructions_per_element"] < 4 and abs(sum(s["per_element_by_kind"].values())
                                                          - s["loop_instructions_per_element"]) < 0.05, s
    # the rescale block (after the step's vote, skipped on most steps) is found and split off the common path
    assert 0 < s["rescale_branch_instructions"] < s["common_path_instructions_per_step"], s
    assert s["common_path_instructions_per_step"] + s["rescale_branch_instructions"] == s["loop_instructions_per_step"], s
    assert sass.tq_decode_sass(source=nvcc.SOURCES["turboquant"], key_table=key_table) == s   # the file named


@needs_nvcc
def test_tq_decode_table_kernel_issues_fewer_instructions():
    """What the table is for: the common path of a step is shorter than with the register table."""
    if nvcc.cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled copy) to read the SASS")
    table, regs = sass.tq_decode_sass(key_table=True), sass.tq_decode_sass(key_table=False)
    assert table["common_path_instructions_per_step"] < 0.9 * regs["common_path_instructions_per_step"], (table, regs)


def test_tq_decode_function_picks_the_instantiation():
    """sass._tq_decode_function on a disassembly with the two instantiations of a templated decode kernel
    (main's) and the merge kernel: each key_table value gets its own body; with one untemplated decode
    kernel (kernel L, in the history) both get that one; with none it raises."""
    def fn(name, ops):
        return [f"\t\tFunction : {name}"] + [f"        /*{16 * i:04x}*/                   {op} ;" for i, op in enumerate(ops)]
    two = "\n".join(fn("_ZN2tq21tq_decode_cuda_kernelILb0EEEvNS_4ArgsE", ["PRMT R1, R2, R3, R4", "EXIT"])
                    + fn("_ZN2tq21tq_decode_cuda_kernelILb1EEEvNS_4ArgsE", ["LDS R1, [R2]", "EXIT"])
                    + fn("_ZN2tq20tq_merge_cuda_kernelEPKfS1_Pvii", ["FADD R1, R2, R3", "EXIT"]))
    assert sass._tq_decode_function(two, True)[0][0].startswith("LDS")
    assert sass._tq_decode_function(two, False)[0][0].startswith("PRMT")
    one = "\n".join(fn("_ZN2tq21tq_decode_cuda_kernelENS_4ArgsE", ["HMMA.16816.F32 R1, R2, R3, R4", "EXIT"]))
    assert sass._tq_decode_function(one, True) == sass._tq_decode_function(one, False)
    assert sass._tq_decode_function(one, True)[1] == [0, 16]
    with pytest.raises(RuntimeError, match="no decode kernel"):
        sass._tq_decode_function("\n".join(fn("_ZN2tq20tq_merge_cuda_kernelEPKfS1_Pvii", ["EXIT"])), True)


def _kernel_attributes(cubin: Path) -> dict:
    """Per kernel of a cubin (``cuobjdump -elf``): its thread cap (EIATTR_MAX_THREADS, x) and register cap
    (EIATTR_MAXREG_COUNT)."""
    import subprocess
    out = subprocess.run([nvcc.cuobjdump(), "-elf", str(cubin)], capture_output=True, text=True, check=True).stdout
    attrs, name, key = {}, None, None
    for line in out.splitlines():
        if line.startswith(".nv.info.") and "tq_" in line:
            name, key = line[len(".nv.info."):].strip(), None
            attrs[name] = {}
        elif name and "Attribute:" in line:
            key = line.split()[-1]
        elif name and key in ("EIATTR_MAX_THREADS", "EIATTR_MAXREG_COUNT") and "Value:" in line:
            attrs[name][key] = int(line.split()[1], 16)
            key = None
    return attrs


@needs_nvcc
@pytest.mark.parametrize("old_nvcc", [False, True])
def test_tq_decode_launch_caps_fit_each_instantiation(old_nvcc, tmp_path):
    """Each decode instantiation is capped at 128 registers, and under the __launch_bounds__ fallback an
    nvcc older than 12.4 takes (forced here on a copy of the source) at its own block: the table kernel's
    16 warps, the register kernel's 2 (an unparenthesised macro argument once capped the table kernel at
    16 threads there, which would fail every launch)."""
    if nvcc.cuobjdump() is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton's bundled copy) to read the cubin")
    src = nvcc.SOURCES["turboquant"].read_text()
    if old_nvcc:
        gate = "#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ > 12"
        assert src.count(gate) == 1
        src = src.replace(gate, "#if 0 && " + gate[len("#if "):])
    (tmp_path / "tq.cu").write_text(src)
    attrs = _kernel_attributes(nvcc.compile_check("turboquant", tmp_path, source=tmp_path / "tq.cu"))
    for tag, threads in (("ILb1E", 16 * 32), ("ILb0E", 2 * 32)):
        (name,) = [n for n in attrs if "tq_decode_cuda_kernel" + tag in n]
        assert attrs[name].get("EIATTR_MAXREG_COUNT") == 128, (name, attrs[name])
        if old_nvcc:   # __maxnreg__ sets no thread cap; __launch_bounds__ does
            assert attrs[name].get("EIATTR_MAX_THREADS") == threads, (name, attrs[name])


@pytest.mark.parametrize("topic", ["nvfp4", "fp8", "turboquant"])
def test_sources_are_torch_free_and_packaged(topic):
    text = nvcc.SOURCES[topic].read_text()
    for needle in ("torch/", "ATen", "c10/", "pybind11"):
        assert needle not in text, f"kernels/cuda/{topic}.cu must not include {needle} headers"
    assert 'extern "C"' in text and "cudaStream_t stream" in text
    from pathlib import Path
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert '"workbook.kernels" = ["cuda/*.cu"]' in pyproject, "the .cu sources must ship in the wheel"


def _threshold_table(gs: float, dtype) -> torch.Tensor:
    """The CUDA table kernel's thresholds (nvfp4_threshold_table_kernel), in torch on the CPU: for each
    scale byte 1..126 and decision point j, the largest non-negative pattern of ``dtype`` whose
    RN(|x| gs) does not pass t_j sf (> for ties down, >= for ties up), by the same binary search."""
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    up = torch.tensor([False, True, False, True, False, True, False])
    sfv = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    T = sfv[:, None] * t[None, :]                                    # exact in fp32
    top = 0x7F7F if dtype == torch.bfloat16 else 0x7BFF
    lo = torch.zeros(T.shape, dtype=torch.int32)
    hi = torch.full(T.shape, top + 1, dtype=torch.int32)
    g = torch.tensor(gs, dtype=torch.float32)
    while bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        v = mid.clamp(max=top).to(torch.int16).view(dtype).float()
        p = v * g                                                    # RN in fp32
        passes = torch.where(up, p >= T, p > T) & (hi - lo > 1)
        hi = torch.where(passes, mid, hi)
        lo = torch.where(~passes & (hi - lo > 1), mid, lo)
    return lo                                                        # [126, 7] patterns


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_threshold_counts_are_the_e2m1_rounding_for_every_value(dtype):
    """The CUDA kernel's E2M1 index is the number of thresholds below |x| (compared as patterns of x's
    format). For every finite non-negative value of the format, every scale byte and three global
    scales, that count equals the index of RN(RN(|x| gs) / sf) by the decision points (e2m1_encode)."""
    top = 0x7F7F if dtype == torch.bfloat16 else 0x7BFF
    pats = torch.arange(0, top + 1, dtype=torch.int32)
    xv = pats.to(torch.int16).view(dtype).float()
    sfv = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    for gs in (1.0, 2688.0 / 37.5, 0.0371):
        X = _threshold_table(gs, dtype)                              # [126, 7]
        count = (pats[None, :, None] > X[:, None, :]).sum(-1)        # [126, patterns]
        p = xv * torch.tensor(gs, dtype=torch.float32)
        y = p[None, :] / sfv[:, None]                                # RN(RN(|x| gs) / sf)
        ref = nvfp4.e2m1_encode(y).to(torch.int64) & 7
        bad = (count != ref).sum()
        assert int(bad) == 0, (dtype, gs, int(bad))


def _threshold_table_closed(gs: float, dtype) -> torch.Tensor:
    """The table kernel's closed form (threshold_word in kernels/cuda/nvfp4.cu), in torch: p0 = RN(T / gs)
    rounded toward zero into ``dtype`` (clamped to the largest finite pattern), then X = p0 - 1 +
    [p0 does not pass] + [p0 + 1 does not pass]; past the largest finite pattern everything passes."""
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    up = torch.tensor([False, True, False, True, False, True, False])
    sfv = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    T = sfv[:, None] * t[None, :]
    top = 0x7F7F if dtype == torch.bfloat16 else 0x7BFF
    g = torch.tensor(gs, dtype=torch.float32)
    q = T / g                                                        # RN in fp32
    if dtype == torch.bfloat16:
        p0 = (q.view(torch.int32) >> 16) & 0xFFFF                    # truncation: toward zero
    else:
        h = q.to(torch.float16)                                      # RN, then one step back if it grew
        p0 = h.view(torch.int16).to(torch.int32) & 0xFFFF
        p0 = torch.where((h.float().abs() > q.abs()) & q.isfinite(), p0 - 1, p0)
    p0 = torch.where(q.isnan(), 0xFFFF, p0).clamp(max=top)

    def passes(p):
        v = p.clamp(max=top).to(torch.int16).view(dtype).float() * g
        return torch.where(up, v >= T, v > T) | (p > top)
    return p0 - 1 + (~passes(p0)).int() + (~passes(p0 + 1)).int()


def _global_scales(n: int, seed: int = 0) -> torch.Tensor:
    """fp32 global scales over every exponent (normal and subnormal), typical ones (448 x 6 / amax)
    and the edge values: 0, -0, inf, NaN, negative, the smallest subnormal, the largest finite."""
    g = torch.Generator().manual_seed(seed)
    wide = (torch.rand(n, generator=g) + 1.0) * torch.exp2(torch.randint(-149, 128, (n,), generator=g).double()).float()
    typical = 2688.0 / (torch.rand(n, generator=g) * 1e4 + 1e-3)
    edge = torch.tensor([0.0, -0.0, float("inf"), float("nan"), -1.0, 1e-45, 1e-40, 2.0 ** -126, 1.0, 2688.0,
                         2.0 ** 127, 3.4028234663852886e38])
    return torch.cat([wide[wide.isfinite()], typical, edge]).float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_threshold_closed_form_is_the_search(dtype):
    """The closed form the CUDA table kernel uses gives the binary search's threshold for every scale
    byte and decision point, over global scales of every fp32 exponent and the edge values."""
    for gs in _global_scales(150, seed=1).tolist():
        got, want = _threshold_table_closed(gs, dtype), _threshold_table(gs, dtype)
        assert torch.equal(got, want), (dtype, gs, int((got != want).sum()))


def test_nvfp4_source_guards_the_blackwell_conversion():
    text = nvcc.SOURCES["nvfp4"].read_text()
    i = text.index("cvt.rn.satfinite.e2m1x2.f32 q")
    guard = text.rfind("#if NVFP4_HW_E2M1", 0, i)
    assert guard != -1 and text.find("#else", guard) > i, "the e2m1x2 cvt must sit under the arch guard"
    assert "__CUDA_ARCH_FEAT_SM100_ALL" in text


def test_backend_argument():
    x = make_gate_up(2, 128)
    with pytest.raises(ValueError, match="backend must be 'triton' or 'cuda'"):
        fp8.silu_mul_quant_fp8_packed(x, backend="cutlass")
    with pytest.raises(ValueError, match="emulate= chooses how the Triton kernel runs: backend='cuda' does not take it"):
        fp8.silu_mul_quant_fp8_packed(x, backend="cuda", emulate=True)
    with pytest.raises(ValueError, match="config= chooses how the Triton kernel runs: backend='cuda' does not take it"):
        fp8.quant_fp8_packed(x[:, :128].contiguous(), backend="cuda", config={"BLOCK_M": 4})
    xn = make_x(2, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="backend must be 'triton' or 'cuda'"):
        nvfp4.nvfp4_quant(xn, nvfp4.global_scale_of(xn), backend="CUDA")


@pytest.mark.skipif(ON_GPU, reason="on a GPU backend='cuda' runs")
def test_cuda_backend_without_a_gpu_is_a_clear_error():
    x = make_gate_up(2, 128)
    with pytest.raises(ValueError, match="backend='cuda' .* need a GPU"):
        fp8.silu_mul_quant_fp8_packed(x, backend="cuda")
    with pytest.raises(ValueError, match="backend='cuda' .* need a GPU"):
        fp8.quant_fp8_packed(x[:, :128].contiguous(), backend="cuda")
    xn = make_x(2, 32, torch.bfloat16)
    with pytest.raises(ValueError, match="backend='cuda' .* need a GPU"):
        nvfp4_cuda(xn, nvfp4.global_scale_of(xn))


# --------------------------------------------------------------------------------------------------
# GPU: NVFP4, bit-identical to Triton and the reference
# --------------------------------------------------------------------------------------------------

NV_SHAPES = [(m, k) for m in (1, 3, 129, 300) for k in (16, 48, 2064)]


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_cuda_threshold_table_is_the_search(dtype):
    """The table kernel's words, built on the GPU in closed form, against the binary search in torch,
    for global scales of every fp32 exponent and the edge values: rows 1-126 the thresholds in both
    halves, rows 0 and 127 (sf = 0, NaN) the largest finite pattern, word 7 of every row 0."""
    from workbook.nvfp4 import _nvfp4_threshold_tables
    gss = _global_scales(400, seed=2)
    with poisoned_allocations("a5"):                    # the whole storage is written (empty is safe)
        tables = _nvfp4_threshold_tables(gss.cuda(), dtype).cpu()                  # [n, 128, 8]
    with poisoned_allocations("7f"):
        assert torch.equal(_nvfp4_threshold_tables(gss.cuda(), dtype).cpu(), tables), "the same words under either poison"
    top = 0x7F7F if dtype == torch.bfloat16 else 0x7BFF
    assert tables.shape == (gss.numel(), 128, 8)
    assert bool((tables[:, :, 7] == 0).all()), "word 7 of each row must be 0"
    assert bool((tables[:, [0, 127], :7] == top | top << 16).all()), "sf bytes 0 and 0x7F: nothing finite passes"
    assert bool(((tables >> 16) == (tables & 0xFFFF)).all()), "both halves of a word hold the threshold"
    for i, gs in enumerate(gss.tolist()):
        want = _threshold_table(gs, dtype)
        got = tables[i, 1:127, :7] & 0xFFFF
        assert torch.equal(got, want), f"{dtype} gs={gs!r}: {int((got != want).sum())} thresholds differ"


@gpu
@pytest.mark.parametrize("M,K", NV_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("swizzled", [True, False])
def test_nvfp4_cuda_equals_triton_and_reference(M, K, dtype, swizzled):
    x = make_x(M, K, dtype, seed=M * 31 + K)
    gs = nvfp4.global_scale_of(x)
    cc, cs = nvfp4_cuda(x, gs, swizzled=swizzled)
    tc, ts = nvfp4.nvfp4_quant(x, gs, swizzled=swizzled)
    rc, rs = nvfp4.quantize_ref(x.cpu(), gs.cpu(), swizzled=swizzled)
    assert cc.shape == tc.shape and cs.shape == ts.shape and cs.dtype == ts.dtype
    assert_exact(cc.cpu(), tc.cpu(), "codes: CUDA vs Triton")
    assert_exact(_u8(cs).cpu(), _u8(ts).cpu(), "scales: CUDA vs Triton")
    assert_exact(cc.cpu(), rc, "codes: CUDA vs quantize_ref")
    assert_exact(_u8(cs).cpu(), _u8(rs), "scales: CUDA vs quantize_ref")


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nvfp4_cuda_ties_saturation_and_tiny_blocks(dtype):
    """Values on every E2M1 decision point of a block whose scale is exactly representable, values
    beyond 6 * sf (saturation), all-zero and all-subnormal blocks (sf = 0), signed zeros."""
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    block = torch.cat([mids, -mids])                      # amax 6 -> sf = gs
    rows = [block, block * 0.5, torch.cat([mids * 1.01, -mids * 0.99]), torch.zeros(16),
            torch.full((16,), -0.0), torch.cat([torch.full((8,), 1e-7), torch.full((8,), -1e-7)])]
    x = torch.stack(rows).repeat(1, 3).to(dtype).to(DEVICE)
    for gs in (torch.tensor([1.0], device=DEVICE), nvfp4.global_scale_of(x), torch.tensor([7.5], device=DEVICE)):
        cc, cs = nvfp4_cuda(x, gs)
        rc, rs = nvfp4.quantize_ref(x.cpu(), gs.cpu())
        assert_exact(cc.cpu(), rc, f"codes (gs={float(gs)})")
        assert_exact(_u8(cs).cpu(), _u8(rs), f"scales (gs={float(gs)})")


@gpu
def test_nvfp4_cuda_random_shapes_against_triton():
    """Shapes nobody picked by hand, as the issue's reviewer will check: M, K/16 drawn at random."""
    g = torch.Generator().manual_seed(1234)
    for _ in range(12):
        M = int(torch.randint(1, 700, (1,), generator=g))
        K = 16 * int(torch.randint(1, 300, (1,), generator=g))
        dtype = (torch.float16, torch.bfloat16)[int(torch.randint(0, 2, (1,), generator=g))]
        x = make_x(M, K, dtype, seed=M + K)
        gs = nvfp4.global_scale_of(x)
        for swizzled in (True, False):
            cc, cs = nvfp4_cuda(x, gs, swizzled=swizzled)
            tc, ts = nvfp4.nvfp4_quant(x, gs, swizzled=swizzled)
            assert_exact(cc, tc, f"codes M={M} K={K} {dtype} swizzled={swizzled}")
            assert_exact(_u8(cs), _u8(ts), f"scales M={M} K={K} {dtype} swizzled={swizzled}")


# --------------------------------------------------------------------------------------------------
# GPU: NVFP4, the whole storage written (two poisons), and the regression switch
# --------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("M,K", [(1, 16), (3, 48), (129, 48), (300, 2064)])
@pytest.mark.parametrize("swizzled", [True, False])
def test_nvfp4_cuda_whole_storage_written(M, K, swizzled):
    x = make_x(M, K, torch.bfloat16, seed=7)
    gs = nvfp4.global_scale_of(x)
    producer = lambda x, g: [_u8(t) for t in nvfp4_cuda(x, g, swizzled=swizzled)]  # noqa: E731
    cov_c, cov_s = assert_fully_written(producer, x, gs, scope="storage", names=["codes", "scales"])
    assert cov_c.storage_fully_written and cov_s.storage_fully_written
    rc, rs = nvfp4.quantize_ref(x.cpu(), gs.cpu(), swizzled=swizzled)
    for pattern in ("a5", "7f"):            # what was written under each poison is the reference
        with poisoned_allocations(pattern):
            cc, cs = nvfp4_cuda(x, gs, swizzled=swizzled)
        assert_exact(cc.cpu(), rc, f"codes under poison {pattern}")
        assert_exact(_u8(cs).cpu(), _u8(rs), f"scales (padding included) under poison {pattern}")


def _split_shape(dtype, one_wave=False):
    """An input with odd M and K/16 that the CUDA launcher splits on this GPU (wide launch + narrow
    launch): past one wave, with a thin last wave (one_wave=False), or within one wave, where more
    than half and at most 7/8 of the SMs would hold a tile more (one_wave=True, with at least one
    whole tile per SM). Found from the GPU's own plan, not assumed."""
    for K in (14352, 5136, 2064):                       # K/16 = 897, 321, 129: a partial last column tile
        n_wide = -(-(K // 16) // 32)
        p0 = nvfp4.nvfp4_launch_plan(128, K, dtype)
        slots, sms = p0["slots"], p0["sms"]
        for rows in range(1, 2048):
            M = 128 * rows - 37
            tiles = rows * n_wide
            if one_wave:
                r = tiles % sms
                want = sms <= tiles < slots and sms < 2 * r and 8 * r <= 7 * sms
            else:                                        # a last wave of 10% .. 60% of the slots
                want = tiles > slots and 0.1 * slots <= tiles % slots <= 0.6 * slots and M * K * 2 <= 1 << 28
            if want:
                plan = nvfp4.nvfp4_launch_plan(M, K, dtype)
                if plan["narrow"]:
                    return M, K, plan
    pytest.fail(f"no input of at most 256 MiB is split {'within one wave' if one_wave else 'past one wave'} "
                "on this GPU")


def _piece_shape(dtype, piece_rows):
    """An input with odd M and K/16 whose wide tiles fit in one wave on this GPU but leave some SMs a
    tile more than others, so the CUDA launcher cuts the remainder into row pieces of `piece_rows` rows
    (32: at most a quarter of the SMs would get one more tile; 64: at most half): found from the GPU's
    own plan."""
    for K in (14352, 5136, 2064):                       # K/16 = 897, 321, 129: a partial last column tile
        n_wide = -(-(K // 16) // 32)
        p0 = nvfp4.nvfp4_launch_plan(128, K, dtype)
        sms, slots = p0["sms"], p0["slots"]
        for rows in range(1, 2048):
            M, tiles = 128 * rows - 37, rows * n_wide
            if tiles >= slots:
                break
            r = tiles % sms
            fits = 4 * r <= sms if piece_rows == 32 else sms < 4 * r <= 2 * sms
            if tiles > sms and r and fits:                  # whole tiles and pieces in one launch
                return M, K, nvfp4.nvfp4_launch_plan(M, K, dtype)
    pytest.fail(f"no one-wave input with pieces of {piece_rows} rows on this GPU")


def _check_all_bytes(M, K, dtype):
    """Both outputs of the CUDA launcher (two poisons, padding included) equal the Triton kernel's in
    both layouts; write_padding=False leaves exactly the padding."""
    x = make_x(M, K, dtype, seed=11)
    gs = nvfp4.global_scale_of(x)
    for swizzled in (True, False):
        tc, ts = nvfp4.nvfp4_quant(x, gs, swizzled=swizzled)
        for pattern in ("a5", "7f"):
            with poisoned_allocations(pattern):
                cc, cs = nvfp4_cuda(x, gs, swizzled=swizzled)
            assert_exact(cc, tc, f"codes M={M} K={K} swizzled={swizzled} poison {pattern}")
            assert_exact(_u8(cs), _u8(ts), f"scales (storage) M={M} K={K} swizzled={swizzled} poison {pattern}")
    with poisoned_allocations("a5"):
        cc, cs = nvfp4_cuda(x, gs, write_padding=False)
    assert_exact(cc, tc, "codes with write_padding=False")
    got = nvfp4.unswizzle_scales(_u8(cs))                    # the logical padded grid [Mp, Kp]
    want = nvfp4.unswizzle_scales(_u8(nvfp4.nvfp4_quant(x, gs)[1]))
    real = torch.zeros_like(got, dtype=torch.bool)
    real[:M, :K // 16] = True
    assert torch.equal(got[real], want[real]), "real scale entries written"
    assert bool((got[~real] == 0xA5).all()), "padded scale entries left as they were (the regression)"


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_cuda_tail_split_plan_and_bytes(dtype):
    """The tail rule past one wave: whole waves of wide tiles, then the rest as narrow pieces (4 per
    wide tile); the two launches together write every byte of both outputs (two poisons, padding
    included), equal to the Triton kernel's, in both layouts; write_padding=False still leaves
    exactly the padding."""
    M, K, plan = _split_shape(dtype)
    assert plan["wide"] % plan["slots"] == 0 and plan["wide"] < plan["wide_tiles"], plan
    assert plan["narrow"] == 4 * (plan["wide_tiles"] - plan["wide"]) and plan["pieces"] == 0, plan
    _check_all_bytes(M, K, dtype)


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_cuda_one_wave_narrow_plan_and_bytes(dtype):
    """The tail rule within one wave when more than half and at most 7/8 of the SMs would hold a tile
    more: k whole tiles per SM in the wide launch, the r tiles left over as 4 narrow tiles each in the
    second launch, every CTA with the threshold table it builds itself (the launcher's scratch table is
    not needed: it is poisoned like every allocation here); both launches together write every byte of
    both outputs (two poisons, padding included), equal to the Triton kernel's; write_padding=False
    still leaves exactly the padding. With fewer tiles than SMs the narrow launch runs alone."""
    M, K, plan = _split_shape(dtype, one_wave=True)
    sms, tiles = plan["sms"], plan["wide_tiles"]
    r = tiles % sms
    assert plan["wide"] == tiles - r and plan["narrow"] == 4 * r and plan["pieces"] == 0, plan
    assert sms < 2 * r and 8 * r <= 7 * sms and tiles < plan["slots"], plan
    _check_all_bytes(M, K, dtype)
    # one column tile (K = 512), so M / 128 tiles, none whole per SM: r just past half the SMs is cut
    # into narrow tiles, r just past 7/8 of them stays whole
    just_half, just_7_8 = sms // 2 + 1, 7 * sms // 8 + 1
    p = nvfp4.nvfp4_launch_plan(128 * just_half, 512, dtype)
    assert p["wide"] == 0 and p["narrow"] == 4 * just_half and p["pieces"] == 0, p
    p = nvfp4.nvfp4_launch_plan(128 * just_7_8, 512, dtype)
    assert p["wide"] == just_7_8 and p["narrow"] == 0 and p["pieces"] == 0, p
    n_wide = -(-(K // 16) // 32)
    rows = next(rw for rw in range(1, 64) if sms < 2 * rw * n_wide <= 7 * sms // 4)
    _check_all_bytes(128 * rows - 37, K, dtype)                # the narrow launch alone (no whole tile)


@gpu
@pytest.mark.parametrize("piece_rows", [32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nvfp4_cuda_one_wave_pieces_plan_and_bytes(dtype, piece_rows):
    """The tail rule within one wave: k whole tiles per SM, and the r tiles left over cut into row
    pieces (quarters of 32 rows when 4r <= SMs, halves of 64 when 2r <= SMs) by CTAs of the same
    launch, no more pieces than SMs; whole tiles and pieces together write every byte of both outputs
    (two poisons, padding included), equal to the Triton kernel's; write_padding=False still leaves
    exactly the padding. One tile on its own is four quarters."""
    M, K, plan = _piece_shape(dtype, piece_rows)
    sms, tiles = plan["sms"], plan["wide_tiles"]
    assert plan["narrow"] == 0 and plan["piece_rows"] == piece_rows, plan
    assert plan["wide"] == tiles // sms * sms and plan["pieces"] == (tiles % sms) * 128 // piece_rows, plan
    assert plan["pieces"] <= sms, plan
    small = nvfp4.nvfp4_launch_plan(128, 512, dtype)          # one tile: four quarter pieces
    assert small["wide"] == 0 and small["pieces"] == 4 and small["piece_rows"] == 32, small
    whole = nvfp4.nvfp4_launch_plan(128 * sms, 512, dtype)    # one tile per SM: whole tiles, no piece
    assert whole["wide"] == sms and whole["pieces"] == 0 and whole["narrow"] == 0, whole
    _check_all_bytes(M, K, dtype)


@gpu
@pytest.mark.parametrize("M,K", [(90, 80), (130, 48)])
def test_nvfp4_cuda_write_padding_false_reproduces_the_regression(M, K):
    x = make_x(M, K, torch.bfloat16, seed=5)
    gs = nvfp4.global_scale_of(x)
    _, cov_s = coverage(lambda x, g: [_u8(t) for t in nvfp4_cuda(x, g, write_padding=False)], x, gs,
                        names=["codes", "scales"])
    log = nvfp4.logical_scale_coverage(cov_s)
    Mp, Kp = nvfp4.padded_scale_shape(M, K)
    expect = torch.zeros(Mp, Kp, dtype=torch.bool)
    expect[:M, :K // 16] = True
    assert torch.equal(log.written, expect), "exactly the real entries are written"
    # and alloc='zeros' hides it: the same bytes as the fixed kernel
    cc, cs = nvfp4_cuda(x, gs, write_padding=False, alloc="zeros")
    rc, rs = nvfp4.quantize_ref(x.cpu(), gs.cpu())
    assert_exact(_u8(cs).cpu(), _u8(rs), "zeros + no padding writes = the reference")


@gpu
def test_nvfp4_cuda_bad_inputs_and_offsets():
    x = make_x(4, 32, torch.float16)
    gs = nvfp4.global_scale_of(x)
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_cuda(torch.randn(4, 40).half().to(DEVICE), gs)
    with pytest.raises(TypeError, match=r"x must have dtype in \(float16, bfloat16\)"):
        nvfp4_cuda(x.float(), gs)
    with pytest.raises(ValueError, match="x must be contiguous"):
        nvfp4_cuda(torch.randn(64, 32).half().to(DEVICE).T, gs)
    with pytest.raises(ValueError, match="global_scale must hold exactly one fp32 value"):
        nvfp4_cuda(x, torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="global_scale must be a finite positive number"):
        nvfp4_cuda(x, 0.0)
    with pytest.raises(ValueError, match="alloc must be"):
        nvfp4_cuda(x, gs, alloc="ones")
    # starts that are not 16-byte aligned (2 and 8 bytes in) are copied first; 16 bytes in is read in place
    for offset in (1, 4, 8):
        base = torch.randn(offset + 5 * 48).to(torch.bfloat16).to(DEVICE)
        xo = base[offset:].view(5, 48)
        g = nvfp4.global_scale_of(xo)
        cc, cs = nvfp4_cuda(xo, g)
        rc, rs = nvfp4.quantize_ref(xo.cpu(), g.cpu())
        assert_exact(cc.cpu(), rc, f"codes at element offset {offset}")
        assert_exact(_u8(cs).cpu(), _u8(rs), f"scales at element offset {offset}")
    codes, sf = nvfp4_cuda(torch.empty(0, 64, dtype=torch.bfloat16, device=DEVICE), torch.tensor([1.0], device=DEVICE))
    assert codes.shape == (0, 32) and tuple(sf.shape) == (0, 4)
    # a Python-number global scale equals the tensor
    c1, s1 = nvfp4_cuda(x, float(gs))
    c2, s2 = nvfp4_cuda(x, gs)
    assert torch.equal(c1, c2) and torch.equal(_u8(s1), _u8(s2))


# --------------------------------------------------------------------------------------------------
# GPU: FP8, bit-identical to Triton and the reference
# --------------------------------------------------------------------------------------------------

FP8_SHAPES = [(m, n) for m in (1, 3, 129, 300) for n in (128, 384)] + [(5, 640), (4, 2048), (127, 7168)]


@gpu
@pytest.mark.parametrize("m,n", FP8_SHAPES)
def test_fp8_fused_cuda_equals_triton_and_reference(m, n):
    x = make_gate_up(m, n, seed=m * 7 + n)
    cq, cs = fp8.silu_mul_quant_fp8_packed(x, backend="cuda")
    tq, ts = fp8.silu_mul_quant_fp8_packed(x)
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    check_against_reference(cq, cs, q_ref, s_ref, m, n)
    assert_exact(cq.view(torch.uint8), tq.view(torch.uint8), "codes: CUDA vs Triton")
    assert_exact(cs, ts, "packed scales: CUDA vs Triton")
    assert cs.stride() == ts.stride()


@gpu
@pytest.mark.parametrize("m,n", [(1, 128), (3, 384), (129, 640), (300, 1152)])
def test_fp8_quant_only_cuda_equals_triton_and_reference(m, n):
    mag = 2.0 ** torch.randint(-10, 12, (m, n // 128)).repeat_interleave(128, 1)
    y = (torch.randn(m, n) * mag).to(torch.bfloat16).to(DEVICE)
    cq, cs = fp8.quant_fp8_packed(y, backend="cuda")
    tq, ts = fp8.quant_fp8_packed(y)
    q_ref, e_ref = fp8.quant_fp8_group_reference(y)
    check_against_reference(cq, cs, q_ref, fp8.pack_ue8m0_reference(e_ref), m, n)
    assert_exact(cq.view(torch.uint8), tq.view(torch.uint8), "codes: CUDA vs Triton")
    assert_exact(cs, ts, "packed scales: CUDA vs Triton")


@gpu
def test_fp8_cuda_every_bf16_gate():
    """silu on every finite bf16 gate (65280 values, 510 rows of 128), times a random up: the CUDA
    kernel's bf16(silu) sequence (accurate expf, IEEE division) against torch's, through the codes."""
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = g[torch.isfinite(g.float())]
    gate = g.view(-1, 128)
    # |up| <= 1 keeps y = silu(gate) * up finite for every finite gate (|silu(g)| <= |g|); a product
    # that overflows to inf is pinned for the Triton kernels and the reference (they saturate it:
    # test_fp8.py::test_overflow_to_inf_saturates); the CUDA kernel is not checked there
    for up in (torch.ones_like(gate), (torch.rand(gate.shape) * 2 - 1).to(torch.bfloat16)):
        x = torch.cat([gate, up], dim=1).contiguous().to(DEVICE)
        cq, cs = fp8.silu_mul_quant_fp8_packed(x, backend="cuda")
        q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
        assert_exact(cq.view(torch.uint8), q_ref.view(torch.uint8), "codes over every bf16 gate")
        assert_exact(cs, s_ref, "scales over every bf16 gate")


@gpu
def test_fp8_cuda_silu_sequences_and_the_proof(monkeypatch):
    """torch's sequence (accurate expf, IEEE division) is exact on every gate; the FAST one (ex2.approx,
    div.full) is used by the fused kernel only where silu_fast_is_exact proved it; with the proof
    withheld, the fused kernel runs torch's sequence and still gives the reference's bytes."""
    g = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = g[torch.isfinite(g.float())].to(DEVICE)
    ref = torch.nn.functional.silu(g.float()).to(torch.bfloat16).view(torch.int16)
    exact = fp8.silu_mul_bf16_cuda(g, torch.ones_like(g), fast=False)
    assert torch.equal(exact.view(torch.int16), ref), "torch's silu sequence must match torch on every gate"
    fast = fp8.silu_mul_bf16_cuda(g, torch.ones_like(g), fast=True)
    assert torch.equal(fast.view(torch.int16), ref) == fp8.silu_fast_is_exact()
    up = torch.randn(g.shape, device=DEVICE).to(torch.bfloat16)
    want = (torch.nn.functional.silu(g.float()).to(torch.bfloat16) * up).view(torch.int16)
    got = fp8.silu_mul_bf16_cuda(g, up, fast=fp8.silu_fast_is_exact())
    assert torch.equal(got.view(torch.int16), want)
    monkeypatch.setattr(fp8, "_silu_fast", False)
    x = make_gate_up(7, 384, seed=4)
    cq, cs = fp8.silu_mul_quant_fp8_packed(x, backend="cuda")
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    check_against_reference(cq, cs, q_ref, s_ref, 7, 384)


@gpu
def test_fp8_cuda_ties_zero_groups_and_large_amax():
    v = torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (v[:-1] + v[1:]) / 2
    group = torch.cat([mids, -mids[:1], torch.tensor([448.0])])
    rows = [group, -group.flip(0), torch.zeros(128), torch.full((128,), -0.0)]
    for big in (450.0, 1000.0, 57344.0, 3.0e38):
        rows.append(torch.cat([torch.tensor([big]), group[:127] * (big / 448.0)]))
    y = torch.stack(rows).to(torch.bfloat16)
    y = torch.cat([y.roll(k, 0) for k in range(5)], dim=1).to(DEVICE)   # 5 groups: a half-used word
    cq, cs = fp8.quant_fp8_packed(y, backend="cuda")
    q_ref, e_ref = fp8.quant_fp8_group_reference(y)
    check_against_reference(cq, cs, q_ref, fp8.pack_ue8m0_reference(e_ref), y.shape[0], 640)


# --------------------------------------------------------------------------------------------------
# GPU: FP8, the whole storage (two poisons), bad inputs, strided rows
# --------------------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("m", [1, 3, 129, 300])
def test_fp8_cuda_whole_storage_poison(m):
    n = 640  # 5 groups: the last packed word holds one used byte and three zero bytes
    x = make_gate_up(m, n, seed=m + 100)
    f = lambda x: fp8.silu_mul_quant_fp8_packed(x, backend="cuda")  # noqa: E731
    c_codes, c_scales = assert_fully_written(f, x, scope="view", names=["codes", "scales"])
    assert c_codes.storage_fully_written, c_codes.report()
    tm = fp8.tma_aligned_rows(m)
    assert c_scales.storage_shape == (2, tm)
    assert torch.equal(c_scales.written, c_scales.in_view), "exactly the view is written, as in Triton"
    assert int((~c_scales.written).sum()) == 2 * (tm - m)
    q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
    for pattern in ("nan", "7f"):
        with poisoned_allocations(pattern):
            codes, scales = f(x)
        check_against_reference(codes, scales, q_ref, s_ref, m, n)
        assert (scales[:, 1].cpu() >> 8 == 0).all(), "unused exponent bytes of the last word must be 0"


@gpu
def test_fp8_cuda_quant_only_whole_storage_poison():
    y = (torch.randn(6, 384) * 5).to(torch.bfloat16).to(DEVICE)
    c_codes, c_scales = coverage(lambda y: fp8.quant_fp8_packed(y, backend="cuda"), y, names=["codes", "scales"])
    assert c_codes.storage_fully_written and c_scales.view_fully_written, c_codes.report() + c_scales.report()
    assert torch.equal(c_scales.written, c_scales.in_view)


@gpu
def test_fp8_cuda_bad_inputs_strides_and_offsets():
    f = lambda x: fp8.silu_mul_quant_fp8_packed(x, backend="cuda")  # noqa: E731
    good = make_gate_up(2, 128)
    with pytest.raises(ValueError, match="multiple of group_size=128"):
        f(torch.randn(2, 2 * 192, device=DEVICE).to(torch.bfloat16))
    with pytest.raises(ValueError, match="must be even"):
        f(torch.randn(2, 257, device=DEVICE).to(torch.bfloat16))
    with pytest.raises(TypeError, match=r"x must have dtype in \(bfloat16\)"):
        f(good.half())
    with pytest.raises(ValueError, match="x must be contiguous"):
        f(torch.randn(256, 4, device=DEVICE).to(torch.bfloat16).T)
    # a row slice of a bigger buffer, and a start that is not 16-byte aligned (copied first)
    big = make_gate_up(9, 256, seed=3)
    for x in (big[2:7], big.view(-1)[4:4 + 5 * 512].view(5, 512)):
        q_ref, s_ref = fp8.silu_mul_quant_fp8_reference(x)
        codes, scales = f(x)
        check_against_reference(codes, scales, q_ref, s_ref, 5, 256)
    codes, scales = f(torch.empty(0, 512, dtype=torch.bfloat16, device=DEVICE))
    assert codes.shape == (0, 256) and scales.shape == (0, 1)


# --------------------------------------------------------------------------------------------------
# GPU: CUDA graphs (the benchmark's timer) and the build cache
# --------------------------------------------------------------------------------------------------

@gpu
def test_cuda_kernels_replay_from_a_cuda_graph():
    """The launchers pass torch's current stream, so a graph capture records the CUDA kernels; the
    replay writes the same bytes into the graph's own buffers."""
    x = make_gate_up(33, 384, seed=2)
    xn = make_x(33, 96, torch.bfloat16, seed=2)
    gs = nvfp4.global_scale_of(xn)
    eager = (fp8.silu_mul_quant_fp8_packed(x, backend="cuda"), nvfp4_cuda(xn, gs))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = (fp8.silu_mul_quant_fp8_packed(x, backend="cuda"), nvfp4_cuda(xn, gs))
    for t in (*out[0], *out[1]):     # overwrite the graph's outputs, so the replay must write them
        _u8(t).fill_(0x5A)
    g.replay()
    torch.cuda.synchronize()
    for a, b in zip((*eager[0], *eager[1]), (*out[0], *out[1])):
        assert torch.equal(_u8(a), _u8(b))


@gpu
def test_build_is_cached():
    lib = nvcc.build()
    assert nvcc.build() is lib
    assert any(nvcc.cache_dir().glob("*/workbook_cuda.so"))


# --------------------------------------------------------------------------------------------------
# Benchmark record and the notebook section (any machine)
# --------------------------------------------------------------------------------------------------

@pytest.mark.skipif(ON_GPU, reason="on a GPU the benchmark runs (python -m workbook bench cuda)")
def test_benchmark_needs_a_gpu():
    with pytest.raises(RuntimeError, match="measures a GPU and none is present"):
        bench_cuda.run(smoke=True)
    with pytest.raises(RuntimeError, match="measures a GPU and none is present"):
        bench_cuda.live("nvfp4")


def _fake_record():
    """A record shaped as benchmarks.cuda.run() writes it, with made-up timings (for the display code only)."""
    def row(size_key, size, us_c, us_t):
        return {"M": 64, size_key: size, "bytes": 1000, "cuda_graph_us": us_c, "triton_graph_us": us_t,
                "cuda_eager_us": 20.0, "triton_eager_us": 30.0, "cuda_frac_of_copy": 0.5,
                "triton_frac_of_copy": 0.25, "cuda_speedup_vs_triton": us_t / us_c,
                "exact_cuda": True, "exact_triton": True, "cuda_equals_triton": True}
    rec = {"schema": 2, "name": "cuda", "recorded": "2026-01-01",
           "machine": {"torch": "t", "triton": "t", "python": "3", "device": "cuda", "gpu": "FAKE GPU"},
           "timers": {"graph": "fake", "eager": "fake"}, "ceilings": {"copy_GBps": 1.0},
           "results": {"nvfp4": {"rows": [row("K", 4096, 2.0, 4.0)]}, "fp8": {"rows": [row("N", 7168, 3.0, 6.0)]},
                       "sass_sm90": {"nvfp4:nvfp4_quant_kernel<bf16=1,swizzled=1,write_padding=1>":
                                     {"main_per_element": 20.1}}}}
    records.validate_record(rec)
    return rec


@pytest.mark.parametrize("topic", ["nvfp4", "fp8"])
def test_show_labels_the_timers_and_says_when_nothing_is_recorded(topic, monkeypatch, capsys):
    pytest.importorskip("IPython")

    def missing(name, directory=None):
        raise FileNotFoundError(name)

    monkeypatch.setattr(records, "load_record", missing)
    monkeypatch.setattr(plots_cuda, "ON_GPU", False)        # no live timing here
    plots_cuda.show(topic)
    assert "not recorded yet" in capsys.readouterr().out
    rec = _fake_record()
    monkeypatch.setattr(records, "load_record", lambda name, directory=None: rec)
    plots_cuda.show(topic)
    out = capsys.readouterr().out
    assert "FAKE GPU" in out and "CUDA-graph replay" in out and "eager" in out
    assert ("4096" if topic == "nvfp4" else "7168") in out
    assert ("SASS" in out) == (topic == "nvfp4")
    table = bench_cuda.table(rec, topic)
    assert "2.00" in table.splitlines()[2] and "True" in table.splitlines()[2]
    with pytest.raises(ValueError, match="topic must be"):
        plots_cuda.show("turboquant")


def test_recorded_table_reads_the_record():
    """The recorded comparison of both topics prints from workbook/data/cuda.json, every row exact."""
    rec = records.load_record("cuda")
    for topic, size in (("nvfp4", "K"), ("fp8", "N")):
        lines = bench_cuda.table(rec, topic).splitlines()
        rows = rec["results"][topic]["rows"]
        assert len(lines) == 2 + len(rows) and all(ln.rstrip().endswith("True") for ln in lines[2:]), lines
        assert all(r["cuda_graph_us"] > 0 and r["triton_eager_us"] > 0 for r in rows)


def test_cuda_record_holds_the_nvfp4_heatmap_over_the_triton_grid():
    """cuda.json carries the CUDA backend on every (M, K) of the Triton record's heatmap grid, bf16 and
    fp16, GPU time from graph replay with a device copy of the same bytes beside it, and notebook 02's
    plot draws it (one panel per dtype)."""
    import matplotlib
    matplotlib.use("Agg")
    from workbook.plots import nvfp4 as plots_nvfp4

    rec = records.load_record("cuda")
    heat = rec["results"]["nvfp4_heatmap"]
    want = {(m, k, d) for m in nvfp4_bench.HEATMAP_M for k in nvfp4_bench.HEATMAP_K for d in ("bfloat16", "float16")}
    assert {(r["M"], r["K"], r["dtype"]) for r in heat} == want and len(heat) == len(want)
    for r in heat:
        assert r["config"] is None, r   # GPU time from graph replay: the record's "graph" timer (the key)
        assert r["settle_s"] == bench_cuda.HEATMAP_SETTLE_S > 0, r   # each cell timed from a rested card
        assert r["bytes"] == nvfp4_bench.bytes_moved(r["M"], r["K"]) and r["input_bytes"] == r["M"] * r["K"] * 2, r
        assert r["graph_us"] > 0 and r["copy_same_bytes_graph_us"] > 0, r
        ceiling = rec["ceilings"]["copy_GBps"]
        assert r["frac_of_copy"] == pytest.approx(r["bytes"] / r["graph_us"] / 1e3 / ceiling, rel=1e-4), r   # ceiling rounded
        plan = r["plan"]   # the tail rule's launch (kernels/cuda/nvfp4.cu, plan())
        tiles = -(-r["M"] // 128) * -(-(r["K"] // 16) // 32)
        sms, rest = plan["sms"], tiles % plan["sms"]
        if plan["narrow"] and tiles >= plan["slots"]:   # past one wave, a thin last one: whole waves of
            # wide tiles, the rest as 4 narrow tiles each
            assert plan["wide"] % plan["slots"] == 0 and plan["narrow"] == 4 * (tiles - plan["wide"]), r
            assert 0 < tiles - plan["wide"] < 0.9 * plan["slots"] and plan["pieces"] == 0, r
        elif plan["narrow"]:  # one wave, more than half and at most 7/8 of the SMs a tile more: k whole
            # tiles per SM, the rest as 4 narrow tiles each
            assert plan["wide"] == tiles - rest and plan["narrow"] == 4 * rest and plan["pieces"] == 0, r
            assert sms < 2 * rest and 8 * rest <= 7 * sms, r
        elif plan["pieces"]:  # one wave, at most half the SMs a tile more: the rest as row pieces
            assert tiles < plan["slots"] and plan["wide"] == tiles - rest and 0 < 2 * rest <= sms, r
            assert plan["piece_rows"] == (32 if 4 * rest <= sms else 64), r
            assert plan["pieces"] == rest * 128 // plan["piece_rows"], r
        else:
            assert plan["wide"] == tiles and plan["piece_rows"] == 0, r
            assert tiles >= plan["slots"] or rest == 0 or 8 * rest > 7 * sms, r
    fig = plots_nvfp4.plot_heatmap(rec, key="nvfp4_heatmap")
    assert len([a for a in fig.axes if a.get_title().endswith("input")]) == 2


def test_measure_heatmap_refuses_a_negative_or_missing_pause():
    """The heatmap's pause before each cell is a number of seconds >= 0, refused with its name before any
    GPU work (so on the CPU too)."""
    for bad in (-0.5, float("nan"), None):
        with pytest.raises((ValueError, TypeError), match="settle_s"):
            nvfp4_bench.measure_heatmap(4000.0, settle_s=bad)


def test_cuda_record_holds_the_power_probe():
    """cuda.json carries timing.power_probe's samples for the copy and, at each of POWER_SIZES, both NVFP4
    launchers, each consistent (clock min <= mean <= max, mean power <= max, cap share in [0, 1]); notebook
    02 prints them."""
    power = records.load_record("cuda")["results"]["power"]
    want = {"copy 1 GiB (fp32)"} | {f"{who} nvfp4 {M}x{K} bf16" for M, K in bench_cuda.POWER_SIZES
                                    for who in ("cuda", "triton")}
    assert set(power) == want, sorted(power)
    for name, s in power.items():
        assert "error" not in s and s["samples"] >= 10, (name, s)
        c = s["sm_clock_MHz"]
        assert 0 < c["min"] <= c["mean"] <= c["max"], (name, s)
        assert 0 < s["power_W"]["mean"] <= s["power_W"]["max"] <= 1.1 * s["power_limit_W"], (name, s)
        assert 0 <= s["power_capped_share"] <= 1, (name, s)


# The line-by-line tables of notebooks 02 and 03 (markdown) name real lines of both kernels.
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _mapping_rows(notebook: str):
    """(CUDA cell, Triton cell) of every row of the notebook's '| CUDA C++ | Triton | what |' tables."""
    nb = json.loads((NOTEBOOKS / notebook).read_text())
    rows = []
    for cell in nb["cells"]:
        text = "".join(cell["source"])
        if cell["cell_type"] != "markdown" or "| CUDA C++ | Triton | what |" not in text:
            continue
        for line in text.splitlines():
            parts = re.split(r"(?<!\\)\|", line)[1:-1]          # cells, '\|' inside code kept
            if len(parts) == 3 and parts[0].strip().startswith("`"):
                rows.append(tuple(p.strip().strip("`").replace("\\|", "|") for p in parts[:2]))
    return rows


@pytest.mark.parametrize("topic,notebook", [("nvfp4", "02_nvfp4_quant.ipynb"), ("fp8", "03_fp8_silu_mul_quant.ipynb")])
def test_mapping_names_real_lines_of_both_kernels(topic, notebook):
    rows = _mapping_rows(notebook)
    assert len(rows) >= 8, f"{notebook}: the line-by-line table of the CUDA kernel is missing"
    cu = nvcc.SOURCES[topic].read_text()
    tri = (nvcc.CUDA_DIR.parent / f"{topic}.py").read_text() + (nvcc.CUDA_DIR.parent / "common.py").read_text()
    for c, t in rows:
        for src, text in ((cu, c), (tri, t)):
            names = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", text) if "_" in w]
            assert all(n in src for n in names), (topic, text, [n for n in names if n not in src])


def test_first_build_says_it_compiles_and_a_cached_one_is_silent(monkeypatch, tmp_path, capsys):
    """build() announces the one slow compile on stderr, then loads the cached library without a word
    (nvcc, the compile and the loader replaced: any machine)."""
    import types
    monkeypatch.setattr(nvcc, "_lib", None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(nvcc, "_nvcc_or_raise", lambda: ("nvcc", []))
    monkeypatch.setattr(nvcc, "_build_key", lambda nvcc_, extra: "k")
    runs = []
    monkeypatch.setattr(nvcc, "_run", lambda cmd: (runs.append(cmd), open(cmd[cmd.index("-o") + 1], "w").close()))

    class Lib:   # takes the argtypes / restype assignments
        def __getattr__(self, name):
            fn = types.SimpleNamespace()
            setattr(self, name, fn)
            return fn
    monkeypatch.setattr(nvcc.ctypes, "CDLL", lambda path: Lib())
    nvcc.build()
    assert len(runs) == 1 and "compiling" in capsys.readouterr().err
    monkeypatch.setattr(nvcc, "_lib", None)
    nvcc.build()
    assert len(runs) == 1 and capsys.readouterr().err == ""


def _c_params(src: str, name: str) -> list[str]:
    """The C types of ``name``'s parameters, as declared in the source's ``extern "C"`` definition."""
    m = re.search(rf'extern "C" [\w\s\*]+?\b{name}\((.*?)\)\s*\{{', src, re.S)
    assert m, f"extern \"C\" {name} not found"
    return [re.sub(r"\s*\b\w+$", "", p.strip()).replace(" *", "*") for p in m.group(1).split(",")]


def test_every_launcher_is_declared_to_ctypes_as_its_source_defines_it(monkeypatch, tmp_path):
    """build()'s argtypes match each extern "C" function's parameters one for one, in number and in width:
    a parameter added in the .cu but not to argtypes shifts every later one (a cudaStream_t read from an
    int's slot, garbage above 32 bits; the default stream would hide it). Any machine (loader replaced)."""
    import ctypes
    import types
    monkeypatch.setattr(nvcc, "_lib", None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(nvcc, "_nvcc_or_raise", lambda: ("nvcc", []))
    monkeypatch.setattr(nvcc, "_build_key", lambda nvcc_, extra: "k")
    monkeypatch.setattr(nvcc, "_run", lambda cmd: open(cmd[cmd.index("-o") + 1], "w").close())
    funcs = {}

    class Lib:
        def __getattr__(self, name):
            funcs[name] = fn = types.SimpleNamespace()
            setattr(self, name, fn)
            return fn
    monkeypatch.setattr(nvcc.ctypes, "CDLL", lambda path: Lib())
    nvcc.build()
    monkeypatch.setattr(nvcc, "_lib", None)
    width = {"int": ctypes.c_int, "float": ctypes.c_float, "long long": ctypes.c_longlong,
             "cudaStream_t": ctypes.c_void_p, "int*": ctypes.POINTER(ctypes.c_int)}
    src = "".join(p.read_text() for p in nvcc.SOURCES.values())
    declared = set(re.findall(r'extern "C" [\w\s\*]+?\b(\w+)\(', src))
    assert declared == set(funcs), (declared ^ set(funcs))
    for name, fn in funcs.items():
        params = _c_params(src, name)
        want = [width.get(p, ctypes.c_void_p if p.endswith("*") else None) for p in params]
        assert None not in want, (name, params)
        assert list(fn.argtypes) == want, (name, len(fn.argtypes), len(want))
