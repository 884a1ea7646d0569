"""The committed H200 samples (traces/samples/): what they must show, and each profiler against the reference.

Made by gpu/run_gpu_checks.sh (capture step) on an H200; the command is in
traces/samples/README.md. These tests read only the committed files: they run on CPU.
"""

from __future__ import annotations

import gzip
import re
import sqlite3
from functools import cache
from pathlib import Path

import orjson
import pandas as pd
import pytest

from kvprof.analysis.summary import analyze
from kvprof.core.timings import StepTimings
from kvprof.trace.load import load_run

SAMPLES = Path(__file__).resolve().parent.parent / "traces" / "samples"
RUN = SAMPLES / "h200-llama70b-tp8"
VARIANTS = ("index_put", "two_stream", "triton_fused")
# planted in the environment of the capture by gpu/run_gpu_checks.sh
PLANTED = (b"kvprof-planted-9c41e7d2b85a", b"hf_kvprofPlantedTokenValue0123456789")


@cache
def analysis():
    """The whole capture analysed once (about 15 s on a loaded 2-core machine): every test that
    reads it is marked slow, since the first of them to run pays for it."""
    return analyze(load_run(RUN))


def measured(source: str) -> pd.DataFrame:
    w = analysis().writes
    return w[(w["source"] == source) & ~w["during_capture"].astype(bool)]


def test_samples_are_complete():
    manifest = orjson.loads((RUN / "manifest.json").read_bytes())
    assert manifest["device"]["name"] == "NVIDIA H200"
    assert manifest["config"]["resolved"]["shape"]["head_num"] == 1  # Llama-3.1-70B at TP 8
    for v in VARIANTS:
        files = manifest["variants"][v]["files"]
        for key in ("torch_trace", "nsys_rep", "nsys_sqlite"):
            assert (RUN / files[key]).is_file(), (v, key)
    assert (RUN / "step_timings.json").is_file()
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 20 << 20


@pytest.mark.slow
@pytest.mark.parametrize("source", ["kineto", "nsys"])
def test_kernels_per_write(source):
    w = measured(source)
    decode = w[w["phase"] == "decode"]
    assert set(decode["graph"]) == {True}  # decode steps were CUDA-graph replays
    for variant, kernels in (("triton_fused", 1), ("index_put", 2), ("two_stream", 2)):
        vw = w[w["variant"] == variant]
        assert len(vw) > 0
        assert set(vw["kernels"]) == {kernels}, (variant, vw["kernels"].value_counts().to_dict())
    two = decode[decode["variant"] == "two_stream"]
    assert set(two["streams"]) == {2}  # K and V on two streams in the graph
    assert set(decode[decode["variant"] == "index_put"]["streams"]) == {1}


@pytest.mark.slow
def test_fused_verdicts_agree():
    variants = analysis().summary.to_json()["variants"]
    for v in ("triton_fused", "cuda_fused", "store_kv_fused", "sgl_kernel_cubin"):
        assert variants[v]["fused"] is True and variants[v]["agree"] is True, v
    for v in ("index_put", "two_stream"):
        assert variants[v]["fused"] is False and variants[v]["agree"] is True


def _per_group(source: str) -> pd.DataFrame:
    w = measured(source)
    return w.groupby(["variant", "phase", "size"]).agg(
        writes=("write_id", "size"), kernels=("kernels", "median"), streams=("streams", "median"),
        gpu_busy_ns=("gpu_busy_ns", "median"), gpu_new_ns=("gpu_new_ns", "median"), graph=("graph", "all"))


@pytest.mark.slow
def test_torch_profiler_and_nsys_see_the_same_writes():
    """Same writes, kernels and streams per write. Their times are not compared with each
    other: each is compared with the reference below."""
    k, n = _per_group("kineto"), _per_group("nsys")
    assert list(k.index) == list(n.index)
    pd.testing.assert_series_equal(k["writes"], n["writes"])
    pd.testing.assert_series_equal(k["kernels"], n["kernels"])
    pd.testing.assert_series_equal(k["streams"], n["streams"])


def _groups() -> pd.DataFrame:
    g = pd.DataFrame(analysis().summary.to_json()["groups"])
    return g[g["layer"].astype(str) == "all"]


@pytest.mark.slow
def test_every_point_has_reference_figures():
    timings = StepTimings.from_json((RUN / "step_timings.json").read_bytes())
    manifest = orjson.loads((RUN / "manifest.json").read_bytes())
    ran = [v for v, e in manifest["variants"].items() if e["available"]]
    points = {(p["phase"], p["size"]) for p in manifest["phases"]}
    ref = timings.select(pass_="reference")
    assert {(r.variant, r.phase, r.size) for r in ref} == {(v, p, s) for v in ran for p, s in points}
    assert all(r.clock == "cuda_events" and len(r.samples_ns) == 200 for r in ref)
    g = _groups()
    assert len(g[g["source"] == "reference"]) == len(ran) * len(points)


@pytest.mark.slow
def test_observer_rows_are_each_reading_over_the_reference():
    summary = analysis().summary.to_json()
    g = _groups().set_index(["variant", "source", "phase", "size"])
    rows = summary["observer"]["rows"]
    assert len(rows) == 2 * len(g.xs("reference", level="source"))  # both profilers at every point
    for r in rows:
        reading = g.loc[(r["variant"], r["source"], r["phase"], r["size"]), "cost_per_write_ns"]
        reference = g.loc[(r["variant"], "reference", r["phase"], r["size"]), "cost_per_write_ns"]
        assert r["ratio_per_write"] == pytest.approx(reading / reference)
        assert r["flagged"] == (abs(r["ratio_per_write"] - 1) > 0.1 or abs(r["ratio_per_step"] - 1) > 0.1)


