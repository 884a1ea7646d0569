"""scrub removes what hides behind JSON escapes, token shapes and host names, and --check proves it.

The regression cases: a secret written as ``sk\\u002d...`` or a home path as ``\\/home\\/...``
survived; token-shaped values survived when their variable was not set where scrub ran;
the host name stayed; an unreadable folder was "scrubbed" with exit 0; a capture under
$HOME wrote the home path into its manifest, summary and Parquet files.
"""

from __future__ import annotations

import errno
import gzip
import os
import socket
import sqlite3
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from cli_support import run_cli
from kvprof.cli import main

SECRET = "sk-planted0123456789abcdefXYZ"


def escaped_trace(path: Path) -> Path:
    """A Chrome trace whose secret, home path and host hide behind escapes and plain fields."""
    body = (
        b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1, "dur": 1,'
        b' "args": {"cmd": "--key sk\\u002dplanted0123456789abcdefXYZ", "cwd": "\\/home\\/alice\\/work",'
        b' "token": "ghp_abcdefghijklmnopqrstuvwxyz012345"}},'
        b' {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "worker hf_ABCDEFGH12345678"}}],'
        b' "distributedInfo": {"backend": "nccl", "init": "https://user:pa55word@store.example:80/"},'
        b' "host_name": "gpu-node-17"}'
    )
    path.write_bytes(gzip.compress(body) if path.name.endswith(".gz") else body)
    return path


@pytest.mark.parametrize("name", ["t.json", "t.pt.trace.json.gz"])
def test_check_finds_escaped_and_token_shaped_values_and_scrub_removes_them(tmp_path, capsys, monkeypatch, name):
    monkeypatch.setenv("KVPROF_PLANTED_KEY", SECRET)
    p = escaped_trace(tmp_path / name)
    rc, _, err = run_cli(capsys, "scrub", "--check", str(p))
    assert rc == 1 and "NOT CLEAN" in err
    assert SECRET not in err  # the report does not print the secret
    rc, _, err = run_cli(capsys, "scrub", str(p))
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "scrub", "--check", str(p))
    assert rc == 0 and "clean" in out, err
    raw = p.read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
    doc = orjson.loads(text)
    flat = orjson.dumps(doc).decode()
    for gone in ("planted0123456789", "alice", "ghp_abc", "hf_ABCDEFGH", "pa55word", "gpu-node-17"):
        assert gone not in flat, gone
    assert doc["traceEvents"][0]["ts"] == 1  # the events are still there


def test_token_shaped_values_go_without_the_variable_set(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVPROF_PLANTED_KEY", raising=False)
    p = escaped_trace(tmp_path / "t.json")
    assert run_cli(capsys, "scrub", str(p))[0] == 0
    assert b"ghp_abc" not in p.read_bytes() and b"hf_ABCDEFGH" not in p.read_bytes()


def test_kernel_names_and_ids_are_not_taken_for_tokens():
    from kvprof.tools.scrub import Rules

    rules = Rules({}, home="/home/alice", hostnames=[])
    for keep in ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_10CUDAFunctorIfEE",
                 "task-queue-0123456789", "__hf_kernel_0123456789", "71F7BA7B01784BD69A6B2B31A139FE88",
                 "kvprof.step[decode bs=8] #3"):
        assert rules.scrub(keep) == (keep, None), keep


def test_this_hosts_name_is_removed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-17.example.com")
    host = "gpu-node-17"
    log = tmp_path / "x.log"
    log.write_text(f"running on {host} today\n")
    assert run_cli(capsys, "scrub", "--check", str(log))[0] == 1
    assert run_cli(capsys, "scrub", str(log))[0] == 0
    assert host not in log.read_text()


def test_sqlite_hostname_rows_and_text(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVPROF_PLANTED_KEY", SECRET)
    db = tmp_path / "e.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE TARGET_INFO_SYSTEM_ENV (name TEXT, value TEXT)")
    con.executemany("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?)", [("Hostname", "vm"), ("OsDescription", "x")])
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, ?)", (f"python run.py --key {SECRET}",))
    con.commit()
    con.close()
    assert run_cli(capsys, "scrub", "--check", str(db))[0] == 1
    assert run_cli(capsys, "scrub", str(db))[0] == 0
    assert run_cli(capsys, "scrub", "--check", str(db))[0] == 0
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name='Hostname'").fetchone()[0] != "vm"
    con.close()


def test_unreadable_folder_is_an_error_not_a_clean_exit(tmp_path, capsys, monkeypatch):
    d = tmp_path / "run"
    (d / "sub").mkdir(parents=True)
    (d / "a.log").write_text("ok\n")
    real = os.scandir

    def deny(path="."):
        if Path(path) == d / "sub":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", deny)
    rc, _, err = run_cli(capsys, "scrub", str(d))
    assert rc == 3 and "cannot read the folder" in err
    rc, _, err = run_cli(capsys, "scrub", "--check", str(d))
    assert rc == 3 and "cannot read the folder" in err


def test_capture_under_home_writes_no_home_path_anywhere(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    out = home / "traces"
    rc = main(["capture", "--batch-sizes", "1", "--prefill-tokens", "8", "--steps", "1", "--warmup", "0",
               "--no-progress", "--variants", "index_put", "--out", str(out), "--run-id", "r"])
    assert rc == 0, capsys.readouterr().err
    run = out / "r"
    for p in (p for p in sorted(run.rglob("*")) if p.is_file()):  # hta/<variant>/ holds the traces too
        if p.suffix == ".parquet":
            text = str(pq.read_table(p).to_pylist())
        else:
            data = p.read_bytes()
            text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("utf-8", "replace")
        assert str(home) not in text, p.name
    rc, _, err = run_cli(capsys, "scrub", "--check", str(run))
    assert rc == 0, err
