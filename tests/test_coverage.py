"""The coverage toolkit must catch what it claims to catch, and pass what is correct."""
import pytest
import torch

from workbook.coverage import (
    assert_consumer_reads_only_written, assert_fully_written, consumer_differential, coverage,
    find_redundant_zero_fills, poison_, poisoned_allocations, poisons_for, storage_bytes, storage_view,
)
from workbook.device import DEVICE


# --- producers ------------------------------------------------------------------------------------

def producer_ok(x):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # every row written below
    out.copy_(x * 2)
    return out


def producer_skips_last_row(x):
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out[:-1] = x[:-1] * 2  # the off-by-one: row M-1 never written
    return out


def padded_producer(x, write_padding):
    """Writes a [M, N] view of a [round_up(M, 8), N] int32 allocation (a padded tile)."""
    M, N = x.shape
    Mp = (M + 7) // 8 * 8
    storage = torch.empty(Mp, N, dtype=torch.int32, device=x.device)
    storage[:M] = (x * 100).to(torch.int32)
    if write_padding:
        storage[M:] = 0
    return storage[:M]


def mn_major_producer(x):
    """The packed-scale layout of notebook 03: storage [G, round_up(M, 4)], result = .T[:M, :]."""
    M, G = x.shape
    storage = torch.empty(G, (M + 3) // 4 * 4, dtype=torch.int32, device=x.device)
    view = storage.T[:M, :]
    view.copy_((x * 10).to(torch.int32))
    return view


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_poison_fills_whole_storage_two_ways(dtype):
    base = torch.empty(6, 5, dtype=dtype, device=DEVICE)
    view = base[1:3, ::2]
    seen = []
    for pattern in poisons_for(dtype):
        poison_(view, pattern)
        seen.append(storage_bytes(view).clone())
        if pattern == "nan":
            assert torch.isnan(storage_view(view).float()).all()
        else:
            assert (storage_bytes(view) == (0xA5 if pattern == "a5" else 0x7F)).all()
    assert not torch.equal(seen[0], seen[1]), "the two poisons must differ in every byte"
    assert (seen[0] != seen[1]).all()


def test_poisoned_allocations_poison_empty_but_not_zeros():
    with poisoned_allocations("nan"):
        e = torch.empty(4, 3, device=DEVICE)
        z = torch.zeros(4, 3, device=DEVICE)
        i = torch.empty(5, dtype=torch.int32, device=DEVICE)
        s = torch.empty_strided((3, 2), (1, 3), device=DEVICE)
    assert torch.isnan(e).all() and torch.isnan(s).all()
    assert (z == 0).all()
    assert (i == int.from_bytes(b"\xa5" * 4, "little", signed=True)).all()


def test_correct_producer_passes():
    x = torch.randn(37, 9, device=DEVICE)
    (cov,) = assert_fully_written(producer_ok, x)
    assert cov.storage_fully_written and cov.view_fully_written


def test_catches_producer_that_skips_its_last_row():
    x = torch.randn(37, 9, device=DEVICE)
    (cov,) = coverage(producer_skips_last_row, x)
    assert not cov.view_fully_written
    assert cov.unwritten_in_view.nonzero()[:, 0].unique().tolist() == [36]
    with pytest.raises(AssertionError, match=r"rows 36\.\.36 cols 0\.\.8"):
        assert_fully_written(producer_skips_last_row, x, scope="view")


def test_catches_unwritten_padding_outside_the_view():
    x = torch.randn(13, 4, device=DEVICE)
    (cov,) = coverage(padded_producer, x, False)
    assert cov.view_fully_written, "the view itself is complete"
    assert not cov.storage_fully_written
    assert cov.storage_shape == (16, 4)
    assert cov.unwritten_outside_view.sum() == 3 * 4
    assert cov.unwritten_ranges("outside") == "rows 13..15 cols 0..3"
    assert_fully_written(padded_producer, x, False, scope="view")  # view scope is satisfied ...
    with pytest.raises(AssertionError, match="outside the view: rows 13..15"):
        assert_fully_written(padded_producer, x, False, scope="storage")  # ... storage scope is not
    assert_fully_written(padded_producer, x, True, scope="storage")


def test_mn_major_view_over_larger_storage():
    x = torch.randn(5, 3, device=DEVICE)
    (cov,) = coverage(mn_major_producer, x)
    assert cov.storage_shape == (3, 8) and cov.view_shape == (5, 3) and cov.view_stride == (1, 8)
    assert cov.view_fully_written
    assert cov.unwritten_ranges("outside") == "rows 0..2 cols 5..7"
    assert int(cov.in_view.sum()) == 15


def test_caller_owned_buffer():
    buf = torch.empty(10, 3, device=DEVICE)

    def fill_rows(b, n):
        b[:n] = 1.5

    (cov,) = coverage(fill_rows, buf, 10, out=buf)
    assert cov.storage_fully_written
    (cov,) = coverage(fill_rows, buf, 7, out=buf)
    assert cov.unwritten_ranges("view") == "rows 7..9 cols 0..2"


def test_value_equal_to_one_poison_still_counts_as_written():
    """A producer that happens to write 0xA5A5A5A5 is not mistaken for an unwritten one."""
    def writes_a5(x):
        out = torch.empty(4, dtype=torch.int32, device=x.device)
        out.fill_(int.from_bytes(b"\xa5" * 4, "little", signed=True))
        return out

    (cov,) = coverage(writes_a5, torch.zeros(1, device=DEVICE))
    assert cov.storage_fully_written


def consumer_view_only(v):
    return v.double().sum(dim=1)


def consumer_reads_whole_storage(v):
    return storage_view(v).double().sum(dim=0)


def test_consumer_differential():
    x = torch.randn(13, 4, device=DEVICE)
    ok = consumer_differential(padded_producer, consumer_view_only, x, False)
    assert ok.identical
    bad = consumer_differential(padded_producer, consumer_reads_whole_storage, x, False)
    assert not bad.identical and bad.n_differ == 4
    with pytest.raises(AssertionError, match="reads bytes nobody wrote"):
        assert_consumer_reads_only_written(padded_producer, consumer_reads_whole_storage, x, False)
    # once the producer writes its padding, even the whole-storage reader is well defined
    assert_consumer_reads_only_written(padded_producer, consumer_reads_whole_storage, x, True)


# --- the redundant zero-fill detector --------------------------------------------------------------

def gdn_like_output(z):
    z_out = torch.empty_like(z)
    z_out.zero_()          # redundant: overwritten right below
    z_out[:] = z
    return z_out


def accumulate(x):
    acc = torch.zeros(x.shape[0], device=x.device)  # necessary: the loop adds into it
    for j in range(x.shape[1]):
        acc += x[:, j]
    out = torch.zeros_like(x)                         # redundant: fully overwritten
    out.copy_(x.cumsum(1))
    return acc, out


def partial_write(x, n):
    out = x.new_zeros(x.shape)                        # necessary: rows n.. are read as zeros
    out[:n] = x[:n]
    return out


def into_callers_buffer(x, buf):
    buf.fill_(0)                                      # necessary: only the diagonal is written after
    buf.diagonal().copy_(x)


def test_zero_fill_detector_verdicts():
    x = torch.randn(6, 5, device=DEVICE)
    r = find_redundant_zero_fills(gdn_like_output, x)
    assert [s.op for s in r.sites] == ["Tensor.zero_"] and r.sites[0].redundant
    r = find_redundant_zero_fills(accumulate, x)
    kinds = {s.op: s.redundant for s in r.sites}
    assert kinds == {"torch.zeros": False, "torch.zeros_like": True}, r.report()
    assert all(s.site.startswith("...") or "test_coverage.py:" in s.site for s in r.sites)
    r = find_redundant_zero_fills(partial_write, x, 4)
    assert [(s.op, s.redundant) for s in r.sites] == [("Tensor.new_zeros", False)]
    r = find_redundant_zero_fills(partial_write, x, 6)
    assert [(s.op, s.redundant) for s in r.sites] == [("Tensor.new_zeros", True)]
    r = find_redundant_zero_fills(into_callers_buffer, x[:, 0], torch.randn(6, 6, device=DEVICE))
    assert [(s.op, s.redundant) for s in r.sites] == [("Tensor.fill_(0)", False)]


def test_zero_fill_detector_names_lines():
    import inspect

    x = torch.randn(6, 5, device=DEVICE)
    r = find_redundant_zero_fills(accumulate, x)
    src, first = inspect.getsourcelines(accumulate)
    line_acc = first + next(i for i, s in enumerate(src) if "acc = torch.zeros" in s)
    line_out = first + next(i for i, s in enumerate(src) if "out = torch.zeros_like" in s)
    assert r.verdict(f"test_coverage.py:{line_acc}") == "necessary"
    assert r.verdict(f"test_coverage.py:{line_out}") == "redundant"
    assert "REDUNDANT" in r.report() and "necessary" in r.report()


def test_zero_fill_detector_refuses_nondeterminism():
    def noisy(x):
        return torch.zeros_like(x) + torch.rand_like(x)

    with pytest.raises(RuntimeError, match="not deterministic"):
        find_redundant_zero_fills(noisy, torch.randn(3, device=DEVICE))


def test_bad_pattern_names_the_rule():
    with pytest.raises(ValueError, match="pattern must be one of"):
        poison_(torch.empty(2), "zeros")
    with pytest.raises(TypeError, match="floating-point"):
        poison_(torch.empty(2, dtype=torch.int32), "nan")


def gather_with_index(x):
    idx = torch.zeros(3, dtype=torch.long, device=x.device)  # necessary: used as indices
    return x[idx]


def test_zero_fill_read_as_index_is_necessary_not_a_crash():
    # on the CPU: on a GPU the poisoned index trips a device-side assert that ends the CUDA context
    r = find_redundant_zero_fills(gather_with_index, torch.randn(5))
    assert [(s.op, s.redundant) for s in r.sites] == [("torch.zeros", False)]
    assert "raised" in r.sites[0].detail


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.bfloat16, torch.int64])
def test_two_poisons_differ_in_every_byte_for_every_dtype(dtype):
    seen = []
    for which in (0, 1):
        with poisoned_allocations(which):
            t = torch.empty(8, dtype=dtype, device=DEVICE)
        seen.append(storage_bytes(t).clone())
    assert (seen[0] != seen[1]).all(), f"{dtype}: the two allocation poisons coincide somewhere"


def fp8_producer(x, skip_last):
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    n = x.shape[0] - 1 if skip_last else x.shape[0]
    out[:n] = x[:n].clamp(-448, 448).to(torch.float8_e4m3fn)
    return out


def test_fp8_outputs_are_checked_too():
    x = torch.randn(6, 4, device=DEVICE) * 100
    assert coverage(fp8_producer, x, False)[0].storage_fully_written
    assert coverage(fp8_producer, x, True)[0].unwritten_ranges() == "rows 5..5 cols 0..3"


def l_shaped_producer(x):
    """Writes the first 3 entries of row 0 of a [8, 4] tile and nothing else (an L-shaped gap)."""
    tile = torch.empty(8, 4, dtype=torch.uint8, device=x.device)
    tile[0, :3] = 1
    return tile


def test_l_shaped_gap_is_reported_by_row_groups_not_a_bounding_box():
    (cov,) = coverage(l_shaped_producer, torch.zeros(1, device=DEVICE))
    assert cov.unwritten_ranges() == "rows 0..0 cols 3; rows 1..7 cols 0..3"
    assert int((~cov.written).sum()) == 29


def slice_assignments(x, n):
    out = torch.empty(x.shape[0] + 2, x.shape[1], device=x.device)
    out[:] = 0               # redundant when n covers every row below, necessary otherwise
    out[: x.shape[0]] = x
    out[x.shape[0]:n] = 1.0
    pad = torch.full((2,), fill_value=0, dtype=torch.int32, device=x.device)  # redundant: overwritten
    pad.copy_(torch.arange(2, dtype=torch.int32, device=x.device))
    return out, pad


