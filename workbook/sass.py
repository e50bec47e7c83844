"""Static SASS of the CUDA C++ kernels (``kernels/cuda/*.cu``) for sm_90, read on any machine with an
``nvcc``: no GPU needed.

Each source is compiled alone to a cubin (:func:`workbook.nvcc.compile_check`) and disassembled with
``cuobjdump -sass`` (:func:`workbook.nvcc.cuobjdump`: the CUDA toolkit's, or the copy Triton ships).
A count here is static: every instruction of a path once, as one thread of a real block executes it;
it says what a thread issues per element, not how long the GPU takes.

* :func:`sass_counts`: the NVFP4 and FP8 quant kernels, per instantiation: all instructions, those
  of the main path (NVFP4: the loop body that quantizes one 16-element block, :func:`_block_loop`;
  FP8: up to the main path's EXIT) and that path per element, with its opcode histogram.
* :func:`tq_decode_sass`: the TurboQuant decode kernel's main loop (one 32-token step of one warp),
  per cache element and by kind of work (:data:`_TQ_KINDS`).

``workbook/data/cuda.json`` holds :func:`sass_counts` under ``sass_sm90`` and
``workbook/data/turboquant.json`` holds :func:`tq_decode_sass` under ``static_sass_cuda``;
``tests/test_cuda.py`` checks both against the design the sources' headers state.
"""
from __future__ import annotations

import re
import subprocess
import tempfile

from . import nvcc

__all__ = ["sass_counts", "tq_decode_sass"]

# elements one thread handles: nvfp4, one 16-element block; fp8, 2 x 8 columns per lane; the
# silu-only kernel of the proof, one
_ELEMENTS_PER_THREAD = {"nvfp4_quant_kernel": 16, "silu_mul_quant_fp8_kernel": 16, "silu_mul_bf16_kernel": 1}
_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def _disassemble(topic: str, out_dir, source=None) -> str:
    """``cuobjdump -sass`` of ``kernels/cuda/<topic>.cu`` (or ``source``) compiled alone for sm_90."""
    tool = nvcc.cuobjdump()
    if tool is None:
        raise RuntimeError("no cuobjdump found (CUDA toolkit or Triton's bundled copy)")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = nvcc.compile_check(topic, out_dir or tmp, source=source)
        return subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def _functions(sass: str) -> tuple[dict[str, list[str]], dict[str, list[int]]]:
    """Per function of a disassembly: its instructions and their addresses."""
    name = None
    body: dict[str, list[str]] = {}
    addrs: dict[str, list[int]] = {}
    for line in sass.splitlines():
        if "Function :" in line:
            name = line.split("Function :")[1].strip()
            body[name], addrs[name] = [], []
        elif name and (mt := _INSTR.match(line)):
            body[name].append(mt.group(1))
            addrs[name].append(int(line.split("/*")[1].split("*/")[0], 16))
    return body, addrs


def sass_counts(out_dir=None) -> dict:
    """Static SASS of each CUDA quant kernel for sm_90 (compiled here, no GPU needed): per kernel
    instantiation, the instructions up to the first EXIT-terminated main path's end (``main``, the
    out-of-line slow paths of IEEE division after it excluded), all of them (``total``), and
    ``main`` per element (a thread of either quant kernel handles 16 elements per block). The NVFP4
    quantizer loops over blocks: its ``main`` is the loop body that quantizes one block
    (:func:`_block_loop`); the threshold table, built before it (by a one-wave CTA, or by the table
    kernel once per call), is left out. A static count: every instruction of that path once, as a
    thread of a real block executes it. For a loop, ``loads_at`` lists the positions in it of its
    global loads (the next step's x)."""
    out = {}
    for topic in ("nvfp4", "fp8"):   # the quant kernels (the TurboQuant decode kernel: tq_decode_sass)
        body, addrs = _functions(_disassemble(topic, out_dir))
        for fn, ins in body.items():
            short = _short(fn)
            if short.startswith("nvfp4_threshold_table_kernel"):
                continue   # the table kernel: 1024 threads once per call, not per element
            per_thread = _ELEMENTS_PER_THREAD[short.split("<")[0]]
            loop = _block_loop(ins, addrs[fn]) if short.startswith("nvfp4_quant_kernel") else None
            if loop is not None:
                # a loop over the blocks: its body is what a thread runs per 16-element block
                main = loop
            else:
                # main path: up to the last EXIT before the first CALL target / BRA-to-self tail
                last_exit = max((i for i, s in enumerate(ins) if s.split()[-1] == "EXIT" or s.endswith("EXIT")),
                                default=len(ins) - 1)
                main = ins[:last_exit + 1]
            out[f"{topic}:{short}"] = {
                "total": len(ins), "main": len(main),
                "main_per_element": round(len(main) / per_thread, 2),
                "ops": _op_histogram(main),
            }
            if loop is not None:   # where the loop issues its global loads (the next block's x)
                out[f"{topic}:{short}"]["loads_at"] = [i for i, s in enumerate(main) if "LDG" in s]
    return out


