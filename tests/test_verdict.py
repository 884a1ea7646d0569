"""The plain sentences a capture ends with come from the summary alone."""

from __future__ import annotations

from kvprof.core.summary import Summary, VariantVerdict
from kvprof.report.verdict import verdict_lines


def summary(device_type: str) -> Summary:
    return Summary(
        input="run", input_kind="dir", device={"type": device_type},
        variants={
            "two_stream": VariantVerdict(paths={"two_streams": 80}, fused=False),
            "triton_fused": VariantVerdict(paths={"fused": 80}, fused=True),
            "cuda_fused": VariantVerdict(available=False, reason="cuda_fused needs CUDA"),
        },
        groups=[
            {"variant": "two_stream", "source": "reference", "phase": "decode", "size": 64, "cost_per_write_ns": 3070.0},
            {"variant": "two_stream", "source": "reference", "phase": "decode", "size": 1, "cost_per_write_ns": 1760.0},
            {"variant": "triton_fused", "source": "reference", "phase": "decode", "size": 1, "cost_per_write_ns": 650.0},
            {"variant": "triton_fused", "source": "kineto", "phase": "decode", "size": 1, "cost_per_write_ns": 9e9},
            {"variant": "two_stream", "source": "reference", "phase": "prefill", "size": 4096, "cost_per_write_ns": 9e9},
        ],
        trusted_sources=["reference", "kineto"],
    )


def test_verdict_names_fused_unfused_skipped_and_the_trusted_costs() -> None:
    lines = verdict_lines(summary("cuda"))
    text = "\n".join(lines)
    assert "fused (one launch writes K and V): triton_fused" in lines
    assert "not fused: two_stream (two_streams)" in lines
    assert "not run here: cuda_fused (cuda_fused needs CUDA)" in lines
    # decode rows of the most trusted source only, sizes in order
    assert "(reference): triton_fused 0.7 µs at batch 1; two_stream 1.8 µs at batch 1, 3.1 µs at batch 64" in text
    assert "9000000" not in text and "CUDA GPU" not in text


def test_on_cpu_it_says_what_a_gpu_would_show_and_where_the_samples_are() -> None:
    text = "\n".join(verdict_lines(summary("cpu")))
    assert "no kernel launches" in text and "python -m kvprof dashboard" in text
