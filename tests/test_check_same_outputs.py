"""scripts/check_same_outputs.py: its masks hide only what may differ between two runs of the
same code (timings, dates, temporary paths), and any other difference is reported with where
it is. A mask that hid real changes would let a re-layering that changed behaviour pass."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_support import end_group

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_same_outputs.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_same_outputs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


cso = _load()
NO_PATHS = ({}, {})


def _summary(**changes):
    doc = {
        "captured_at": "2026-12-06T20:03:57+00:00",
        "input": "out-base/run",
        "rows": [{"variant": "index_put", "phase": "decode", "size": 1, "median_us": 30.6, "ratio": 1.22,
                  "writes": 8}],
        "host_calls_by_name": [{"name": "aten::index_put_", "count": 16, "total_ns": 900},
                               {"name": "aten::copy_", "count": 4, "total_ns": 800}],
    }
    doc["rows"][0].update(changes)
    return doc


def _masked_difference(a, b, masks, literals=NO_PATHS):
    return cso.json_difference(cso.mask_json(a, masks, literals[0]), cso.mask_json(b, masks, literals[1]))


def test_timings_dates_and_paths_are_masked_in_measured_outputs(tmp_path):
    a = _summary()
    a["input"] = str(tmp_path / "out-base" / "run")
    b = _summary(median_us=11.9, ratio=0.8)
    b["captured_at"] = "2026-12-07T01:02:03+00:00"
    b["input"] = str(tmp_path / "out-head" / "run")
    b["host_calls_by_name"].reverse()  # ranked by a time: the order follows the timings
    literals = ({str(tmp_path / "out-base"): "<OUT>"}, {str(tmp_path / "out-head"): "<OUT>"})
    assert _masked_difference(a, b, cso.MEASURED, literals) is None


def test_a_non_timing_field_that_changed_is_a_difference_with_its_key():
    found = _masked_difference(_summary(), _summary(writes=7), cso.MEASURED)
    assert found == "/rows[0]/writes: 8 -> 7"
    found = _masked_difference(_summary(), _summary(variant="two_stream"), cso.MEASURED)
    assert found.startswith("/rows[0]/variant: ")


def test_a_missing_key_and_a_changed_key_order_are_differences():
    a, b = _summary(), _summary()
    del b["rows"][0]["writes"]
    assert "only in base ['writes']" in _masked_difference(a, b, cso.MEASURED)
    c = dict(reversed(list(_summary().items())))
    assert "key order" in _masked_difference(a, c, cso.MEASURED)


def test_strict_outputs_keep_their_timings():
    """Outputs of one shared input compare every number: a median computed otherwise shows."""
    assert _masked_difference(_summary(), _summary(median_us=30.7), cso.STRICT) == "/rows[0]/median_us: 30.6 -> 30.7"
    a, b = _summary(), _summary()
    b["host_calls_by_name"].reverse()
    assert _masked_difference(a, b, cso.STRICT) is not None


def test_text_masks_dates_uuids_and_paths_but_not_words(tmp_path):
    base, head = str(tmp_path / "out-base"), str(tmp_path / "out-head")
    a = f'captured 2026-12-06T20:03:57+00:00 in {base}\n<div id="70c70211-fd62-46b0-97ec-6d36ef008336">\n'
    b = f'captured 2026-12-07 01:02 in {head}\n<div id="cacccacb-5d59-47d4-9c3f-9b02ac46248b">\n'
    lit = ({base: "<OUT>"}, {head: "<OUT>"})
    ma, mb = cso.mask_text(a, cso.STRICT, lit[0]), cso.mask_text(b, cso.STRICT, lit[1])
    assert cso.text_difference(ma, mb) is None
    found = cso.text_difference(ma + "fused: yes\n", mb + "fused: no\n")
    assert found.startswith("line 3: ") and "yes" in found and "no" in found


def test_measured_text_masks_numbers_and_table_widths_only():
    a = "│ index_put │ decode │    30.6 │  1.22 │ off  │\n"
    b = "│ index_put │ decode │ 11,040.2 │ 0.91 │ ok   │\n"
    assert cso.text_difference(cso.mask_text(a, cso.MEASURED), cso.mask_text(b, cso.MEASURED)) is None
    c = b.replace("index_put", "two_stream")
    assert cso.text_difference(cso.mask_text(a, cso.MEASURED), cso.mask_text(c, cso.MEASURED)) is not None


def test_a_measured_figure_may_change_its_axis_scale_but_not_its_title():
    log = ('"yaxis":{"anchor":"x","title":{"text":"µs per write (log)"},"type":"log","exponentformat":"none",'
           '"range":[1.8,3.8],"tickvals":[100.0,200.0],"ticktext":["100","200"],"automargin":true}')
    linear = '"yaxis":{"anchor":"x","title":{"text":"µs per write"},"automargin":true}'
    assert cso.text_difference(cso.mask_text(log, cso.MEASURED), cso.mask_text(linear, cso.MEASURED)) is None
    other = linear.replace("per write", "per step")
    assert cso.text_difference(cso.mask_text(log, cso.MEASURED), cso.mask_text(other, cso.MEASURED)) is not None


def test_csv_timing_columns_are_masked_and_others_compared():
    a = "variant,phase,median_us,writes\nindex_put,decode,30.6,8\n"
    b = "variant,phase,median_us,writes\nindex_put,decode,11.2,8\n"
    assert cso.csv_difference(a, b, cso.MEASURED, NO_PATHS) is None
    c = "variant,phase,median_us,writes\nindex_put,decode,11.2,9\n"
    assert cso.csv_difference(a, c, cso.MEASURED, NO_PATHS) == "row 2, writes: '8' -> '9'"


def test_files_are_compared_by_format(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    # parquet as a table: a timing column may differ, a name may not
    table = {"variant": ["index_put", "two_stream"], "dur_ns": [10, 20], "layer": [0, 1]}
    pq.write_table(pa.table(table), a / "writes.parquet")
    pq.write_table(pa.table({**table, "dur_ns": [11, 25]}), b / "writes.parquet")
    assert cso.file_difference(a / "writes.parquet", b / "writes.parquet", cso.MEASURED, NO_PATHS) is None
    assert cso.file_difference(a / "writes.parquet", b / "writes.parquet", cso.STRICT, NO_PATHS) is not None
    pq.write_table(pa.table({**table, "layer": [0, 2]}), b / "writes.parquet")
    found = cso.file_difference(a / "writes.parquet", b / "writes.parquet", cso.MEASURED, NO_PATHS)
    assert found == "column layer, row 1: 1 -> 2"
    # gzip decompressed, then JSON by key
    (a / "t.json.gz").write_bytes(gzip.compress(json.dumps({"ts": 1, "name": "k"}).encode()))
    (b / "t.json.gz").write_bytes(gzip.compress(json.dumps({"ts": 2, "name": "k"}).encode()))
    assert cso.file_difference(a / "t.json.gz", b / "t.json.gz", cso.MEASURED, NO_PATHS) is None
    (b / "t.json.gz").write_bytes(gzip.compress(json.dumps({"ts": 2, "name": "v"}).encode()))
    assert cso.file_difference(a / "t.json.gz", b / "t.json.gz", cso.MEASURED, NO_PATHS) == "/name: k -> v"


def test_perfetto_packets_of_a_measured_run_compare_as_a_set():
    """Slices of a measured run take lanes by their times: packet order and lane numbers may
    differ, a slice's name may not."""
    a = ['packet {\n  track_descriptor {\n    uuid: 1\n    name: "reference step"\n  }\n}',
         'packet {\n  timestamp: 100\n  name: "index_put decode batch 1"\n}']
    b = [a[1].replace("100", "250"), a[0].replace('"reference step"', '"reference step (2)"')]
    assert cso.record_set_difference(a, b, cso.MEASURED, NO_PATHS) is None
    c = [a[0], a[1].replace("index_put", "two_stream")]
    assert "1 distinct records only in base" in cso.record_set_difference(a, c, cso.MEASURED, NO_PATHS)
    assert cso._packets("\n".join(a) + "\n") == a