@pytest.mark.slow
def test_headlines_come_from_the_reference():
    summary = analysis().summary.to_json()
    assert summary["trusted_sources"][0] == "reference"
    head = summary["comparison"]["headline"]
    assert head["source"] == "reference" and head["size"] == 10


@pytest.mark.slow
def test_both_profilers_slow_the_decode_graphs_they_watch():
    """docs/observer-effect.md: per-node tracing of a replayed graph slows it (each profiled
    pass timed its own steps with the reference's CUDA events)."""
    rows = [r for r in analysis().summary.to_json()["observer"]["rows"] if r["phase"] == "decode"]
    for source in ("kineto", "nsys"):
        slow = [r["pass_slowdown"] for r in rows if r["source"] == source]
        assert len(slow) == 18 and min(slow) > 1.0 and sorted(slow)[len(slow) // 2] > 1.5, (source, slow)


def _bytes_of(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def test_no_planted_secret_in_any_sample_file():
    files = [p for p in SAMPLES.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = _bytes_of(path)
        for secret in PLANTED:
            assert secret not in data, path


REPO = SAMPLES.parent.parent
# gpu/run_gpu_checks.sh planted these in the capture's environment: scrub --check must find
# them (and their base64, hex, percent and split forms) nowhere
PLANTED_ENV = {"KVPROF_TEST_SECRET": PLANTED[0].decode(), "HF_TOKEN": PLANTED[1].decode()}


def committed_files() -> list[Path]:
    """Every committed sample and log kvprof ships or quotes: traces/samples, the wheel's
    kvprof/samples and the GPU logs under docs/gpu; a symbolic link once, as its target."""
    files = [p for p in sorted(SAMPLES.rglob("*")) if p.is_file()]
    files += [p for p in sorted((REPO / "kvprof" / "samples").rglob("*")) if p.is_file()]
    files += sorted((REPO / "docs" / "gpu").glob("*.txt")) + [REPO / "traces" / "README.md"]
    return sorted({p.resolve() for p in files if p.exists()})


def test_wheel_samples_are_the_checked_files():
    """kvprof/samples holds links into traces/samples (and its README): nothing unchecked."""
    checked = set(committed_files())
    shipped = [p for p in (REPO / "kvprof" / "samples").rglob("*") if not p.is_dir()]
    assert shipped and all(p.resolve() in checked for p in shipped)


def test_every_committed_file_passes_scrub_check_against_the_planted_environment():
    """Each file decoded as scrub --check decodes it (JSON, gzip, SQLite, Parquet, logs, links
    followed) holds no environment entry outside kvprof's allow-list, no home path or host
    name, no token, and neither planted value in any form scrub knows. An .nsys-rep is read
    only in its raw bytes: what can be seen there must be clean too."""
    from kvprof.tools.scrub import Rules, check_path

    rules = Rules(PLANTED_ENV, home="/home/kvprof-sample-check", hostnames=[])
    files = committed_files()
    assert len(files) > 45
    dirty = [r.line() for p in files for r in check_path(p, rules=rules) if not r.clean]
    assert dirty == []


def _entries(block: str) -> list[tuple[str, str]]:
    """(name, value) of every NAME=value entry in an environment as nsys stores it."""
    sep = "\x00" if "\x00" in block else ";"
    out = []
    for piece in block.split(sep):
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", piece, re.S)
        if m:
            out.append((m.group(1), m.group(2).strip('"')))
    return out


def test_environments_in_the_committed_exports_hold_only_allowlisted_variables():
    """Read directly (not through scrub): every environment row and NUL-separated environ block
    of every committed .sqlite, and every NUL-separated entry in the plain bytes of every
    .nsys-rep, names a variable kvprof passes to a profiled child (envsafe.allowed)."""
    from kvprof.tools.envsafe import allowed

    seen: dict[str, set[str]] = {}
    for db in sorted(SAMPLES.rglob("*.sqlite")):
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            blocks = [v for (v,) in con.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'")]
            blocks += [v for (v,) in con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name LIKE "
                                                 "'%Environment%'")]
            blocks += [v for (v,) in con.execute("SELECT value FROM StringIds WHERE instr(value, char(0)) > 0")]
        finally:
            con.close()
        for block in blocks:
            for name, value in _entries(block):
                seen.setdefault(db.name, set()).add(name)
                assert allowed(name, value) or (name, value) == ("LD_PRELOAD", "{}"), (db, name)
    for rep in sorted(SAMPLES.rglob("*.nsys-rep")):
        for m in re.finditer(rb"(?<=\x00)([A-Za-z_][A-Za-z0-9_]*)=([\x20-\x7e]*)(?=\x00)", rep.read_bytes()):
            name, value = m.group(1).decode(), m.group(2).decode()
            seen.setdefault(rep.name, set()).add(name)
            assert allowed(name, value) or (name, value) == ("LD_PRELOAD", "{}"), (rep, name)
    # the exports do keep an allow-listed environment (the check above is not vacuous)
    assert {"PATH", "LD_LIBRARY_PATH"} <= seen["sglang-pool-TP-0.sqlite"]
    assert {"PATH", "KVPROF_NSYS"} <= seen["index_put.nsys-rep"]


def test_nsys_reports_checked_on_the_h200():
    """A .nsys-rep cannot be scrubbed; the GPU script exported each one unscrubbed and counted."""
    log = (SAMPLES / "secret-check.txt").read_text()
    lines = [line for line in log.splitlines() if line.startswith("planted secret in")]
    assert len(lines) >= 2 * len(VARIANTS)
    assert all(line.endswith(": 0 matching lines") for line in lines), log
