"""The audit's rules, class by class, on the small sample files of tests/audit_samples/ (written for
these tests; audited as text): out= that is not a whole write, a custom op's own words, unreachable
launches, padding provenance, complementary writes and the reverse risk, aliases/duplicate names/list
elements, where the trail is lost (low, never silent), store masks that select and autotuned grids,
suppressions with a reason, a nested function's finding reported once, arguments after a *star,
allocations in a conditional expression or a tuple unpacked into names, the workbook's own tree
auditing clean, and the reverse risk's certainty (a container kept in an attribute, writes indexed by
a loop variable, a size and its write under one test, a write through an index tensor, a kernel that
loads and stores every element after the writes; the confirmed risks, a slice's gap and a kernel that
adds into the buffer staying medium), metadata-only uses (``empty_like``, ``.shape``) that read no
element, a padded grid's wording, a launch of one program that stores a prefix of a literal size, and
a buffer returned whole whose every caller in the files reads only a slice or an index of it (low; a
caller using it whole, or none in the files, keeps the gap medium), and a buffer stored into a new
object's field by a constructor keyword or a field replacement (low: the trail is lost there), a kernel
of another compiler (numba.cuda) launched with Triton's syntax, writes under tests that leave a part
unwritten on every path (medium), module-level integer constants in sizes and bounds, a helper's write
under its own test (conditional), a call on an object that holds the buffer (the trail is lost), stores
in a loop that the program's position bounds (a band), a copy into an ``as_strided`` view (partial), and a launch through ``torch.library.wrap_triton``."""
import json
import shutil
from pathlib import Path

from workbook import audit as A

SAMPLES = Path(__file__).resolve().parent / "audit_samples"
ROOT = Path(__file__).resolve().parents[1]


def _run(*names):
    return A.audit_sources({n: (SAMPLES / n).read_text() for n in names})


def _by(res):
    return {f.function: f for f in res.findings}


def _nec(res):
    return {n["function"]: n["why"] for n in res.necessary}


def test_out_keyword_is_a_whole_write_only_where_out_means_overwrite():
    res = _run("out_keyword.py", "sample_kernels.py")
    f, nec = _by(res), _nec(res)
    assert f["torch_out"].kind == "zero-fill-then-overwrite" and f["torch_out"].confidence == "high"
    # a keyword given to a constructor or a field replacement is no write: the trail is lost there
    for fn in ("into_a_dataclass", "field_replacement"):
        assert f[fn].kind == "trail-lost" and f[fn].confidence == "low", f[fn]
        assert "constructor or field replacement" in f[fn].overwrite
    # a GEMM wrapper in the files whose kernel scatter-adds into out: the zeros are needed
    assert "gemm_with_accumulating_epilogue" not in f and "accumulate" in nec["gemm_with_accumulating_epilogue"]
    # out= of a callee not in the files is assumed (low), and says so when the call speaks of accumulating
    assert f["library_gemm"].confidence == "low" and "assumed" in f["library_gemm"].overwrite
    assert f["library_gemm_accumulate"].confidence == "low"
    assert "accumulate=True" in f["library_gemm_accumulate"].overwrite


def test_a_custom_op_is_taken_at_its_own_word():
    res = _run("custom_op_words.py")
    f, nec = _by(res), _nec(res)
    assert "combine" not in f and nec["combine"].startswith("accumulate") and "Accumulates" in nec["combine"]
    assert "quant_padded" not in f and nec["quant_padded"].startswith("partial") and "untouched" in nec["quant_padded"]
    # declared mutated, with no body to show how and no word either way: an assumption, so low
    assert f["quant"].confidence == "low" and "custom op" in f["quant"].overwrite


def test_a_launch_after_a_return_or_raise_is_not_the_writer():
    res = _run("unreachable_launch.py", "sample_kernels.py")
    f, nec = _by(res), _nec(res)
    assert "token_sums" not in f and "guarded_sum" not in f, res.report()
    assert nec["guarded_sum"].startswith("accumulate") and "add_" in nec["guarded_sum"]
    assert f["reachable"].confidence == "high" and "store_rows_kernel" in f["reachable"].overwrite
    # a fill in a branch that ends in a return: the launch after the if never runs after the fill
    assert "branch_returns_first" not in f and nec["branch_returns_first"].startswith("partial")
    # an exit in a sibling branch (else: return) does not make this branch unreachable
    assert f["else_branch_returns"].confidence == "high" and "copy_" in f["else_branch_returns"].overwrite


def test_a_refill_is_a_whole_write_and_data_dependent_stores_are_only_suspected():
    res = _run("refill_and_data_dependent.py")
    f = _by(res)
    assert "timed_with_flush" not in f and _nec(res)["timed_with_flush"].startswith("repeated fill")
    assert f["caller_fills_first"].confidence == "high" and "zero-fills it again" in f["caller_fills_first"].overwrite
    assert f["marks"].confidence == "low" and "depends on loaded values" in f["marks"].overwrite
    assert f["routed"].confidence == "low"            # stored under `if` a loaded value decides
    assert f["ignored_rows"].confidence == "low"      # ... or a flag set under such an `if` decides
    assert f["causal_blocks"].confidence == "low" and "program ids" in f["causal_blocks"].overwrite
    # a kernel that may return before its stores may leave the zeros (an ignored row's loss, say): low
    assert f["guarded"].confidence == "low" and "return early" in f["guarded"].overwrite


def test_padding_is_read_from_where_the_size_came_from():
    f = _by(_run("padding_provenance.py", "sample_kernels.py"))
    assert f["scales_by_helper"].padding and "round_up(x.shape[0], 128)" in f["scales_by_helper"].obligation
    assert f["scales_by_arithmetic"].padding and "(n + 127) // 128 * 128" in f["scales_by_arithmetic"].obligation
    assert not f["not_padded"].padding and "PADDED" not in f["not_padded"].obligation


def test_complementary_writes_and_the_reverse_risk():
    res = _run("complementary.py")
    f = _by(res)
    risks = {fn for fn, x in f.items() if x.kind == "empty-partial-write"}
    # covered: [:, 0] + [:, 1] of a dim of 2, 0::2 + 1::2, [..., :h] + [..., h:], [0] + [1:], a tuple shape,
    # three chained parts, every index of 2 * q on each branch that pins q; unread rest: returned as
    # out[:n], or dropped
    assert risks == {"column_never_written", "padded_rows_returned", "padded_rows_passed_on", "per_branch_short",
                     "index_sets"}, res.report()
    # index tensors: which part stays unwritten cannot be shown, so low and the finding says so
    assert f["index_sets"].confidence == "low" and any("cannot show" in r for r in f["index_sets"].reasons)
    risks.discard("index_sets")
    assert any("(size 4): index(es) [3, 4) never written" in r for r in f["per_branch_short"].reasons)
    assert all(f[fn].confidence == "medium" for fn in risks)
    assert any("[2, 3) never written" in r for r in f["column_never_written"].reasons)
    assert any("returned whole to the callers of padded_rows_returned()" in r for r in f["padded_rows_returned"].reasons)
    assert "returned whole" in f["padded_rows_returned"].obligation
    assert any("consumer(...)" in r for r in f["padded_rows_passed_on"].reasons)
    z = f["zeros_two_columns"]
    assert z.kind == "zero-fill-then-overwrite" and z.confidence == "high" and z.partial