def test_slice_assignment_and_full_zero_fills():
    x = torch.randn(3, 4, device=DEVICE)
    r = find_redundant_zero_fills(slice_assignments, x, 5)
    assert [(s.op, s.redundant) for s in r.sites] == [("Tensor[...] = 0", True), ("torch.full(.., 0)", True)], r.report()
    r = find_redundant_zero_fills(slice_assignments, x, 4)  # the last row keeps the zeros
    assert [(s.op, s.redundant) for s in r.sites] == [("Tensor[...] = 0", False), ("torch.full(.., 0)", True)], r.report()


def test_consumer_differential_refuses_a_nondeterministic_consumer():
    x = torch.randn(13, 4, device=DEVICE)
    with pytest.raises(RuntimeError, match="not deterministic"):
        consumer_differential(padded_producer, lambda v: v.float() + torch.rand(v.shape, device=v.device), x, True)


# --- accumulation: a byte is written only when its final value is the same under both poisons ------

def accumulates_into_empty(x):
    out = torch.empty_like(x)
    out += x                 # reads the garbage torch.empty handed out
    return out


def accumulates_into_zeros(x):
    out = torch.zeros_like(x)  # zeros is a write: the accumulation starts from a defined value
    out += x
    return out


def split_k(x, w, splits, first="add", alloc="empty"):
    """out = x @ w as `splits` partial products over K, each added into the output (split-K)."""
    out = getattr(torch, alloc)(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    ks = torch.arange(x.shape[1]).tensor_split(splits)
    for i, k in enumerate(ks):
        part = x[:, k] @ w[k]
        if i == 0 and first == "store":
            out.copy_(part)  # the first split stores, the others add: no zeros needed
        else:
            out += part
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_accumulating_into_empty_is_read_before_written_not_written(dtype):
    x = (torch.randn(7, 5, device=DEVICE) * 10).to(dtype)
    x[x == 0] = 1  # adding 0 would leave the poison itself: indistinguishable from never written
    (cov,) = coverage(accumulates_into_empty, x)
    assert not cov.written.any() and cov.read_before_written.all(), cov.report()
    assert not cov.never_written.any() and not cov.nondeterministic.any()
    assert cov.accumulated and not cov.storage_fully_written and not cov.view_fully_written
    with pytest.raises(AssertionError, match=r"READ BEFORE WRITTEN, i\.e\. accumulated into \(rows 0\.\.6 cols 0\.\.4\)"
                                             r".*needs torch\.zeros"):
        assert_fully_written(accumulates_into_empty, x, scope="view")
    (ok,) = assert_fully_written(accumulates_into_zeros, x)
    assert ok.written.all() and not ok.accumulated


def test_split_k_partial_sums_need_zeros_or_a_first_store():
    x, w = torch.randn(9, 12, device=DEVICE), torch.randn(12, 5, device=DEVICE)
    (cov,) = coverage(split_k, x, w, 3)
    assert cov.read_before_written.all(), cov.report()
    with pytest.raises(AssertionError, match="accumulated into"):
        assert_fully_written(split_k, x, w, 3)
    assert_fully_written(split_k, x, w, 3, alloc="zeros")
    assert_fully_written(split_k, x, w, 3, first="store")
    assert_fully_written(split_k, x, w, 1, first="store")


def atomics_into(x, idx, n_rows, alloc, op):
    out = getattr(torch, alloc)(n_rows, x.shape[1], dtype=x.dtype, device=x.device)
    if op == "index_add_":
        out.index_add_(0, idx, x)     # atomicAdd on a GPU
    else:
        out.scatter_add_(0, idx[:, None].expand_as(x), x)
    return out


@pytest.mark.parametrize("op", ["index_add_", "scatter_add_"])
def test_atomics_into_empty(op):
    x = torch.randint(1, 100, (6, 3), dtype=torch.int32, device=DEVICE)
    idx = torch.tensor([0, 2, 2, 5, 0, 2], device=DEVICE)   # rows 1, 3, 4 and 6 get nothing
    (cov,) = coverage(atomics_into, x, idx, 7, "empty", op)
    assert cov.ranges(cov.read_before_written) == "rows 0..0 cols 0..2; rows 2..2 cols 0..2; rows 5..5 cols 0..2"
    assert cov.never_written_ranges() == "rows 1..1 cols 0..2; rows 3..4 cols 0..2; rows 6..6 cols 0..2"
    assert not cov.written.any()
    with pytest.raises(AssertionError) as e:
        assert_fully_written(atomics_into, x, idx, 7, "empty", op)
    msg = str(e.value)
    assert "NEVER WRITTEN (rows 1..1" in msg and "READ BEFORE WRITTEN, i.e. accumulated into (rows 0..0" in msg
    assert "READ BEFORE WRITTEN (accumulated into) inside the view : rows 0..0" in msg
    assert_fully_written(atomics_into, x, idx, 7, "zeros", op)


def writes_the_poison(dtype, which):
    """A producer whose correct output is exactly one of the poisons (a NaN, 0xA5 or 0x7F bytes)."""
    def producer(x):
        out = torch.empty(3, 4, dtype=dtype, device=x.device)
        poison_(out, poisons_for(dtype)[which])   # a write like any other: the value does not depend on the buffer
        return out
    return producer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.int32, torch.uint8])