def test_a_file_on_one_side_only_is_reported(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "run").mkdir(parents=True)
        (d / "run" / "summary.csv").write_text("variant\nindex_put\n")
    (a / "run" / "events.parquet").write_bytes(b"x")
    rows = cso.compare_trees((a, b), lambda name: cso.STRICT, NO_PATHS)
    assert [(r.name, r.result) for r in rows] == [("run/events.parquet", "missing in head"),
                                                   ("run/summary.csv", "same")]


def test_bad_usage_is_one_line_and_exit_2(capsys):
    assert cso.main(["--base", "no-such-ref-anywhere"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a commit" in err and "Traceback" not in err
    assert cso.main([]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.slow
def test_head_against_itself_is_the_same(tmp_path):
    """The whole script, end to end on a subset of its commands (one capture and analyze's forms
    of it; the committed samples and the other layouts are the script's own runs, minutes each):
    HEAD against HEAD must come out the same."""
    cmd = [sys.executable, str(SCRIPT), "--base", "HEAD", "--head", "HEAD",
           "--only", r"^(capture-mha|own-capture-mha\.analyze.*)$"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        end_group(proc)
    assert proc.returncode == 0, out[-3000:] + err[-2000:]
    assert "SAME: " in out and " 0 differ" in out
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "kvprof-same-" not in listed  # its worktrees are gone


@pytest.mark.parametrize("args, says", [
    (["--only", "("], "argument --only: '(' is not a regular expression"),
    (["--timeout", "0"], "argument --timeout: '0' is not a number of seconds above 0"),
    (["--timeout", "nan"], "argument --timeout: 'nan' is not a number of seconds above 0"),
    (["--base", "no-such-ref-here"], "'no-such-ref-here' is not a commit of this repository"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, says):
    argv = args if "--base" in args else ["--base", "HEAD", *args]
    proc = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr
