"""A compiled op's own checks (TORCH_CHECK, before any launch) reach the caller as the one-line
ValueError every writer refuses a call with, so verify and the pools count them as refusals;
a failed launch stays the error it is. On the GPU a call the rope op refused once crashed the
process while c10 formatted its message with a number; the ops' messages are now built without
it (kvprof/kvcache/writers/csrc)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from kvprof.kvcache.cuda_build import op_refusal
from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

CSRC = Path(__file__).resolve().parents[1] / "kvprof" / "kvcache" / "writers" / "csrc"


def test_an_op_check_is_a_one_line_refusal() -> None:
    exc = RuntimeError("rope_cuda_fused: needs even head dims and strides, 4-byte aligned rows and rope_dim a "
                       "multiple of 2\nException raised from rope_store at rope_store.cpp:158")
    got = op_refusal(exc, "rope_cuda_fused:")
    assert isinstance(got, ValueError)
    assert str(got) == ("rope_cuda_fused: needs even head dims and strides, 4-byte aligned rows and rope_dim a "
                        "multiple of 2")


@pytest.mark.parametrize("text", ["rope_cuda_fused: launch failed: an illegal memory access",
                                  "CUDA error: device-side assert triggered"])
def test_a_launch_failure_stays_what_it_is(text: str) -> None:
    exc = RuntimeError(text)
    assert op_refusal(exc, "rope_cuda_fused:") is exc


def test_the_rope_writer_refuses_with_the_op_s_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def op(*args: object) -> None:
        raise RuntimeError("rope_cuda_fused: q and k rows must not overlap (they are rotated in place)")

    w = RopeCudaWriter()
    t = torch.zeros(1, 1, 8)
    key = (t.dtype, torch.bfloat16, True, None, None)
    w._plans[key] = (op, 0, 1.0, 1.0)
    with pytest.raises(ValueError, match="^rope_cuda_fused: q and k rows must not overlap"):
        w.write_unchecked(t, t, t, t, t, torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                          torch.zeros(4, 8), True, torch.bfloat16)


@pytest.mark.parametrize("source", sorted(p.name for p in CSRC.glob("*.cpp")))
def test_op_messages_insert_no_numbers_through_a_stream(source: str) -> None:
    """Each TORCH_CHECK message is one string (a literal, or a std::string built without an
    ostream) or literals alone: c10 formats several arguments through an ostream, whose numeric
    insertion crashed the process on the GPU machine instead of raising."""
    text = (CSRC / source).read_text()
    for m in re.finditer(r"TORCH_CHECK\((.*?)\);", text, flags=re.S):
        args = m.group(1)
        # the arguments after the condition, split at top-level commas
        depth, parts, cur, quoted = 0, [], "", False
        for ch in args:
            if ch == '"' and not cur.endswith("\\"):
                quoted = not quoted
            if quoted:
                cur += ch
                continue
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        message = [p.strip() for p in parts[1:]]
        if len(message) > 1:
            non_literal = [p for p in message if not p.startswith('"') and not p.endswith("name")
                           and "cudaGetErrorString" not in p and "?" not in p]
            assert not non_literal, f"{source}: {m.group(0)[:160]}"
