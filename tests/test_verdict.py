"""What a capture prints comes from the summary alone (the manifest says only how it ran),
fits an 80-column terminal, and says n/a with a reason where a figure cannot exist."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kvprof.core.run import Manifest, VariantEntry
from kvprof.core.summary import Summary, VariantVerdict
from kvprof.report.console import render
from kvprof.report.verdict import compact_rows, grouped_warnings, render_first_run, verdict_lines

GPU_TRACE = {"path": "run/x.pt.trace.json.gz", "source": "kineto", "variants": ["two_stream", "triton_fused"],
             "events": 10, "gpu_events": 5}
CPU_TRACE = {**GPU_TRACE, "gpu_events": 0}


def group(variant: str, source: str, phase: str, size: int, cost: float | None, **extra: object) -> dict:
    row = {"variant": variant, "source": source, "phase": phase, "size": size, "layer": "all",
           "cost_per_write_ns": cost,
           "writes": 20, "steps": 10, "attribution": "wall" if source == "reference" else "correlation",
           "kernels_per_write": None, "gpu_span_ns": None, "host_launch_ns": 30000.0, "launch_delay_ns": None,
           "streams": 0.0, "overlap_frac": None, "bandwidth_gbs": None, "pct_of_peak": None, "step_ns": 1e5,
           "step_gpu_ns": None, "graph": False, "step_iqr_ns": 1000.0}
    row.update(extra)
    return row


def summary(device_type: str) -> Summary:
    cpu = device_type == "cpu"
    return Summary(
        input="run", input_kind="dir", device={"type": device_type},
        traces=[CPU_TRACE if cpu else GPU_TRACE],
        reference={"clock": ["wall"] if cpu else ["cuda_events"]},
        variants={
            "two_stream": VariantVerdict(paths={"two_streams": 80}, fused=False),
            "triton_fused": VariantVerdict(paths={"fused": 80}, fused=True),
            "cuda_fused": VariantVerdict(available=False, reason="cuda_fused needs CUDA"),
        },
        groups=[
            group("two_stream", "reference", "decode", 64, 3070.0),
            group("two_stream", "reference", "decode", 1, 1760.0),
            group("triton_fused", "reference", "decode", 1, 650.0),
            group("triton_fused", "kineto", "decode", 1, None if cpu else 9e9),
            group("two_stream", "kineto", "decode", 1, None if cpu else 9e9),
            group("two_stream", "reference", "prefill", 4096, 9e9),
        ],
        comparison={"baseline": "two_stream", "layers": 80, "benchmark": {}, "rows": [
            {"variant": "triton_fused", "source": "reference", "phase": "decode", "size": 1,
             "cost_per_write_ns": 650.0, "baseline_cost_per_write_ns": 1760.0, "ratio_cost_per_write_ns": 650 / 1760,
             "saving_per_step_ms": None if cpu else (1760 - 650) * 80 / 1e6},
        ]},
        trusted_sources=["reference", "kineto"],
        warnings=["run/a.pt.trace.json.gz: no GPU events (CPU-only trace)", "run/b.pt.trace.json.gz: no GPU events "
                  "(CPU-only trace)", "torch.profiler is more than 10 % off"],
    )


def manifest(interpreted: bool) -> Manifest:
    m = Manifest(device={"type": "cpu", "name": "x86_64"},
                 config={"layers": 2, "threads": 1, "resolved": {
                     "shape": {"model": "llama-3.1-70b", "tp": 8, "layers": 80, "head_num": 1, "head_dim": 128},
                     "cache_dtype": "bf16", "triton_interpret": "set by kvprof"}})
    m.variants["triton_fused"] = VariantEntry(extra={"interpreted": True} if interpreted else {})
    return m


def test_verdict_names_fused_unfused_skipped_and_the_trusted_costs() -> None:
    lines = verdict_lines(summary("cuda"))
    text = "\n".join(lines)
    assert "fused (one launch writes K and V): triton_fused" in lines
    assert "not fused: two_stream (two streams)" in lines
    assert "n/a here: cuda_fused (cuda_fused needs CUDA)" in lines
    # decode rows of the most trusted source only: each variant's range over the batch sizes
    assert "(decode, batch 1-64, µs, reference): two_stream 1.76-3.07, triton_fused 0.65" in text
    assert "9000000" not in text and "9,000,000" not in text and "CUDA GPU" not in text
    assert "triton_fused saves 0.089 ms per decode step at batch 1" not in text  # no headline in the summary


def test_on_cpu_it_says_what_a_gpu_would_show_and_where_the_samples_are() -> None:
    text = "\n".join(verdict_lines(summary("cpu"), manifest(interpreted=True)))
    assert "no kernel launches" in text and "CUDA GPU" in text and "python -m kvprof dashboard" in text
    assert "triton_fused ran its Triton kernel in Triton's interpreter" in text and "not what the kernel costs" in text


def test_compact_rows_take_the_most_trusted_source_and_say_why_a_figure_is_missing() -> None:
    cols, rows = compact_rows(summary("cpu"), manifest(interpreted=True))
    assert [c.header for c in cols] == ["variant", "fused", "phase", "size", "µs/write", "src", "ratio",
                                        "saving/step"]
    by = {(r[0], r[2], r[3]): [str(c) for c in r] for r in rows}
    # the reference (unprofiled) figure, not torch.profiler's; the interpreted variant marked, and
    # no ratio derived from an interpreter's time (kvprof.analysis.figures)
    assert by[("triton_fused *", "decode", "1")][1:] == ["yes", "decode", "1", "0.65", "ref", "n/a (*)", "n/a (*)"]
    assert by[("two_stream", "decode", "1")][6:] == ["baseline", "baseline"]
    assert by[("two_stream", "prefill", "4096")][4] == "9,000,000"
    gpu = {(r[0], r[2], r[3]): [str(c) for c in r] for r in compact_rows(summary("cuda"))[1]}
    assert gpu[("triton_fused", "decode", "1")][7] == "0.089"


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_first_run_output_fits_80_columns_and_cuts_nothing(device_type: str) -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=80)
    render_first_run(summary(device_type), console, manifest(interpreted=device_type == "cpu"), "traces/run")
    out = buf.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80
    flat = " ".join(out.split())
    assert "…" not in out and "What this run says" in out
    assert flat.endswith("python -m kvprof analyze traces/run")
    if device_type == "cpu":
        assert "each step wrote 2 of the model's 80 layers" in flat and "1 torch thread" in flat
        assert "TRITON_INTERPRET=1, set by kvprof" in flat


def test_analyze_tables_say_why_not_dash_and_fit() -> None:
    buf = io.StringIO()
    render(summary("cpu"), Console(file=buf, width=80))
    out = buf.getvalue()
    cells = [c.strip() for line in out.splitlines() if line.startswith("│") for c in line.strip("│").split("│")]
    assert cells and "-" not in cells  # a missing figure reads n/a (why), never a bare dash
    assert "n/a here (CPU: no GPU kernels): kern/wr, GPU span µs, cost/wr µs" in out.replace("\n", " ")
    table_lines = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(len(line) for line in table_lines) <= 80


def test_warnings_about_several_files_are_one_line() -> None:
    assert grouped_warnings(summary("cpu").warnings) == [
        "no GPU events (CPU-only trace) (a.pt.trace.json.gz, b.pt.trace.json.gz)",
        "torch.profiler is more than 10 % off"]
