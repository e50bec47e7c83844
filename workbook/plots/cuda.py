"""The CUDA C++ section of notebooks 02 and 03: ``show('nvfp4')`` / ``show('fp8')``.

It displays what the kernel does differently from the Triton one (:data:`_NOTES`), the source of
``kernels/cuda/<topic>.cu``, and the recorded comparison with the Triton backend
(``workbook/data/cuda.json``, :func:`workbook.benchmarks.cuda.table`: GPU time from CUDA-graph
replay beside eager per-call time) with the static SASS count per element; on a GPU it also times
both backends at one size now (:func:`workbook.benchmarks.cuda.live`), labelled live. The line-by-line
mapping of the CUDA source to the Triton kernel is notebook prose, in a markdown cell of each notebook.
"""
from __future__ import annotations

from .. import records
from ..device import ON_GPU
from ..nvcc import SOURCES

__all__ = ["show"]

_NOTES = {
    "nvfp4": ("The same bytes as the Triton kernel, by another route (the header comment of the source says why "
              "each step is exact): the E2M1 index is the count of thresholds below |x|, found by a binary search "
              "(three comparisons in x's own format, two elements at a time) against a table of 128 scale bytes "
              "x 7 decision points (built by each CTA while its first loads are in flight when the tiles fit in "
              "one wave, else once per call by a small first kernel); and each CTA quantizes a tile of 128 rows "
              "x 32 blocks and stores its scale bytes as whole 512-byte swizzled tiles. Blackwell has an "
              "instruction for the E2M1 rounding, `cvt.rn.satfinite.e2m1x2.f32`, but only on its arch-specific "
              "targets (sm_100a and later); the source uses it there, under an arch guard. The E4M3 scale uses "
              "the hardware conversion `cvt.rn.satfinite.e4m3x2.f32`."),
    "fp8": ("The conversions are the hardware ones (`cvt.rn.bf16x2.f32`, `cvt.rn.satfinite.e4m3x2.f32`). SiLU "
            "runs torch's sequence (accurate `expf`, IEEE division) unless a cheaper one (`ex2.approx`, "
            "`div.full`) has been proven to give the same bf16 on every one of the 65280 finite bf16 gates on "
            "this GPU: the proof the Triton launcher runs for its own variants."),
}

_NOT_RECORDED = "CUDA vs Triton on the H200: not recorded yet (run `python -m workbook bench cuda` on a GPU)"


def show(topic: str) -> None:
    """The CUDA section of a notebook: the source of kernels/cuda/<topic>.cu (IPython Code) and the
    timings of workbook/data/cuda.json (GPU time from CUDA-graph replay beside eager per-call time;
    'not recorded yet' without a record). On a GPU it also times both backends live at one size,
    labelled live."""
    from IPython.display import Code, Markdown, display

    from ..benchmarks import cuda as bench_cuda

    if topic not in _NOTES:
        raise ValueError(f"topic must be one of {sorted(_NOTES)}, got {topic!r}")
    display(Markdown(f"**`kernels/cuda/{topic}.cu`** (CUDA C++; the Triton kernel is in `kernels/{topic}.py`). "
                     + _NOTES[topic]))
    display(Code(SOURCES[topic].read_text(), language="cuda"))
    print(recorded_text(topic))
    if ON_GPU:
        live = bench_cuda.live(topic)
        print(f"\nLIVE on this GPU (copy ceiling {live['ceilings']['copy_GBps']:.0f} GB/s):\n"
              + bench_cuda.table(live, topic))


def recorded_text(topic: str) -> str:
    """The recorded comparison of ``topic`` as text, labelled with where and when it was measured,
    with the static SASS count per element of the CUDA quant kernels; 'not recorded yet' without a
    record."""
    from ..benchmarks import cuda as bench_cuda

    try:
        rec = records.load_record("cuda")
        text = f"CUDA vs Triton, {records.recorded_label(rec)}\n{bench_cuda.table(rec, topic)}"
    except (FileNotFoundError, KeyError, ValueError):
        return _NOT_RECORDED
    counts = {k.split(":", 1)[1]: v for k, v in rec["results"].get("sass_sm90", {}).items()
              if k.startswith(f"{topic}:") and "quant" in k}
    if counts:
        text += ("\nSASS for sm_90 (static count per element: the main path / 16 elements per thread; "
                 "NVFP4: the loop body that quantizes one block / 16): ") + ", ".join(
            f"{k} {v['main_per_element']}" for k, v in counts.items())
    return text
