"""Hostile inputs to the output side: the Perfetto export (names, lanes, its path) and the
exit code of every output path the system refuses (ENAMETOOLONG and the like are exit 2, a
folder that cannot be written 6), whichever command writes it."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.cli import main
from kvprof.core.atomic import atomic_file, output_error
from kvprof.core.errors import OutputError, UsageError
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

EXAMPLES = 60


def _trace(tmp_path: Path, kernel: str = "store_kvcache_kernel") -> Path:
    doc, _ = build(TraceSpec(variant="sglang_mha", phases=[PhaseSpec("decode", 8, 2)],
                             write=WriteSpec([KernelSpec(7, 0, 1000, name=kernel)])))
    path = tmp_path / "t.trace.json"
    path.write_bytes(dumps(doc))
    return path


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    return line


# ---------------------------------------------------------------- lanes


def _lanes_before(slices):  # the first-fit scan it replaced: the reference for the lanes it deals
    out, ends = [], []
    for s in sorted(slices, key=lambda s: (s.start, s.end)):
        for i, end in enumerate(ends):
            if end <= s.start:
                out[i].append(s)
                ends[i] = s.end
                break
        else:
            out.append([s])
            ends.append(s.end)
    return out


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), max_size=60))
def test_lanes_deal_as_first_fit_did(spans: list[tuple[int, int]]) -> None:
    from kvprof.report.perfetto import _Slice, lanes

    slices = [_Slice(a, a + d, str(i)) for i, (a, d) in enumerate(spans)]
    got = lanes(slices)
    assert [[s.name for s in lane] for lane in got] == [[s.name for s in lane] for lane in _lanes_before(slices)]
    for lane in got:  # no overlap on a lane, every slice once
        assert all(a.end <= b.start for a, b in zip(lane, lane[1:]))
    assert sorted(s.name for lane in got for s in lane) == sorted(s.name for s in slices)


def test_lanes_of_60k_overlapping_slices_take_seconds_not_a_minute() -> None:
    import time

    from kvprof.report.perfetto import _Slice, lanes

    slices = [_Slice(i, i + 1_000_000, str(i)) for i in range(60_000)]  # every one overlaps every other
    t0 = time.monotonic()
    got = lanes(slices)
    assert len(got) == 60_000
    assert time.monotonic() - t0 < 10  # the first-fit scan was quadratic: about a minute on a 2-core machine


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("kernel", ["store\x00kv_kernel", "\x00", "a\x1b[31mb", "rtl\u202eltr", "tab\there"])
def test_a_kernel_name_with_control_characters_keeps_them_as_escapes(kernel: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("perfetto", reason="the 'perfetto' extra")
    from kvprof.core.text import printable
    from kvprof.report.perfetto import read_perfetto

    out = tmp_path / "x.pftrace"
    assert main(["analyze", str(_trace(tmp_path, kernel)), "--no-files", "--quiet", "--perfetto", str(out)]) == 0
    trace = read_perfetto(out.read_bytes())
    names = {e.name for p in trace.packet for e in p.interned_data.event_names}
    assert printable(kernel) in names  # "store\\x00kv_kernel": before, the name was cut at the NUL
    assert not any(c in n for n in names for c in "\x00\x1b\u202e\t")


# ---------------------------------------------------------------- output paths


@pytest.mark.parametrize(("code", "kind"), [(errno.ENAMETOOLONG, UsageError), (errno.ELOOP, UsageError),
                                            (errno.EINVAL, UsageError), (errno.EACCES, OutputError),
                                            (errno.ENOSPC, OutputError), (errno.EROFS, OutputError),
                                            (errno.ENOTDIR, OutputError), (errno.EEXIST, OutputError)])
def test_output_errors_map_by_errno(code: int, kind: type) -> None:
    err = output_error(OSError(code, "x"), "cannot write y")
    assert type(err) is kind and err.exit_code == kind.exit_code


def test_atomic_file_with_a_name_too_long_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="too long"), atomic_file(tmp_path / ("n" * 300), "wb") as f:
        f.write(b"x")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("length", [240, 255, 300, 5000])  # 240: the name fits, its temporary name not
@pytest.mark.parametrize("command", ["analyze --perfetto", "compare --junit", "report --html"])
def test_an_output_file_name_the_system_refuses_is_exit_2_before_work(command: str, length: int, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path)
    name = str(tmp_path / ("n" * length))
    if command == "analyze --perfetto":
        argv = ["analyze", str(trace), "--no-files", "--perfetto", name]
    elif command == "compare --junit":
        argv = ["compare", str(trace), str(trace), "--junit", name]
    else:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "summary.json").write_text(json.dumps({}))
        argv = ["report", str(tmp_path / "run"), "--html", name]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's refusal
        rc = int(exc.code or 0)
    line = _one_line(capsys)
    assert rc == 2, line
    assert command.split()[1] in line
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["t.trace.json"] + (["run"] if "report" in command
                                                                                     else []))