def _block_loop(ins: list[str], addrs: list[int]) -> list[str] | None:
    """The instructions of the smallest loop (a backward BRA and its target) that holds a scale
    conversion (F2FP): the NVFP4 quantizer's per-block body (the table built before the loop converts
    scale bytes too, outside any loop). None without one."""
    f2fps = [i for i, s in enumerate(ins) if "F2FP" in s]
    best = None
    for i, s in enumerate(ins):
        op = s.split()
        op = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
        if not op.startswith("BRA") or "0x" not in s:
            continue
        target = int(s.split("0x")[-1].split()[0].rstrip(";"), 16)
        if target > addrs[i] or target not in addrs:
            continue
        j = addrs.index(target)
        if any(j <= f <= i for f in f2fps) and (best is None or i - j < best[1] - best[0]):
            best = (j, i)
    return None if best is None else ins[best[0]:best[1] + 1]


def _short(mangled: str) -> str:
    """'nvfp4_quant_kernel<bf16=1,swizzled=1,write_padding=1>' from a mangled kernel name."""
    known = {"nvfp4_quant_kernel": ("bf16", "swizzled", "write_padding"), "nvfp4_threshold_table_kernel": ("bf16",),
             "silu_mul_quant_fp8_kernel": ("silu_mul", "fast_silu"),
             "silu_mul_bf16_kernel": ("fast_silu",)}
    name = next((k for k in known if k in mangled), mangled)
    keys = known.get(name, ())
    flags = re.findall(r"Lb([01])E", mangled)
    args = [f"{k}={v}" for k, v in zip(keys, flags)]
    if name == "nvfp4_quant_kernel":   # the tile width, an int argument: 32 (wide) or 8 (narrow) blocks
        args += [f"cols={v}" for v in re.findall(r"Li(\d+)E", mangled)]
    return f"{name}<{','.join(args)}>"


# SASS opcodes by what they do in the TurboQuant decode loop (the rest: addresses, masks, loop control)
_TQ_KINDS = {
    "dequant (prmt / lop3 / shifts / packed fp16 subtract)": ("PRMT", "LOP3", "SHF", "HADD2", "HFMA2"),
    "tensor cores and the P transpose (HMMA / MOVM)": ("HMMA", "MOVM"),
    "softmax arithmetic (FMUL/FFMA/FADD/FMNMX/MUFU/F2FP/FSEL)": ("FMUL", "FFMA", "FADD", "FMNMX", "MUFU", "F2FP",
                                                                 "FSEL", "FSETP"),
    "shuffles and votes (the softmax max)": ("SHFL", "VOTE", "WARPSYNC"),
    "shared memory (LDS, LDSM) and cp.async (LDGSTS, waits)": ("LDS", "LDSM", "LDGSTS", "LDGDEPBAR", "DEPBAR"),
    "global loads": ("LDG",),
}
_TQ_ELEMENTS_PER_STEP = 256.0   # one 32-token step of a warp: 32 x 128 key codes + as many value codes, per thread


def _hmma(body: list[str]) -> int:
    return sum(1 for b in body if "HMMA" in b.split()[0] or (b.startswith("@") and "HMMA" in b.split()[1]))


def _tq_loop(ins: list[str], addr: list[int]) -> tuple[list[str], list[int]]:
    """The shortest backward branch around one whole step's matrix multiplies (2 tiles x 16 HMMA): the
    decode loop's own back edge, as its instructions and their addresses. The out-of-line
    warp-divergence paths after the function's end also jump back, over longer spans."""
    best = None
    for i, s in enumerate(ins):
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", s)
        if m and "BRA.DIV" not in s and int(m.group(1), 16) < addr[i]:
            j = addr.index(int(m.group(1), 16))
            body = ins[j:i + 1]
            if _hmma(body) >= 32 and (best is None or len(body) < len(best[0])):
                best = body, addr[j:i + 1]
    if best is None:
        raise RuntimeError("no loop with matrix multiplies found in the decode kernel's SASS")
    return best


