"""``kvprof verify``: planted wrong writers are caught, right ones pass, refusals count as refused
when nothing changed, the budget stops the run, and every bad argument is one line with its
exit code (tests/planted_writers.py holds the plants)."""

from __future__ import annotations

import json
import shlex
import time

import pytest
import torch

from cli_support import run_cli
from kvprof.core.errors import DeviceError, KvprofError, UsageError, WrongWriteError
from kvprof.core.verify import OK, WRONG
from kvprof.verify import PATTERNS, draw_case, dtype_pairs, verify

CPU = torch.device("cpu")
CASES = 2 * len(PATTERNS)  # the first two rounds: every slot pattern, with and without the pool's slot checks
EMPTY = 2  # of those, the two cases with no tokens
SEEDS = (0, 1, 2)


def plant(name: str) -> str:
    return f"planted_writers:{name}"


def run(name: str, seed: int = 0, cases: int = CASES, budget: float = 300.0, **kw):
    return verify([plant(name) if name in PLANTS else name], device=CPU, budget_s=budget, cases=cases, seed=seed, **kw)


PLANTS = {"off_by_one", "one_wrong_byte", "contiguous_loc", "strided_storage", "neighbour_slot", "skips_v",
          "refuses_after_writing", "refuses_cleanly", "paged_contiguous_loc", "mla_writes_skipped", "torch_rope",
          "stale_k_rope", "fma_rope", "sloppy_rope", "first_token_wins", "skips_dummy_slot", "scales_in_place",
          "declares_but_zeroes"}


# --- planted writers ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["off_by_one", "neighbour_slot", "skips_v", "scales_in_place",
                                  "declares_but_zeroes"])
def test_row_plants_are_wrong_in_every_case_with_tokens(name, seed):
    """Off by one row, a neighbour's row written too, V skipped, the caller's K changed in place
    (also by a writer that declares it divides its rows in place, as SGLang's does, and zeroes
    them instead): every case that writes a token is wrong."""
    result = run(name, seed)
    (tally,) = result.writers
    assert (tally.cases, tally.wrong, tally.ok, tally.errors) == (CASES, CASES - EMPTY, EMPTY, 0)
    assert all(f.outcome == WRONG and f.wrong_rows > 0 for f in result.failures)
    if name in ("scales_in_place", "declares_but_zeroes"):  # the cache is right: only the input is named
        assert all(f.wrong_bytes == 0 and "changed its input k" in f.detail for f in result.failures)
    else:
        assert all(f.wrong_bytes > 0 for f in result.failures)


@pytest.mark.parametrize("seed", SEEDS)
def test_one_wrong_byte_is_wrong_in_every_case(seed):
    """Every case, except where the byte lands in a slot several tokens write and the flipped
    element happens to be another of those tokens' (each element may be any of theirs): one
    fp8 value in 256 per other token. Seed 1 has one such case (31 tokens, a third padding)."""
    result = run("one_wrong_byte", seed)
    assert result.writers[0].wrong >= CASES - 1
    pairs = dtype_pairs("mha", "store")
    caught = {f.index for f in result.failures}
    for i in set(range(CASES)) - caught:
        assert draw_case("mha", "store", plant("one_wrong_byte"), i, seed, pairs).pattern in ("duplicate", "padding")
    # the byte flipped in a written row is found as one row; with no tokens, row 0 changed unasked
    assert all(f.wrong_rows == 1 and 1 <= f.wrong_bytes <= 4 for f in result.failures)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", ["contiguous_loc", "strided_storage", "paged_contiguous_loc", "mla_writes_skipped"])
def test_slot_plants_are_caught_in_every_run(name, seed):
    """The strided-loc bug (slots as a run from the first; loc's memory read as contiguous), vLLM's
    slots as a run, MLA's skipped slot 0 written: caught by every run of the first two rounds."""
    result = run(name, seed)
    assert not result.passed and result.writers[0].errors == 0
    assert any("rows" in f.detail for f in result.failures)


@pytest.mark.parametrize("seed", SEEDS)
def test_strided_storage_is_caught_where_the_caller_s_view_reaches_it(seed):
    """A writer that checks its own inputs gets the caller's strided loc (slot checks off): the
    strided patterns without the pool's checks are exactly where the memory-as-contiguous bug shows."""
    result = run("strided_storage", seed)
    for f in result.failures:
        assert "slots=strided" in f.case and "check_slots=off" in f.case


@pytest.mark.parametrize("seed", SEEDS)
def test_stale_rope_k_is_caught(seed):
    result = run("stale_k_rope", seed)
    assert result.writers[0].contract == "rope"
    assert result.writers[0].wrong >= CASES - EMPTY - 2  # a token at position 0 is not rotated at all