@pytest.mark.parametrize("which", [0, 1])
def test_a_producer_that_writes_a_poison_value_counts_as_written(dtype, which):
    (cov,) = assert_fully_written(writes_the_poison(dtype, which), torch.zeros(1, device=DEVICE))
    assert cov.written.all() and not cov.accumulated


def half_written_half_accumulated(x):
    out = torch.empty(8, x.shape[1], dtype=x.dtype, device=x.device)
    out[:3] = x[:3]           # written
    out[3:5] += x[3:5]        # accumulated into
    return out[:6]            # rows 5..7 never written; 6..7 outside the view


def test_partial_writers_are_reported_class_by_class():
    x = torch.randn(8, 2, device=DEVICE) + 5
    (cov,) = coverage(half_written_half_accumulated, x)
    assert cov.ranges(cov.written) == "rows 0..2 cols 0..1"
    assert cov.read_before_written_ranges("view") == "rows 3..4 cols 0..1"
    assert cov.never_written_ranges("view") == "rows 5..5 cols 0..1"
    assert cov.never_written_ranges("outside") == "rows 6..7 cols 0..1"
    assert cov.unwritten_ranges("view") == "rows 3..5 cols 0..1"   # not written: either bad class
    rep = cov.report()
    assert "unwritten inside the view : rows 5..5 cols 0..1" in rep
    assert "READ BEFORE WRITTEN (accumulated into) inside the view : rows 3..4 cols 0..1" in rep
    probs = cov.problems("view")
    assert len(probs) == 2 and "NEVER WRITTEN (rows 5..5" in probs[0] and "accumulated into (rows 3..4" in probs[1]
    with pytest.raises(AssertionError, match=r"(?s)NEVER WRITTEN \(rows 5\.\.5.*accumulated into \(rows 3\.\.4"):
        assert_fully_written(half_written_half_accumulated, x, scope="view")