def test_aliases_duplicate_names_and_list_elements():
    res = _run("names_and_launches.py", "sample_kernels.py", "sample_kernels_b.py", "sample_kernels_c.py")
    f = _by(res)
    assert f["through_alias"].confidence == "high" and "sample_kernels.py:7" in f["through_alias"].overwrite
    agree = f["name_defined_twice_agreeing"]
    assert agree.confidence == "medium" and "2 definitions" in agree.overwrite and "all agree" in agree.overwrite
    dis = f["name_defined_twice_disagreeing"]
    assert dis.kind == "trail-lost" and dis.confidence == "low"
    assert "sample_kernels.py:24: write" in dis.overwrite and "sample_kernels_b.py:7: accumulate" in dis.overwrite
    for fn in ("element_of_a_list", "element_by_constant"):
        assert f[fn].kind == "trail-lost" and "not a Triton launch" in f[fn].overwrite, f[fn]


def test_where_the_trail_is_lost_is_a_low_finding_never_a_silent_drop():
    res = _run("trail_lost.py")
    f, nec = _by(res), _nec(res)
    lost = {fn: x.overwrite for fn, x in f.items() if x.kind == "trail-lost"}
    assert set(lost) == {"through_dlpack", "through_dunder_dlpack", "Runner.run", "Runner.run_module",
                         "broadcast_from_zero", "raw_pointer", "pointer_array"}, res.report()
    assert all(f[fn].confidence == "low" for fn in lost)
    assert "DLPack" in lost["through_dlpack"] and "DLPack" in lost["through_dunder_dlpack"]
    assert "torch.compile'd" in lost["Runner.run"] and "self.step(...)" in lost["Runner.run"]
    assert "self.head(...)" in lost["Runner.run_module"]
    # a compiled callable whose function is in the files is followed into it
    assert f["CompiledFill.run"].confidence == "high" and "out.copy_" in f["CompiledFill.run"].overwrite
    assert "dist.broadcast" in lost["broadcast_from_zero"] and "data_ptr()" in lost["raw_pointer"]
    # collectives that write every element of their output are whole writes; all_reduce reads its input
    for fn in ("gather", "scatter_reduce"):
        assert f[fn].kind == "zero-fill-then-overwrite" and f[fn].confidence == "high", f[fn]
    assert nec["reduce_in_place"].startswith("accumulate") and "all_reduce" in nec["reduce_in_place"]
    assert nec["broadcast_view"].startswith("read")          # torch.broadcast_to is no collective
    # --min-confidence low shows them, the default gate (medium) does not fail on them
    assert "TRAIL LOST" in res.report("low") and not any(x.kind == "trail-lost" for x in res.at_least("medium"))