def test_a_rope_rounded_as_by_fused_multiply_adds_passes_and_a_sloppy_one_does_not():
    """A rotation rounded once per output (a compiler's fused multiply-adds) lies many fp32 units
    from the fp32 reference where its products cancel, within the error such a compiler may
    make: it passes; one 2^-12 off is caught where q and k are fp32."""
    cases = 4 * len(PATTERNS)
    fma = run("fma_rope", 0, cases=cases)
    assert fma.writers[0].wrong == 0 and fma.writers[0].cases == cases
    sloppy = run("sloppy_rope", 0, cases=cases)
    assert sloppy.writers[0].wrong >= 1
    assert all(f.case.split()[0].endswith("fp32") for f in sloppy.failures)  # q and k in fp32


def test_refusal_that_changed_nothing_is_refused_and_one_that_wrote_is_wrong():
    clean = run("refuses_cleanly")
    assert clean.passed and clean.writers[0].refused == CASES
    late = run("refuses_after_writing")
    assert late.writers[0].wrong == CASES - EMPTY  # no tokens: nothing written before the refusal
    assert all("refused (ValueError: too late" in f.detail for f in late.failures)


# --- right writers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["index_put", "two_stream", "mla_index_put", "mla_cat_copy", "paged_index_put",
                                  "paged_unfused", plant("torch_rope"), plant("first_token_wins"),
                                  plant("skips_dummy_slot")])
def test_right_writers_pass(name):
    """The torch writers of every layout, a right rope writer, one that leaves the first of
    several tokens in a shared slot (no order is promised) and one that leaves SGLang's dummy
    slot 0 alone (as store_cache does) all pass."""
    result = run(name)
    assert result.passed, result.failures[:1]
    (tally,) = result.writers
    assert tally.cases == CASES and tally.ok + tally.refused == CASES and tally.ok >= CASES - 2


def test_sglangs_generic_write_as_torch_ops_passes_with_its_declared_division():
    """set_kv_buffer_torch divides the caller's K and V by the scale in place where it converts
    them (KVWriter.modifies_inputs, SGLang's div_): held to exactly that change, it passes (it was
    wrong in every converting case before verify knew the declaration)."""
    result = run("set_kv_buffer_torch", seed=3, cases=24)
    assert result.passed, result.failures[:1]
    (tally,) = result.writers
    assert tally.ok + tally.refused == 24


@pytest.mark.slow
@pytest.mark.parametrize("name", ["triton_fused", "store_kv_fused", "mla_triton", "paged_triton",
                                  "rope_triton_fused"])
def test_triton_writers_pass_in_the_interpreter(name):
    result = verify([name], device=CPU, budget_s=300, cases=len(PATTERNS), seed=5)
    assert result.passed, result.failures[:1]
    assert result.writers[0].ok >= len(PATTERNS) - 2


# --- cases ----------------------------------------------------------------------------------------------

def test_a_case_is_decided_by_seed_layout_writer_and_index():
    pairs = dtype_pairs("mha", "store")
    a = draw_case("mha", "store", "w", 21, 3, pairs)
    assert a.text() == draw_case("mha", "store", "w", 21, 3, pairs).text()
    others = {draw_case("mha", "store", "w", 21, s, pairs).text() for s in range(8)}
    assert len(others) > 1
    firsts = [draw_case("paged", "store", "w", i, 0, dtype_pairs("paged", "store")) for i in range(CASES)]
    assert [c.pattern for c in firsts] == list(PATTERNS) * 2
    assert [c.check_slots for c in firsts] == [True] * len(PATTERNS) + [False] * len(PATTERNS)
    fp8 = {c.cache for i in range(60) for c in [draw_case("mha", "store", "w", i, 0, pairs)]}
    assert torch.float8_e4m3fn in fp8 and torch.float8_e5m2 in fp8


def test_budget_stops_the_run_between_cases():
    ticks = iter(range(10**6))
    result = verify(["index_put", "two_stream"], device=CPU, budget_s=7, cases=1000, clock=lambda: float(next(ticks)))
    assert result.budget_hit and 0 < result.cases_run < 10
    assert all(w.cases for w in result.writers)  # least time first: each writer ran before any ran twice


def test_only_case_runs_that_case():
    result = run("off_by_one", seed=4, case=9)
    assert result.cases_run == 1 and result.only_case is not None and result.only_case.index == 9
    assert result.only_case.case == draw_case("mha", "store", plant("off_by_one"), 9, 4,
                                              dtype_pairs("mha", "store")).text()


