"""The timers (workbook/timing.py): what runs without a GPU (the guards, the power probe's summary of
nvidia-smi samples, kineto's marker filter), and on a GPU the power probe itself. The record schema is
tests/test_records.py; notebook 01's measurements are tests/test_alloc.py."""
import os

import pytest
import torch

from workbook import timing
from workbook.device import ON_GPU


def test_timers_are_named_once():
    assert set(timing.TIMERS) == {"graph", "eager", "events", "profiler", "ncu"}
    assert all(isinstance(v, str) and v for v in timing.TIMERS.values())


@pytest.mark.parametrize("call", [
    lambda: timing.time_us(lambda: None),
    lambda: timing.graph_time_us(lambda: None),
    lambda: timing.fixed_time_us(lambda: None, 3),
    lambda: timing.time_both(lambda: None),
    lambda: timing.kernel_times_us(lambda: None),
    lambda: timing.copy_ceiling_GBps(1 << 20),
    lambda: timing.power_probe(lambda: None),
], ids=["time_us", "graph_time_us", "fixed_time_us", "time_both", "kernel_times_us", "copy_ceiling_GBps",
        "power_probe"])
def test_gpu_timers_refuse_without_gpu(call):
    if ON_GPU:
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="measures a GPU and none is present here.*recorded H200 results"):
        call()


def test_quiet_kineto_drops_only_the_marker_lines(capfd):
    with timing.quiet_kineto():
        os.write(2, b"USDT: profiler_start\nSTAGE:2026 x\na real warning\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "STAGE:" not in err and "a real warning" in err, err


def test_power_summary_counts_only_readable_samples_inside_the_window():
    """power_probe's summary: lines before the window (the ramp), after it, or unreadable are dropped;
    the cap share counts the software-power-cap bit (0x4) of the clock-event reasons, not any bit."""
    lines = [(0.5, "1980, 120.0, 700.00, 0x0000000000000000"),      # before the window: dropped
             (1.0, "1500, 699.5, 700.00, 0x0000000000000004"),      # capped
             (1.1, "1800, 650.0, 700.00, 0x0000000000000001"),      # another reason (idle): not the cap
             (1.2, "[N/A], 600.0, 700.00, 0x0000000000000000"),     # unreadable: dropped
             (1.3, "1700, 690.0, 700.00, 0x0000000000000084"),      # cap among other reasons
             (2.5, "1980, 300.0, 700.00, 0x0000000000000000")]      # after the window: dropped
    s = timing.power_summary(lines, 1.0, 2.0)
    assert s["samples"] == 3 and s["sm_clock_MHz"] == {"mean": 1667, "min": 1500, "max": 1800}, s
    assert s["power_W"] == {"mean": 679.8, "max": 699.5} and s["power_limit_W"] == 700.0, s
    assert s["power_capped_share"] == pytest.approx(2 / 3, abs=1e-3), s
    assert "error" in timing.power_summary(lines, 3.0, 4.0)


@pytest.mark.skipif(not ON_GPU, reason="measures a GPU")
def test_time_both_reports_both_timers_under_the_records_names():
    """time_both gives graph replay and eager per-call time under the record's names (no figure is
    asserted: tests are not benchmarks, and the GPU may be shared while they run)."""
    src = torch.randn(1 << 20, device="cuda")
    dst = torch.empty_like(src)
    both = timing.time_both(lambda: dst.copy_(src))
    assert set(both) == {"eager_us", "graph_us"}, both
    assert all(0 < v < 1e6 for v in both.values()), both


@pytest.mark.skipif(not ON_GPU, reason="measures a GPU")
def test_power_probe_samples_a_running_copy():
    src = torch.randn(1 << 24, device="cuda")
    dst = torch.empty_like(src)
    s = timing.power_probe(lambda: dst.copy_(src), seconds=0.8, n=5, settle_s=0.2)
    if "error" in s:
        pytest.skip(f"nvidia-smi unavailable here: {s['error']}")
    assert s["samples"] >= 3 and 0 < s["sm_clock_MHz"]["min"] <= s["sm_clock_MHz"]["mean"] <= s["sm_clock_MHz"]["max"], s
    assert 0 < s["power_W"]["mean"] <= s["power_W"]["max"] and s["power_limit_W"] > 0, s
    assert 0 <= s["power_capped_share"] <= 1, s