def test_a_narrow_store_into_a_wide_element_is_partially_written():
    def low_bytes_only(x):
        out = torch.empty(4, dtype=torch.int32, device=x.device)
        out.view(torch.uint8)[::4] = 3     # only byte 0 of each int32
        return out

    (cov,) = coverage(low_bytes_only, torch.zeros(1, device=DEVICE))
    assert cov.partially_written.all() and not cov.accumulated and not cov.written.any()
    with pytest.raises(AssertionError, match="NEVER WRITTEN"):
        assert_fully_written(low_bytes_only, torch.zeros(1, device=DEVICE))


def test_a_nondeterministic_producer_is_not_called_accumulating():
    def noisy(x):
        out = torch.empty_like(x)
        out.copy_(torch.rand_like(x))      # every element written, but differently each run
        return out

    (cov,) = coverage(noisy, torch.zeros(5, 3, device=DEVICE))
    assert cov.nondeterministic.all() and not cov.accumulated, cov.report()
    with pytest.raises(AssertionError, match="not deterministic"):
        assert_fully_written(noisy, torch.zeros(5, 3, device=DEVICE))


def test_caller_owned_accumulator():
    buf = torch.empty(4, 3, device=DEVICE)

    def add_rows(b, x):
        b[:2] += x[:2]
        b[2:] = x[2:]

    x = torch.randn(4, 3, device=DEVICE) + 3
    (cov,) = coverage(add_rows, buf, x, out=buf)
    assert cov.read_before_written_ranges() == "rows 0..1 cols 0..2"
    assert cov.ranges(cov.written) == "rows 2..3 cols 0..2"


# --------------------------------------------------------------------------------------------------
# bounds_checked: stray addresses in the interpreter
# --------------------------------------------------------------------------------------------------

import triton  # noqa: E402  (after workbook: the interpreter switch)
import triton.language as tl  # noqa: E402

from workbook.coverage import bounds_checked  # noqa: E402
from workbook.device import ON_GPU  # noqa: E402


@triton.jit
def _copy_probe(x, y, SHIFT: tl.constexpr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, tl.load(x + o + SHIFT))


@triton.jit
def _store_probe(y, SHIFT: tl.constexpr, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o + SHIFT, o.to(tl.float32))


@pytest.mark.skipif(ON_GPU, reason="checks the interpreter's addresses (on a GPU: compute-sanitizer)")
def test_bounds_checked_catches_a_stray_load_and_a_stray_store():
    x, y = torch.randn(16), torch.empty(16)
    with bounds_checked():
        _copy_probe[(1,)](x, y, SHIFT=0, N=16)                  # in bounds: runs
        assert torch.equal(y, x)
        _store_probe[(1,)](y[:4], SHIFT=0, N=8)                 # past the view, inside its storage: fine
        # far past the end (just past it may be the next tensor's storage, which counts as inside);
        # the guard raises before the access, so nothing stray is touched (the interpreter wraps it)
        with pytest.raises(Exception, match="load of 16 elements outside every tensor argument"):
            _copy_probe[(1,)](x, y, SHIFT=1 << 20, N=16)
        with pytest.raises(Exception, match="store of 8 elements outside every tensor argument"):
            _store_probe[(1,)](torch.empty(4), SHIFT=1 << 20, N=8)
    _copy_probe[(1,)](x, y, SHIFT=0, N=16)                      # the patch is gone after the block


def test_bounds_checked_refuses_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="compute-sanitizer"):
        with bounds_checked():
            pass