# --- the command ----------------------------------------------------------------------------------------

def test_cli_reports_wrong_cases_with_a_rerun_line_that_reruns_exactly_them(capsys):
    res = run_cli(capsys, "verify", "--device", "cpu", "--variants", plant("contiguous_loc"), "--cases", str(CASES))
    assert res.rc == WrongWriteError.exit_code
    assert res.err.strip().count("\n") == 0 and "cases failed" in res.err
    cases = [line.split("case: ", 1)[1] for line in res.out.splitlines() if line.startswith("  case: ")]
    reruns = [line.split("rerun: ", 1)[1] for line in res.out.splitlines() if line.startswith("  rerun: ")]
    assert reruns and len(reruns) == len(cases)
    words = shlex.split(reruns[-1])
    assert words[:3] == ["python", "-m", "kvprof"]
    again = run_cli(capsys, *words[3:])
    assert again.rc == WrongWriteError.exit_code
    assert f"  case: {cases[-1]}" in again.out.splitlines()
    assert "verify: 1 cases of 1 writers" in again.out


def test_cli_passes_right_writers_and_prints_json(capsys):
    res = run_cli(capsys, "verify", "--device", "cpu", "--variants", "index_put,paged_index_put", "--cases", "4",
                  "--format", "json")
    assert res.rc == 0
    doc = json.loads(res.out)
    assert doc["passed"] and doc["cases_run"] == 8 and doc["failures"] == []
    assert {w["writer"] for w in doc["writers"]} == {"index_put", "paged_index_put"}
    assert "passed" in res.err


def test_cli_refused_cases_pass(capsys):
    res = run_cli(capsys, "verify", "--device", "cpu", "--variants", plant("refuses_cleanly"), "--cases", "3")
    assert res.rc == 0 and "passed" in res.out


def test_cli_budget_is_honoured(capsys):
    began = time.monotonic()
    res = run_cli(capsys, "verify", "--device", "cpu", "--variants", "two_stream", "--budget", "1.5",
                  "--cases", "100000")
    took = time.monotonic() - began
    assert res.rc == 0 and "the budget of 1.5 s ran out" in res.out
    assert took < 1.5 + 5  # one case past the budget at most (a case takes milliseconds here)


def test_cli_budget_too_small_for_any_case_is_not_a_pass(capsys):
    res = run_cli(capsys, "verify", "--device", "cpu", "--variants", "index_put", "--budget", "1e-9")
    assert res.rc == KvprofError.exit_code
    assert "ran out before 1 writer(s) ran a case (index_put)" in res.err and res.err.count("\n") == 1


@pytest.mark.parametrize(("args", "code", "words"), [
    (["--variants", "nope"], UsageError.exit_code, "unknown variant 'nope'"),
    (["--layout", "ring"], UsageError.exit_code, "unknown layout 'ring'"),
    (["--variants", "no_such_module_x:f"], UsageError.exit_code, "cannot import writer module"),
    (["--variants", "planted_writers:nothing"], UsageError.exit_code, "has no writer factory"),
    (["--variants", "cuda_fused"], DeviceError.exit_code, "cuda_fused cannot run on cpu"),
    (["--variants", "two_stream", "--layout", "paged"], UsageError.exit_code, "not a writer of the paged layout"),
    (["--budget", "0"], 2, "--budget"),
    (["--budget", "nan"], 2, "--budget"),
    (["--cases", "0"], 2, "--cases"),
    (["--case", "-1"], 2, "--case"),
    (["--variants", ","], 2, "--variants"),
    (["--seed", "x"], 2, "--seed"),
])
def test_cli_bad_arguments_are_one_line(capsys, args, code, words):
    res = run_cli(capsys, "verify", "--device", "cpu", *args)
    assert res.rc == code
    assert words in res.err and res.err.count("\n") == 1, res.err
    assert res.out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a GPU on a machine without one")
def test_cli_cuda_without_a_gpu_is_one_line(capsys):
    res = run_cli(capsys, "verify", "--device", "cuda", "--variants", "index_put")
    assert res.rc == DeviceError.exit_code and res.err.count("\n") == 1


@pytest.mark.slow
def test_default_run_covers_every_writer_that_runs_here():
    """No --variants: every registered writer of every layout, each run or named with why not."""
    from kvprof.kvcache.writers import REGISTRY

    ticks = iter(range(10**6))
    result = verify(None, device=CPU, budget_s=0.5, cases=1, clock=lambda: float(next(ticks)) * 1e-9)
    names = {(w.layout, w.writer) for w in result.writers}
    assert names == {(layout, n) for layout in ("mha", "mla", "paged") for n in REGISTRY.names(layout)}
    for w in result.writers:
        assert (w.skipped is None) == (w.cases == 1), w
    assert {w.writer for w in result.writers if w.skipped} >= {"cuda_fused", "paged_cuda", "mla_cuda"}
    assert result.passed and not result.untested
    assert all(w.ok + w.refused == w.cases for w in result.writers)
    assert OK == "ok"