def test_suppression_needs_a_reason_and_is_shown_and_counted(tmp_path, capsys):
    res = _run("suppressions.py")
    f = _by(res)
    assert set(f) == {"no_reason", "not_suppressed"}, res.report()
    assert f["no_reason"].kind == "suppression-without-reason" and f["no_reason"].confidence == "low"
    assert "suppression without a reason" in f["no_reason"].reasons[0]
    assert f["not_suppressed"].confidence == "high"
    why = {s["function"]: s["reason"] for s in res.suppressed}
    assert why == {"demo_redundant_fill": "the redundant fill this demo times",
                   "demo_comment_above": "kept to show the cost of a memset"}
    assert "2 suppressed" in res.report()
    shutil.copy(SAMPLES / "suppressions.py", tmp_path / "suppressions.py")
    assert A.main([str(tmp_path), "--json", "--min-confidence", "low"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [s["reason"] for s in doc["suppressed"]] == ["the redundant fill this demo times",
                                                         "kept to show the cost of a memset"]
    assert doc["counts"] == {"low": 1, "medium": 0, "high": 1}


def test_a_nested_function_finding_is_reported_once_and_captures_are_uses():
    res = _run("nested.py")
    assert [f.where for f in res.findings].count("nested.py:9") == 1, res.report()
    f, nec = _by(res), _nec(res)
    assert f["outer.inner"].confidence == "high"
    assert "captured" not in f and "nested function step()" in nec["captured"]
    assert f["grid_lambda_only_reads_shape"].confidence == "high"     # the lambda reads only its shape


def test_a_mask_that_selects_and_an_autotuned_grid_do_not_claim_whole_coverage():
    res = _run("masks_and_autotuned_grids.py")
    f = {(x.function, x.variable): x for x in res.findings}
    nec = _nec(res)
    # a band scatter whose mask tests col >= 0: the kernel picks which in-bounds elements it writes
    band = f[("band_to_dense", "dense")]
    assert band.confidence == "low" and "(col >= 0) selects among in-bounds elements" in band.overwrite
    # the plain bounds guard (o < n) is still a whole write
    assert f[("bounded", "out")].confidence == "high"
    # one slot per program on a grid the autotuned BLOCK sizes: how many slots depends on the config
    part = f[("block_sums", "partial")]
    assert part.confidence == "low" and "meta['BLOCK']" in part.overwrite and "depends on the config" in part.overwrite
    # the same kernel's block-sized store follows BLOCK, and a BLOCK given at the launch fixes the grid
    assert f[("block_sums", "copy")].confidence == "high"
    assert f[("block_sums_fixed", "partial")].confidence == "high"
    # autotune's reset_to_zero names the buffer: the kernel's authors say it must start zeroed
    assert ("slot_sums", "slots") not in f and "reset_to_zero" in nec["slot_sums"]


def test_writes_under_independent_ifs_are_no_shown_gap_and_the_answer_is_stable():
    # the branch groups were once read from a set (the order of AST ids): the reported gap changed from
    # run to run; and a write under another, independent if may fill the gap, so it is not shown unwritten
    seen = set()
    for _ in range(12):
        res = _run("independent_branches.py")
        seen.add(tuple((x.kind, x.confidence, tuple(x.reasons)) for x in res.findings))
    assert len(seen) == 1, seen
    (f,) = _run("independent_branches.py").findings
    assert f.kind == "empty-partial-write" and f.confidence == "low"
    assert "row[width] under another, independent if may write it" in f.reasons[1]


def test_a_scratch_kept_in_an_attribute_loses_the_trail_and_an_alias_of_a_written_slice_reads_it():
    res = _run("scratch_and_slice_alias.py")
    f = {(x.function, x.variable): x for x in res.findings}
    # decode scratch with headroom, kept in self.scores: its readers are not followed, so low, and said
    scratch = f[("Decoder.step", "self.scores")]
    assert scratch.kind == "empty-partial-write" and scratch.confidence == "low"
    assert any(r.startswith("the trail is lost at self.scores") for r in scratch.reasons)
    # joint = full[:, prefix_len:] is the written slice: the prefix rows are never read
    assert ("tail_of_prefix", "full") not in f, res.report("low")
    # padded heads returned whole: the tail [q.shape[1], heads) is shown unwritten (medium)
    assert f[("padded_heads", "out")].confidence == "medium"
    # a view of the written prefix of a PADDED buffer is no proof: a kernel may read the padding
    assert f[("aligned_scales", "aligned")].confidence == "medium"


def test_a_buffer_allocated_on_the_first_pass_of_a_loop_is_written_in_the_loop():
    res = _run("allocated_once_in_a_loop.py")
    f = {(x.function, x.variable): x for x in res.findings}
    # if ids is None: ids = empty(...); ids[start:end] = b on every pass: the slices fill it, no reverse risk
    assert ("concatenate", "ids") not in f, res.report("low")
    assert ("first_index", "out") not in f, res.report("low")          # if i == 0: allocated once too
    assert ("two_tables", "sin") not in f and ("two_tables", "cos") not in f   # if cos is None: both
    # allocated on every pass (under an if that is no first-pass test) and written once in it: the tail
    # [width, width + 4) is still shown unwritten
    assert f[("last_window", "win")].confidence == "medium" and f[("per_pass", "win")].confidence == "medium"


def test_a_bound_that_sorts_a_negative_term_first_is_still_a_bound():
    res = _run("remainder_slices.py")
    f = {(x.function, x.variable): x for x in res.findings}
    # full = n - n % block: out[:full] + out[full:] cover out (once the sum's text began with '-')
    assert ("dequant_with_tail", "out") not in f, res.report("low")
    # a bound written negative counts from the end: not read, so the audit cannot show coverage (low)
    assert f[("last_from_end", "out")].confidence == "low"


def test_the_workbook_tree_audits_clean_with_its_demos_marked():
    res = A.audit([str(ROOT / "workbook"), str(ROOT / "kernels")])
    assert res.at_least("low") == [], res.report("low")
    sup = {(s["file"].rsplit("/", 1)[-1], s["function"]): s for s in res.suppressed}
    assert ("gdn.py", "z_handoff_zero_then_copy") in sup and ("alloc.py", "stale_bytes_demo.step") in sup
    # notebook 06's decoder: the rows past num_tokens go back to an unknown consumer; the reason (SPECS 8) is marked
    att = sup[("fusion.py", "MiniDecoder._attention")]
    assert att["kind"] == "empty-partial-write" and att["reason"]
    assert any("returned whole to the callers of MiniDecoder._attention()" in r for r in att["reasons"])


def test_arguments_after_a_star_map_only_where_the_star_length_is_shown():
    res = _run("starred_launch_args.py")
    f, nec = {(x.function, x.variable): x for x in res.findings}, _nec(res)
    # *strides from the caller: out and sums land on parameters not known; once `sums` (added into by
    # the kernel) was read as the store-only `out`, a false high
    for var in ("out", "sums"):
        lost = f[("strides_of_unknown_length", var)]
        assert lost.kind == "trail-lost" and lost.confidence == "low", lost
        assert "after *strides (line 31)" in lost.overwrite and "not known statically" in lost.overwrite
    lost = f[("strides_of_an_unshown_tensor", "out")]
    assert lost.kind == "trail-lost" and "after *x.stride()" in lost.overwrite
    # a literal tuple, and the strides of a tensor unpacked as m, n = x.shape: the positions are known
    assert f[("strides_in_a_literal", "out")].confidence == "high"
    assert "param 'out'" in f[("strides_in_a_literal", "out")].overwrite
    assert ("strides_in_a_literal", "sums") not in f and "param 'sums'" in nec["strides_in_a_literal"]
    shown = f[("strides_of_a_shown_matrix", "out")]
    assert shown.confidence == "high" and "matrix_copy_kernel" in shown.overwrite and "param 'out'" in shown.overwrite
    # a Python function of the files: the same rule
    helper = f[("helper_after_a_star", "out")]
    assert helper.kind == "trail-lost" and "after *shape" in helper.overwrite
    # keywords after the star still map by name
    assert f[("keywords_after_a_star", "out")].confidence == "high"
    assert ("keywords_after_a_star", "sums") not in f and "accumulate" in nec["keywords_after_a_star"]


def test_allocations_in_a_conditional_expression_are_judged_at_most_medium():
    res = _run("conditional_and_unpacked.py")
    f, nec = {(x.function, x.variable): x for x in res.findings}, _nec(res)
    both = f[("out_or_fresh", "out")]                # zeros_like(q) if out is None else out.zero_()
    assert both.kind == "zero-fill-then-overwrite" and both.confidence == "medium"
    assert "torch.zeros_like" in both.pattern and "out.zero_()" in both.pattern
    assert any(r.startswith("a conditional allocation") and "both branches" in r for r in both.reasons)
    given = f[("fresh_or_given", "out")]
    assert given.confidence == "medium" and any("caller's buffer" in r for r in given.reasons)
    assert ("conditional_accumulator", "acc") not in f and nec["conditional_accumulator"].startswith("accumulate")
    half = f[("conditional_empty_half_written", "y")]
    assert half.kind == "empty-partial-write" and any("a conditional allocation" in r for r in half.reasons)
    # a zero fill inside a branch, not the branch itself: not followed, so a low trail-lost, never silent
    lost = f[("conditional_fill_not_followed", "out")]
    assert lost.kind == "trail-lost" and lost.confidence == "low" and ".to(q.device)" in lost.overwrite


def test_allocations_unpacked_from_a_tuple_are_judged_one_by_one():
    res = _run("conditional_and_unpacked.py")
    f, nec = {(x.function, x.variable): x for x in res.findings}, _nec(res)
    assert f[("unpacked_pair", "a")].confidence == "high" and "a.copy_" in f[("unpacked_pair", "a")].overwrite
    assert ("unpacked_pair", "b") not in f and "b += ..." in nec["unpacked_pair"]
    dq = f[("unpacked_triple", "dq")]
    assert dq.confidence == "high" and "copy_rows_kernel" in dq.overwrite
    dk = f[("unpacked_triple", "dk")]            # its own shape (2 * n rows), written on [0, n)
    assert dk.kind == "empty-partial-write" and dk.confidence == "medium"
    assert any("[n, 2*n) is not shown written" in r for r in dk.reasons)
    assert ("unpacked_triple", "dv") not in f
    assert any(n["variable"] == "dv" and "index_add_" in n["why"] for n in res.necessary)
    # a target that is no name loses the trail (low); the name next to it is still followed
    assert f[("unpacked_into_a_subscript", "cache[0]")].kind == "trail-lost"
    assert f[("unpacked_into_a_subscript", "b")].confidence == "high"
    # a call returning a tuple is no allocation of the audit's
    assert not any(x.function == "returned_by_a_call" for x in res.findings)


def test_a_buffer_stored_into_a_container_that_outlives_the_function_loses_the_trail():
    # out of sample: k_buf[:, :kv_len] written, then ctx.kv_caches[layer_id] = [k_buf, v_buf, kv_len]; every
    # reader took only [:, :kv_len]. A container in an attribute or at module level is read by code not
    # followed, as a buffer kept in an attribute is: low, and the finding says where (was medium)
    res = _run("kept_in_a_container.py")
    f = {(x.function, x.variable): x for x in res.findings}
    kept = {("prefill_into_a_class_table", "k_buf"): "CacheContext.caches[layer_id]",
            ("prefill_into_a_class_table", "v_buf"): "CacheContext.caches[layer_id]",
            ("PagedStore.fill_slot", "keys"): "self.pages[slot]", ("PagedStore.fill_named", "keys"): "self._store['k']",
            ("PagedStore.fill_entry", "keys"): "self.entry", ("PagedStore.fill_appended", "keys"): "self.entries",
            ("fill_module_table", "keys"): "_TABLES[key]"}
    for key, place in kept.items():
        x = f[key]
        assert x.kind == "empty-partial-write" and x.confidence == "low", (key, x)
        assert any(r.startswith(f"the trail is lost at {place}:") for r in x.reasons), (key, x.reasons)
    # a local tuple that is returned is still handed to a consumer the function cannot see
    assert f[("returned_in_a_local_tuple", "keys")].confidence == "medium"


def test_writes_indexed_by_a_loop_variable_may_cover_the_rest():
    # out of sample: out[:, 0] then out[:, i + 1] for i in range(s) (a read of out[:, i] first in the
    # loop) was reported as "[1, s + 1) not shown written" (medium); the loop's passes cover it
    res = _run("loop_indexed_writes.py")
    f = {(x.function, x.variable): x for x in res.findings}
    assert ("draft_columns", "out") not in f, res.report("low")
    assert ("tiles_after_a_head", "out") not in f, res.report("low")     # [1 + i*k : 1 + (i+1)*k] tiles
    unbound = f[("while_filled", "out")]                # a while loop: its passes are not bounded
    assert unbound.confidence == "low"
    assert any("written under a loop at line 32 with an index the audit does not bound" in r for r in unbound.reasons)
    short = f[("columns_one_short", "out")]             # read, and one column short, but still a loop: low
    assert short.confidence == "low" and any("written in the loop at line 41" in r for r in short.reasons)
    assert ("rows_only_in_a_loop", "out") not in f      # written only in a loop: not reported, as before


def test_a_size_picked_by_a_test_and_writes_under_a_condition_are_no_proven_gap():
    # out of sample: vp = empty(..., 1 if offset >= 0 else 0); if offset >= 0: vp[..., 0] = ... is written
    # whole or empty (was medium)
    res = _run("conditional_sizes.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn in ("optional_column", "optional_column_inline", "optional_rows"):
        assert not any(k[0] == fn for k in f), res.report("low")
    # any other write under a condition (its size cap a name, which the test may make what is written), a
    # bound chosen by one, a size one side of a test covers: low
    under = f[("prefix_under_a_test", "out")]
    assert under.confidence == "low" and any("written under a condition (if n < cap, line 33)" in r for r in under.reasons)
    chosen = f[("prefix_by_a_conditional_expression", "out")]
    assert chosen.confidence == "low" and any("is a conditional expression" in r for r in chosen.reasons)
    tail = f[("optional_tail", "out")]
    assert tail.confidence == "low" and any("chosen by a test (n + 1 if extra else n: extra)" in r for r in tail.reasons)


def test_the_confirmed_reverse_risks_stay_medium():
    # padded heads and their sinks, an input padded to the weight's width, a tier no side of whose test
    # covers the heads: every write straight-line, a part provably unwritten, a consumer not seen
    res = _run("kept_true_risks.py")
    got = sorted((x.function, x.variable, x.kind, x.confidence) for x in res.findings)
    assert got == sorted([("pad_heads_to_tier", "padded", "empty-partial-write", "medium")] * 2 + [
        ("pad_heads_to_tier", "padded_sinks", "empty-partial-write", "medium"),
        ("PaddedLinear.forward", "wide", "empty-partial-write", "medium"),
        ("PaddedLinear.forward_direct", "wide", "empty-partial-write", "medium"),
        ("heads_to_a_chosen_tier", "out", "empty-partial-write", "medium")]), res.report("low")
    assert not any("the gap is not proven" in r for x in res.findings for r in x.reasons)


def test_a_store_that_starts_past_index_0_does_not_claim_whole_coverage():
    # out of sample (8th check): a prefix sum stored at [1, n] (a loop from 1), a scan stored at
    # out + 1 + offs, a base moved one stride on: index 0 keeps its zero, which the consumer reads
    res = _run("stores_shifted_from_zero.py")
    f = {(x.function, x.variable): x for x in res.findings}
    loop = f[("segment_starts", "starts")]
    assert loop.confidence == "low" and "index 0 is never stored" in loop.overwrite and "runs i from 1" in loop.overwrite
    scan = f[("exclusive_scan", "out")]
    assert scan.confidence == "low" and "index 0 is never stored and keeps what was there" in scan.overwrite
    col = f[("row_counts", "y")]
    assert col.confidence == "low" and "index 0 along stride stride_col is never stored" in col.overwrite
    # a second store of index 0 in the same kernel: every element written, still high
    assert f[("exclusive_scan_with_head", "out")].confidence == "high"


def test_a_store_along_a_diagonal_does_not_claim_whole_coverage():
    # out of sample (8th check): a vector put on a square matrix's diagonal, i * (n + 1), or
    # row * size + col with col = row + k in either branch of an if: the zeros off it are the result
    res = _run("stores_on_a_diagonal.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn in ("to_diagonal", "to_offset_diagonal"):
        assert f[(fn, "m")].confidence == "low", res.report("low")
        assert "only a diagonal is stored, the elements off it keep what was there" in f[(fn, "m")].overwrite
    # a row stride of n + 1 filled by the arange, and a 2-D tile, are whole writes
    assert f[("padded_rows", "out")].confidence == "high"
    assert f[("tiled_copy", "out")].confidence == "high"


def test_a_program_id_added_to_an_arange_does_not_claim_whole_coverage():
    # out of sample (8th check): cols = pid_n + arange(BN), not pid_n * BN + arange(BN): the tail of a
    # row longer than a block is never stored
    res = _run("stores_at_program_id_plus_arange.py")
    f = {(x.function, x.variable): x for x in res.findings}
    bad = f[("dim_offsets", "out")]
    assert bad.confidence == "low" and "past the last program's block keep what was there" in bad.overwrite
    assert "adds program id pid_n" in bad.overwrite, bad.overwrite


def test_a_block_offset_and_a_grid_stride_loop_stay_whole_writes():
    # the guard: pid * BLOCK + tl.arange(0, BLOCK) (1-D, or each axis of a 2-D tile) and a grid-stride
    # loop from pid * BLOCK reach every element: high, with no offset note
    res = _run("stores_at_program_id_plus_arange.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn in ("dim_offsets_fixed", "block_copy", "grid_stride_copy"):
        assert f[(fn, "out")].confidence == "high", res.report("low")
        assert "stores only)" in f[(fn, "out")].overwrite


def test_a_write_through_an_index_tensor_leaves_no_proven_gap():
    # out of sample (9th check, aiter): kperm = empty(64); kperm[tau64] = s with tau64 a permutation of
    # 0..63 writes every element, yet was "[0, 64) never written" (medium). An index that is not a slice
    # nor a constant (x[idx], x[idx, :], x[mask]) and index_copy_/scatter_ may write any part: low,
    # naming the write
    res = _run("writes_through_an_index_tensor.py")
    f = {(x.function, x.variable): x for x in res.findings}
    through = {("inverse_permutation", "kperm"): "kperm[tau] = s (line 14) writes through the index tau",
               ("rows_picked_by_an_index", "out"): "out[idx, :] = x (line 20) writes through the index idx",
               ("prefix_then_a_mask", "out"): "out[mask] = 0 (line 27) writes through the index mask",
               ("head_then_index_copy", "out"): "out.index_copy_(0, idx, x) (line 34) writes with index_copy_",
               ("head_then_scatter", "out"): "out.scatter_(0, idx, x) (line 41) writes with scatter_"}
    for key, write in through.items():
        x = f[key]
        assert x.kind == "empty-partial-write" and x.confidence == "low", (key, res.report("low"))
        assert any(r.startswith(f"the gap is not proven: {write}") and "cannot bound which part it covers" in r
                   for r in x.reasons), (key, x.reasons)
    # no proof of a whole write either: the zero fill under a permutation stays necessary, never high
    assert not any(x.function == "zeros_then_a_permutation" for x in res.findings), res.report("low")
    assert "zeros_then_a_permutation" in _nec(res)


def test_a_slice_or_constant_index_gap_stays_medium():
    # the guard: out[:n] = ... of a 64-row buffer returned whole, and rows 0 and 1 of 3, are proven gaps
    res = _run("writes_through_an_index_tensor.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn in ("prefix_of_a_fixed_buffer", "two_constant_rows"):
        x = f[(fn, "out")]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", res.report("low")
        assert not any("the gap is not proven" in r for r in x.reasons), x.reasons
    assert "index(es) [2, 3) never written" in " ".join(f[("two_constant_rows", "out")].reasons)


def test_a_padded_buffer_written_over_the_real_rows_only_is_not_high():
    # out of sample (9th check): scales in super-blocks of 32 rows, (M + 31) // 32 of them, pre-zeroed
    # on purpose, written by a kernel whose grid is the M real rows: the padding rows keep their zeros
    res = _run("padded_rows_past_the_grid.py")
    f = _by(res)
    for fn, dim in (("scales_in_super_blocks", "n_super = (M + 31) // 32"), ("scales_rounded_by_cdiv", "triton.cdiv(M, 32)"),
                    ("scales_rounded_by_negation", "rows = -(-M // 32) * 32"), ("scales_rounded_by_ceil", "math.ceil(M / 32)")):
        x = f[fn]
        assert x.kind == "zero-fill-then-overwrite" and x.confidence == "low", res.report("low")
        assert x.padding, fn
        why = " ".join(x.reasons)
        assert "dimension 0 is padded" in why and dim in why and "rounds M up" in why, why
        assert "bounded by the real count" in why, why


def test_a_padded_buffer_whose_grid_covers_the_padding_stays_high():
    # the guard: the grid runs over the rounded rows (or the rounded count of blocks), and the kernel
    # stores there itself: every element is written
    f = _by(_run("padded_rows_past_the_grid.py"))
    for fn in ("scales_padding_written", "scales_padding_written_by_blocks"):
        assert f[fn].confidence == "high" and f[fn].padding, fn
        assert not any("is padded" in r for r in f[fn].reasons), f[fn].reasons


def test_a_kernel_that_loads_and_stores_every_element_leaves_no_proven_gap():
    # out of sample (10th check, vllm-ascend minimax_m3 :866): topk_idx = empty(h, n, topk) written on
    # [..., :k], then a kernel that loads every slot and stores tl.where(valid, idx, -1) into every slot,
    # then returned, was a medium reverse risk (read as adding into the gap). Its stores reach every
    # element, so the gap the return hands on is not proven: low, naming the kernel and the line
    res = _run("rmw_launch_after_partial_writes.py")
    x = {(f.function, f.variable): f for f in res.findings}[("masked_topk", "out")]
    assert x.kind == "empty-partial-write" and x.confidence == "low", res.report("low")
    why = " ".join(x.reasons)
    assert "the gap is not proven: Triton launch mask_invalid_slots (line 30) loads and stores param 'ti_ptr'" in why
    assert "its stores reach every element" in why and "depends on its arithmetic" in why, why
    # the same launch in a function of the files the buffer is passed to
    x = {(f.function, f.variable): f for f in res.findings}[("masked_topk_through_a_helper", "out")]
    assert x.confidence == "low", res.report("low")
    assert any(r.startswith("the gap is not proven: Triton launch mask_invalid_slots (") and "in mask_slots_of()" in r
               for r in x.reasons), x.reasons


def test_an_accumulating_kernel_keeps_the_gap_proven():
    # the guard: an atomic_add, a load + add + store bounded by the partial write's own bound (offs < n
    # after out[:n]), and stores at rows a loaded value picks do not write the gap: medium stays
    res = _run("rmw_launch_after_partial_writes.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn in ("head_then_atomic_add", "prefix_then_add_over_it", "head_then_add_at_loaded_rows",
               "prefix_then_add_through_a_helper"):
        x = f[(fn, "out")]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, res.report("low"))
        assert not any("the gap is not proven" in r for r in x.reasons), x.reasons


def test_a_metadata_only_use_is_no_reader_of_the_buffer():
    # out of sample (11th check, Triton-distributed test_ep_a2a.py:149): padded_indices = empty([M, topk])
    # written on [:n], then [torch.empty_like(padded_indices) for ...]: a medium reverse risk whose
    # "reader" was empty_like. *_like(x), x.shape, x.size(0), x.new_empty(..), len(x) ... read no element
    res = _run("metadata_only_uses.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn in ("prefix_then_empty_like", "prefix_then_every_metadata_use"):
        assert (fn, "out") not in f, (fn, res.report("low"))
    # a zero fill whose first real use (after empty_like, numel, size, len, new_zeros) overwrites it
    x = f[("zeros_then_metadata_then_copy", "buf")]
    assert x.kind == "zero-fill-then-overwrite" and x.confidence == "high", res.report("low")
    assert x.reasons == ["first use after the fill overwrites it (line 37)"], x.reasons


def test_a_real_read_after_a_metadata_use_still_counts():
    # the guard: a sum, an addition, a return, a callee not in the files after the metadata uses
    res = _run("metadata_only_uses.py")
    f = {(x.function, x.variable): x for x in res.findings}
    for fn, who in (("prefix_then_empty_like_then_sum", "read by out.sum(...) (line 45)"),
                    ("prefix_then_empty_like_then_add", "read by out + 1 (line 52)"),
                    ("prefix_then_shape_then_return", "returned whole to the callers of")):
        x = f[(fn, "out")]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, res.report("low"))
        assert any(r.startswith(f"the buffer is then used beyond them: {who}") for r in x.reasons), x.reasons
    assert _nec(res)["zeros_then_metadata_then_sum"] == "read: buf.sum(...) (line 66)"
    x = f[("zeros_then_metadata_then_unknown_callee", "buf")]
    assert x.kind == "trail-lost" and x.confidence == "low", res.report("low")
    assert "fill_from_somewhere(...)" in x.reasons[0], x.reasons


def test_a_grid_that_names_no_count_is_not_called_bounded_by_the_real_count():
    # out of sample (11th check, Triton-distributed): a padded block table written on a persistent grid
    # (num_sms,) was "bounded by the real count": the grid names no count, it is only not shown to reach
    # the rounded size. A grid of the real rows (M,) keeps the old wording (the guard)
    f = _by(_run("padded_rows_on_a_persistent_grid.py"))
    x = f["block_table_on_sms"]
    assert x.kind == "zero-fill-then-overwrite" and x.confidence == "low" and x.padding, x.reasons
    why = " ".join(x.reasons)
    assert "the launch's grid (grid = (num_sms,)) is not shown to reach the rounded size" in why, why
    assert "bounded by the real count" not in why, why
    x = f["block_table_on_real_rows"]
    assert x.confidence == "low", x.reasons
    assert "the launch's grid ((M,)) is bounded by the real count, not shown to reach the rounded size" \
        in " ".join(x.reasons), x.reasons


def test_one_program_storing_a_prefix_does_not_claim_the_whole_buffer():
    # out of sample (11th check, Triton-distributed test_compile_aot.py:167): B = zeros(128) written by a
    # launch of one program whose only store is B + tl.arange(0, 64) was high: [64, 128) keep their zeros
    f = _by(_run("one_program_stores_a_prefix.py"))
    for fn, grid in (("one_program_stores_half", "(1,)"), ("one_program_stores_half_positionally", "grid = (1, 1, 1)")):
        x = f[fn]
        assert x.kind == "zero-fill-then-overwrite" and x.confidence == "low", (fn, x.reasons)
        why = " ".join(x.reasons)
        assert f"the launch's grid ({grid}) is one program and every store of param 'B' reaches at most 64 " \
               "elements (its store address (B + tl.arange(0, 64))" in why, why
        assert "while B holds 128 (torch.zeros(128, ...)): elements [64, 128) keep their zeros" in why, why


def test_one_program_storing_the_whole_buffer_stays_high():
    # the guards: the same kernel on a buffer of 64, one program storing both halves of 128, and a block
    # offset over a grid of two programs write every element
    f = _by(_run("one_program_stores_a_prefix.py"))
    for fn in ("one_program_stores_all_64", "one_program_stores_all_128", "blocks_over_the_grid"):
        assert f[fn].confidence == "high", (fn, f[fn].reasons)
        assert not any("is one program" in r for r in f[fn].reasons), f[fn].reasons


def test_a_gap_every_caller_reads_only_in_part_is_not_proven():
    # out of sample (10th check, gpt-fast eval.py:75; 9th, aiter mxfp6_fmha_pack.py:663): the buffer is
    # returned whole, but every caller in the files reads it through index_select, a slice or narrow
    res = _run("returned_to_callers_that_read_a_part.py")
    f = _by(res)
    for fn, var, callers in (("padded_prompt", "empty", ("prefill_logits", "record_prompt", "seq.index_select(0, pos)",
                                                         "seq[:n]", "seq.narrow(0, 0, n)")),
                             ("scales_with_slack", "sbuf", ("scale_view", "raw[:b * sk * h * 4]"))):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.variable == var and x.confidence == "low", res.report("low")
        why = " ".join(x.reasons)
        assert "the gap is not proven" in why and "only through slices, indexes" in why, why
        assert "callers outside the files given are not seen" in why, why
        for c in callers:
            assert c in why, (c, why)
    assert "element 0 of the returned tuple" in " ".join(f["padded_prompt"].reasons)


def test_a_gap_a_caller_uses_whole_or_no_caller_sees_stays_medium():
    # the guard: one caller sums the whole buffer, one passes it whole to a function, and one helper has
    # no caller in the files: the gap stays proven
    f = _by(_run("returned_to_callers_that_read_a_part.py"))
    for fn in ("padded_tokens", "padded_ids", "padded_rows"):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert not any("the gap is not proven" in r for r in x.reasons), x.reasons


def test_a_buffer_stored_into_an_object_field_loses_the_trail():
    # out of sample (14th check, S-LoRA infer_batch.py:155): slot columns [0, longest - 1) copied, then
    # the table handed to the batch object's constructor (InferBatch(..., nopad_b_loc=...)); every
    # reader of that field takes only columns the decode steps have filled. A constructor keyword or a
    # field replacement keeps the buffer in an object's field, as an attribute does: low, naming it (was medium)
    f = _by(_run("stored_into_an_object_field.py"))
    for fn, place in (("shrink_batch", "SlotBatch(...).slots"), ("regrow_batch", "dataclasses.replace(...).slots")):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "low", (fn, x.reasons)
        assert any(r.startswith(f"the trail is lost at {place}:") for r in x.reasons), (fn, x.reasons)
    # the guard: handed to a function the files do not define, or returned whole, the gap stays medium
    for fn in ("shrink_and_hand_on", "shrink_and_return"):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert not any(r.startswith("the trail is lost at") for r in x.reasons), (fn, x.reasons)


def test_a_whole_return_under_a_flag_no_call_sets_leaves_no_proven_gap():
    # out of sample (9th check, aiter mxfp6_fmha_pack.py:663; still medium after the 14th): 64 slack
    # bytes after a copied prefix, the buffer returned whole only under `if return_raw:`, a flag that
    # defaults to False and that no call in the files sets (one caller forwards its own such flag, whose
    # caller leaves it out); elsewhere only the written prefix leaves. The whole return is not shown to
    # run: low, naming the calls (was medium)
    f = _by(_run("whole_return_under_an_unset_flag.py"))
    x = f["pad_rows"]
    assert x.kind == "empty-partial-write" and x.confidence == "low", x.reasons
    why = next(r for r in x.reasons if r.startswith("the gap is not proven:"))
    assert "the whole return (line 16) runs only when return_raw is true" in why, why
    assert "forward_step (whole_return_under_an_unset_flag.py:26): not given" in why, why
    assert "quantise_and_pad (whole_return_under_an_unset_flag.py:22): its own return_raw" in why, why
    # the guard: a caller that sets the flag, or the whole buffer handed on after the flag's if: medium
    for fn in ("pad_cols", "pad_then_hand_on"):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert not any("the gap is not proven" in r for r in x.reasons), (fn, x.reasons)


def test_all_gathered_copies_read_only_in_part_leave_no_proven_gap():
    # out of sample (11th check, Triton-distributed test_ep_a2a.py:149 and :182; still medium after the
    # 14th): an index buffer of max rows written on [:n] and all-gathered into a list made in the
    # function, each gathered copy then read only as t[:lens[i]]. all_gather copies the buffer into that
    # list, whose every later use reads a part: low, naming the reads (was medium, the collective taken
    # for a consumer the function cannot see)
    f = _by(_run("all_gathered_then_sliced.py"))
    for fn, line, read in (("gather_rows", 15, "t[:lens[r]]"), ("gather_rows_in_a_loop", 23, "c[:lens[0]]")):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "low", (fn, x.reasons)
        why = next(r for r in x.reasons if r.startswith("the gap is not proven:"))
        assert f"dist.all_gather(...) (line {line}) copies it into the elements of copies" in why, why
        assert read in why, why
    # the guard: the copies concatenated whole, or an output list the caller gave: medium
    for fn in ("gather_rows_whole", "gather_rows_into"):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert not any("the gap is not proven" in r for r in x.reasons), (fn, x.reasons)


def test_a_kernel_that_overwrites_what_it_loads_under_a_select_leaves_no_proven_gap():
    # out of sample (10th check, vllm-ascend msa_m3_triton_a5.py:740; still medium after the 14th): a
    # top-k index written on [..., :k], then a kernel that may return early, loads each slot of a row that
    # a loaded start picks and stores tl.where(valid, idx, -1) there. Its stores are not shown to reach
    # every element (loaded rows, an early return), so the rule of 342b5a7 kept the gap and read the launch
    # as adding into it; but it loads the buffer only where it stores, and what it stores is a select
    # between the loaded value and a fresh one at places the written part does not bound: a conditional
    # overwrite, the gap neither shown unwritten nor shown read. Low, naming the select (was medium)
    f = _by(_run("conditional_overwrite_launch.py"))
    x = f["top_slots"]
    assert x.kind == "empty-partial-write" and x.confidence == "low", x.reasons
    why = next(r for r in x.reasons if r.startswith("the gap is not proven:"))
    assert "Triton launch drop_stale_slots (line 36) loads param 'slot_ptr'" in why, why
    assert "only where it stores it" in why and "tl.where((cols < limit) & (got >= 0), got, -1)" in why, why
    # the guard: the select bounded by the written part's bound (cols < used, used = k), and a select
    # whose both sides keep the loaded value (got + 1, got - 1): medium
    for fn in ("top_slots_prefix_only", "top_slots_bumped"):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert not any("the gap is not proven" in r for r in x.reasons), (fn, x.reasons)
    # and the accumulating kernels of the 10th check's sample (an add at loaded rows, atomics) stay medium
    g = {(y.function, y.variable): y for y in _run("rmw_launch_after_partial_writes.py").findings}
    for fn in ("head_then_atomic_add", "head_then_add_at_loaded_rows"):
        assert g[(fn, "out")].confidence == "medium", (fn, g[(fn, "out")].reasons)


def test_a_kernel_of_another_compiler_is_not_read_as_triton():
    # out of sample (15th check, NeMo spec_aug_numba.py:262): a numba.cuda kernel launched as kernel[grid](...)
    # was read as a Triton kernel, and an array it reads by subscript was called an unused param. Now a
    # def under cuda.jit / numba.cuda.jit is no Triton kernel: the trail is lost at the launch (low), and the
    # finding says why; the Triton kernel beside it is still followed (its whole store: a high zero fill)
    f = _by(_run("other_compilers_kernels.py"))
    for fn in ("numba_band_mask", "numba_band_mask_dotted"):
        x = f[fn]
        assert x.confidence == "low" and "unused" not in x.overwrite, (fn, x.overwrite)
        assert "not a Triton launch" in x.overwrite and "numba.cuda" in x.overwrite, (fn, x.overwrite)
    assert f["triton_rows"].kind == "zero-fill-then-overwrite" and f["triton_rows"].confidence == "high"


def test_writes_under_conditions_that_leave_a_gap_on_every_path_are_a_proven_gap():
    # out of sample (15th check, accelerate utils/operations.py:565): a 2**20-element buffer whose prefix is
    # written only under `if tensor is not None`, then reduced whole, was low ("written under a condition").
    # The union of every write, as if each test held, still leaves a part unwritten: unwritten on every
    # path, so medium, where that dimension's size is a constant. Guards: conditional writes that together
    # cover the buffer (one per branch, or one whole write under a test), and a size that is a call
    # (15th check, CUTLASS red.py:208: two cells written, the size a function of the dtype that is at most
    # two) stay low, naming the condition
    f = _by(_run("conditional_writes_leaving_a_gap.py"))
    for fn in ("shape_into_a_fixed_buffer", "rows_of_a_fixed_table_under_a_test"):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert not any("the gap is not proven" in r for r in x.reasons), (fn, x.reasons)
    for fn in ("one_half_per_branch", "whole_under_a_test", "cells_of_a_size_from_a_call"):
        x = f.get(fn)
        assert x is None or x.confidence == "low" and any("written under a condition" in r for r in x.reasons), \
            (fn, x and x.reasons)


def test_a_module_level_constant_is_a_size_and_a_bound():
    # out of sample (16th check, ExecuTorch extension/llm/export/gguf.py:231): q = torch.empty(n, QK_K)
    # with QK_K = 256 a module-level constant, its columns written in eight slices up to 256, was a
    # medium reverse risk: names were resolved only where the function assigns them, so [256, QK_K)
    # looked unwritten (and the ends, sorted as text, named it [96, QK_K)). Now a name the module assigns
    # once, to an integer constant expression, is that integer. Guards: a constant past what is written
    # keeps the gap medium; a name assigned twice, assigned again in a function, or hidden by a parameter
    # stays a name, and the gap names the last end reached, numerically
    f = _by(_run("module_level_constants.py"))
    assert "blocks_of_a_module_width" not in f, f["blocks_of_a_module_width"].reasons
    x = f["blocks_short_of_a_wider_constant"]
    assert x.kind == "empty-partial-write" and x.confidence == "medium", x.reasons
    assert any("[256, 320)" in r for r in x.reasons), x.reasons
    for fn, name in (("blocks_of_a_width_assigned_twice", "TUNED"), ("blocks_of_a_width_a_function_reassigns", "LATE"),
                     ("blocks_of_a_width_given_as_a_parameter", "COLUMNS")):
        x = f[fn]
        assert x.kind == "empty-partial-write" and x.confidence == "medium", (fn, x.reasons)
        assert any(f"[256, {name})" in r for r in x.reasons), (fn, x.reasons)


def test_a_conditional_write_inside_a_helper_stays_conditional():
    # out of sample (16th check, ExecuTorch test_dynamic_shape_export.py:1006/1007): zeros handed to a
    # helper that zero-fills them again only under `if not initialized` were high: the helper's write was
    # followed, but the caller's use lost its "under a condition" mark. Where the flag is set the zeros
    # are the contents. Now the write through the helper is conditional, low as the same `if` inline is.
    # Guards: a helper that writes unconditionally, or on every branch of an if/elif/else (rtp-llm
    # trtllm_gen_test.py's _run_kernel, 10th check: true highs), stays a high overwrite
    f = _by(_run("conditional_write_in_a_helper.py"))
    for fn in ("cache_zeroed_by_a_helper_under_a_flag", "cache_loaded_by_a_helper_under_a_flag"):
        x = f[fn]
        assert x.kind == "zero-fill-then-overwrite" and x.confidence == "low", (fn, x.reasons)
        assert any("under a condition" in r for r in x.reasons), (fn, x.reasons)
    for fn in ("cache_loaded_by_a_helper_always", "cache_loaded_by_a_helper_on_every_branch"):
        x = f[fn]
        assert x.kind == "zero-fill-then-overwrite" and x.confidence == "high", (fn, x.reasons)


def test_a_call_on_an_object_holding_the_buffer_may_read_it():
    # out of sample (16th check, SpecForge test_domino_model.py:272): model.prefix_gru.weight_ih_l0.zero_(),
    # then model._sample_draft_tokens(...), which reads that weight, then copy_ restores it, was high: only
    # the exact dotted name was a use. Now a call on an object that holds the buffer (model, model.head), the
    # holder called, or passed to a call, before the overwrite is a use the audit does not follow: the trail
    # is lost there (low, naming the call), as at any call it cannot see, when an overwrite follows. Guards:
    # another object's method, a sibling attribute's write and isinstance(model, ...) keep the overwrite
    # high; a read after the call still makes the fill needed
    f = _by(_run("read_through_the_holder.py"))
    for fn, call in (("probe_with_a_zeroed_weight", "model.sample(x)"), ("probe_by_calling_the_submodule", "model.head(x)"),
                     ("probe_by_passing_the_model", "evaluate(model, x)")):
        x = f[fn]
        assert x.confidence == "low" and call in x.overwrite and "model.head.weight" in x.overwrite, (fn, x.overwrite)
    for fn in ("reset_beside_another_object", "reset_beside_a_sibling_attribute", "reset_after_a_type_check"):
        x = f[fn]
        assert x.kind == "zero-fill-then-overwrite" and x.confidence == "high", (fn, x.reasons)
    # a read after such a call decides as before: the fill is needed (no finding); so does a fill again
    # (rtp-llm test_mega_moe_stale_buffer.py:152, 10th check: a reset, judged necessary)
    nec = _nec(_run("read_through_the_holder.py"))
    for fn in ("zeroed_read_after_a_call", "zeroed_again_after_a_call"):
        assert fn not in f and fn in nec, (fn, f.get(fn) and f[fn].overwrite)


def test_stores_bounded_by_the_programs_position_are_a_band():
    # out of sample (17th check, flame's stick-breaking attention, sb_fwd.py:148 / sb_varlen_fwd.py:417): a jit
    # helper stores the attention matrix one column block at a time for as many blocks as its row block allows,
    # and the launch was high ('stores only'). Now a store in a loop whose trip count and whose address both
    # follow the program's position (also through a helper's parameter given it) is a partial store: low.
    # Guards: each program's own rows in a loop, and a persistent loop over every tile, stay high
    f = _by(_run("stores_in_a_band.py"))
    band = f["causal_weights"]
    assert band.confidence == "low" and "as far as its position allows" in band.overwrite, band.overwrite
    # the helper's summary depends on the call: another kernel that calls it first with a loop variable (not
    # the program's position) does not decide it for band_kernel (weights_by_blocks' own verdict is not the
    # point here: a loop over row blocks inside one program is a band this rule does not see)
    assert "weights_by_blocks" in f
    for fn in ("rows_by_program", "persistent_copy"):
        assert f[fn].kind == "zero-fill-then-overwrite" and f[fn].confidence == "high", (fn, f[fn].overwrite)


def test_a_copy_into_an_as_strided_view_is_a_partial_write():
    # out of sample (17th check, fairseq dynamic_convolution.py:277 and two more): new_zeros, then copy_ into
    # as_strided(...) of it (a band), then bmm reads the whole buffer: was high. An as_strided view may be any
    # part of the storage: the write is partial, the zeros off the band are read, the fill is needed
    f, nec = _by(_run("strided_band_view.py")), _nec(_run("strided_band_view.py"))
    assert "band_matrices" not in f and "band_matrices" in nec, f.get("band_matrices")
    assert f["reshaped_copy"].kind == "zero-fill-then-overwrite" and f["reshaped_copy"].confidence == "high"


def test_a_launch_through_wrap_triton_is_the_kernels_launch():
    # wrap_triton(kernel)[grid](...) (torch.compile's traceable launch) was read as "not a Triton launch": every
    # fill it overwrites was a trail-lost low. Now the wrapped kernel is followed like kernel[grid](...): a whole
    # store is high, a kernel that adds into the buffer keeps the fill; another call indexed by a grid stays low
    res = _run("wrapped_triton_launch.py")
    f, nec = _by(res), _nec(res)
    for fn in ("wrapped_copy", "captured_copy"):
        assert f[fn].kind == "zero-fill-then-overwrite" and f[fn].confidence == "high", (fn, f[fn].overwrite)
        assert "Triton launch copy_kernel[grid]" in f[fn].overwrite
    assert "wrapped_add" not in f and "wrapped_add" in nec
    assert f["picked_kernel"].confidence == "low" and "not a Triton launch" in f["picked_kernel"].overwrite