def _tq_rescale_branch(body: list[str], addrs: list[int]) -> int:
    """Instructions of the loop's rescale block: the ones that the first forward branch after the step's
    vote (VOTE.ANY: did some lane's score pass the running max?) jumps over; ptxas may schedule a few
    independent instructions between the two. 0 if the loop has no such branch."""
    votes = [k for k, s in enumerate(body) if s.startswith("VOTE")]
    for k in range(votes[0] + 1 if votes else len(body), len(body)):
        m = re.search(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)", body[k])
        if m and "BRA.DIV" not in body[k] and int(m.group(1), 16) > addrs[k]:
            return sum(1 for a in addrs if addrs[k] < a < int(m.group(1), 16))
    return 0


def _tq_decode_function(sass: str, key_table: bool) -> tuple[list[str], list[int]]:
    """The decode kernel's instructions and addresses: the instantiation with the shared-memory key
    table (``tq_decode_cuda_kernel<true>``) or with the register table (``<false>``) of a templated
    source (main's); a source with one untemplated decode kernel (kernel L, in the history) gives that one."""
    body, addrs = _functions(sass)
    names = [n for n in body if "tq_decode_cuda_kernel" in n]
    want = [n for n in names if ("ILb1E" if key_table else "ILb0E") in n] or [n for n in names if "ILb" not in n]
    if not want:
        raise RuntimeError(f"no decode kernel with key_table={key_table} in the SASS (functions: {names})")
    return body[want[0]], addrs[want[0]]


def tq_decode_sass(out_dir=None, source=None, key_table: bool = True) -> dict:
    """Static SASS of the CUDA decode kernel's main loop for sm_90 (compiled here with nvcc, no GPU
    needed): the loop is the backward branch whose body holds the matrix multiplies; one iteration is
    one 32-token step of one warp, i.e. 32 x 128 key codes + as many value codes = 256 cache elements
    per thread. Returns instructions per step, per element, the opcode histogram and per-element
    counts by kind (``_TQ_KINDS``). A static count: each instruction of the loop body once (the
    rescale branch, taken on few steps, included; ``rescale_branch_instructions`` says how many it
    holds and ``common_path_instructions_per_step`` counts the rest, what most steps issue).
    ``source``: another version of ``kernels/cuda/turboquant.cu`` (a variant on a branch or in the history).
    ``key_table``: of the two instantiations of the decode kernel (``tq_decode_cuda_kernel<bool LUT>``, as on
    main), the one that unpacks keys through its shared-memory table (else the register one); a source with
    one untemplated decode kernel (kernel L, commit d3dbd6e) gives that one either way."""
    ins, addr = _tq_decode_function(_disassemble("turboquant", out_dir, source), key_table)
    best, best_addr = _tq_loop(ins, addr)
    rescale = _tq_rescale_branch(best, best_addr)
    hist = _op_histogram(best)
    per_elem = _TQ_ELEMENTS_PER_STEP
    kinds = {k: 0 for k in _TQ_KINDS}
    other = 0
    for op, n in hist.items():
        kind = next((k for k, ops in _TQ_KINDS.items() if op in ops), None)
        if kind is None:
            other += n
        else:
            kinds[kind] += n
    kinds["addresses, masks, moves, loop control"] = other
    return {"loop_instructions_per_step": len(best), "rescale_branch_instructions": rescale,
            "common_path_instructions_per_step": len(best) - rescale, "cache_elements_per_thread_per_step": per_elem,
            "loop_instructions_per_element": round(len(best) / per_elem, 2), "ops": hist,
            "per_element_by_kind": {k: round(v / per_elem, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])}}


def _op_histogram(ins: list[str]) -> dict:
    """{opcode without modifiers: count}, the predicate (``@P0``) skipped, largest first."""
    hist: dict[str, int] = {}
    for s in ins:
        op = s.split()
        op = op[1] if op[0].startswith("@") and len(op) > 1 else op[0]
        op = op.split(".")[0]
        hist[op] = hist.get(op, 0) + 1
    return dict(sorted(hist.items(), key=lambda kv: -kv[1]))