# --- --pdl ------------------------------------------------------------------------------------------------

def test_cli_pdl_on_a_cpu_is_a_one_line_device_error(capsys):
    res = run_cli(capsys, "verify", "--pdl", "--device", "cpu")
    assert res.rc == DeviceError.exit_code
    assert "needs a CUDA GPU with programmatic dependent launch" in res.err and res.err.count("\n") == 1


@pytest.mark.parametrize(("args", "words"), [(["--case", "3"], "--pdl has none"), (["--tokens", "0"], "--tokens"),
                                             (["--trials", "0"], "--trials")])
def test_cli_pdl_bad_arguments_are_one_line(capsys, args, words):
    res = run_cli(capsys, "verify", "--pdl", "--device", "cpu", *args)
    assert res.rc == UsageError.exit_code and words in res.err and res.err.count("\n") == 1


def test_pdl_reader_counts_each_row_that_differs():
    """The dependent kernel's counting, in Triton's interpreter (there without its
    griddepcontrol.wait, which only a GPU has): one stale read per row with any byte off."""
    from kvprof.kvcache.writers import triton_kernel

    if not triton_kernel.interpreted():
        pytest.skip("the reader on a CPU needs TRITON_INTERPRET=1 at import")
    from kvprof.verify_pdl import _reader

    gen = torch.Generator().manual_seed(0)
    k_rows = torch.randint(0, 256, (20, 40), dtype=torch.uint8, generator=gen)
    v_rows = torch.randint(0, 256, (20, 24), dtype=torch.uint8, generator=gen)
    loc = torch.tensor([3, 7, 11])
    want_k, want_v = k_rows[loc].clone(), v_rows[loc].clone()
    stale = torch.zeros(1, dtype=torch.int64)
    _reader()[(3, 2)](k_rows, v_rows, want_k, want_v, loc, stale, 40, 24, BLOCK=16, PDL=False)
    assert int(stale) == 0
    want_k[1, 39] ^= 1  # the last byte of a row past the first block
    want_v[2, 0] ^= 2
    want_v[2, 5] ^= 2  # two bytes of one row: one stale read
    _reader()[(3, 2)](k_rows, v_rows, want_k, want_v, loc, stale, 40, 24, BLOCK=16, PDL=False)
    assert int(stale) == 2


@pytest.mark.gpu
def test_pdl_kvprof_writers_read_no_stale_row():
    """A short run of the check on kvprof's PDL writers of each layout (the full one:
    gpu/run_gpu_checks.sh verify)."""
    from kvprof.verify_pdl import verify_pdl

    dev = torch.device("cuda", torch.cuda.current_device())
    result = verify_pdl(["triton_fused", "mla_triton", "paged_triton", "rope_triton_fused"], device=dev, trials=8,
                        tokens=(1, 64))
    ran = [w for w in result.writers if w.skipped is None]
    assert {w.writer for w in ran} == {"triton_fused", "mla_triton", "paged_triton", "rope_triton_fused"}
    for w in ran:
        assert w.reads == 8 * 65 * (1 if w.layout == "mla" else 2) and w.stale == 0, w


@pytest.mark.gpu
def test_verify_passes_kvprof_gpu_writers():
    dev = torch.device("cuda", torch.cuda.current_device())
    result = verify(["triton_fused", "cuda_fused", "mla_cuda", "paged_cuda", "rope_cuda_fused"], device=dev,
                    budget_s=600, cases=CASES)
    assert result.passed, result.failures[:2]
    assert all(w.cases == CASES for w in result.writers if w.skipped is None)


def test_cli_json_of_a_failing_run_is_one_document_and_exit_7(capsys):
    res = run_cli(capsys, "verify", "--device", "cpu", "--variants", plant("skips_v"), "--cases", "3", "--format",
                  "json")
    assert res.rc == WrongWriteError.exit_code
    doc = json.loads(res.out)
    assert not doc["passed"] and doc["failed"] == 3 and len(doc["failures"]) == 3
    assert all(f["reproduce"].startswith("python -m kvprof verify ") and f["wrong_rows"] for f in doc["failures"])
    assert "FAILED" in res.err and res.err.strip().splitlines()[-1].startswith("kvprof verify: error:")
