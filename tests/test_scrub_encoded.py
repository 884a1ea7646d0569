"""scrub --check sees a secret however it is written, and never calls clean what it did not read.

Regression cases: ``scrub --check`` said clean (exit 0) for a secret base64-encoded (in JSON, a
log or SQLite), percent-encoded, in hex, or cut across two JSON strings, and for a run folder
holding a symbolic link to a file with a token (skipped silently); ``scrub`` left the base64
and hex forms in place with exit 0; an .nsys-rep was called "clean" though only its raw bytes
were searched.
"""

from __future__ import annotations

import base64
import gzip
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

import orjson
import pytest

from kvprof.cli import main
from kvprof.tools.scrub import check_path, scrub_path

SECRET = "kvprof-planted-7f3a9c21e5b8d4"  # not token-shaped: found only as the variable's value
NAME = "KVPROF_PLANTED_KEY"
TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz012345"  # token-shaped: found with no variable set


def _b64(raw: bytes, align: int, urlsafe: bool = False) -> str:
    """``raw`` base64-encoded inside a larger payload, starting at byte ``align`` mod 3."""
    enc = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return enc(b"ctx:"[:align] + raw + b"!>?").decode()


FORMS = {
    "base64-0": _b64(SECRET.encode(), 0),
    "base64-1": _b64(SECRET.encode(), 1),
    "base64-2": _b64(SECRET.encode(), 2),
    "base64url-1": _b64(b"\xfb\xff" + SECRET.encode(), 1, urlsafe=True),
    "hex-lower": SECRET.encode().hex(),
    "hex-upper": "0x" + SECRET.encode().hex().upper(),
    "percent": SECRET.replace("-", "%2D"),
    "percent-every-byte": "".join(f"%{b:02x}" for b in SECRET.encode()),
    "token-base64": base64.b64encode(f"Authorization: token {TOKEN}".encode()).decode(),
    "token-base64-after-a-byte": base64.b64encode(b"0" + TOKEN.encode()).decode(),  # found by the fuzzer
    "token-hex": TOKEN.encode().hex(),
    "token-percent": quote(TOKEN, safe="").replace("_", "%5F"),
}


@pytest.fixture(autouse=True)
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, SECRET)


def _container(tmp_path: Path, where: str, text: str) -> Path:
    if where == "json":
        p = tmp_path / "t.pt.trace.json.gz"
        doc = {"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2, "args": {"blob": text}}]}
        p.write_bytes(gzip.compress(orjson.dumps(doc)))
    elif where == "log":
        p = tmp_path / "run.log"
        p.write_text(f"starting\nrequest header {text} done\n")
    else:
        p = tmp_path / "e.sqlite"
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "cudaLaunchKernel"), (2, f"note {text}")])
        con.commit()
        con.close()
    return p


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("where", ["json", "log", "sqlite"])
def test_encoded_secret_is_found_and_removed(tmp_path: Path, where: str, form: str) -> None:
    text = FORMS[form]
    p = _container(tmp_path, where, text)
    (report,) = check_path(p)
    assert not report.clean, (where, form)
    assert SECRET not in report.line() and TOKEN not in report.line()
    scrub_path(p)
    (after,) = check_path(p)
    assert after.clean, after.line()
    raw = p.read_bytes()
    raw = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    assert text.encode() not in raw
    if where == "sqlite":
        assert b"cudaLaunchKernel" in raw  # the other rows are kept


def test_kernel_names_and_hashes_are_not_taken_for_encoded_secrets(tmp_path: Path) -> None:
    from kvprof.tools.scrub import Rules

    rules = Rules({NAME: SECRET}, hostnames=[])
    for keep in ("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_10CUDAFunctorIfEE",
                 "triton_poi_fused_index_put_0", "a9ec79cf2aa493b37f8c0f62ee805daa", "sm90_xmma_gemm_bf16bf16",
                 "50%25 of the writes", "GPU-a9ec79cf-2aa4-93b3-7f8c-0f62ee805daa", "dGVzdGluZyBhIHBsYWluIHN0cmluZw=="):
        assert rules.scrub(keep) == (keep, None), keep


@pytest.mark.parametrize("parts", [
    [SECRET[:10], SECRET[10:]],
    [TOKEN[:4], TOKEN[4:20], TOKEN[20:]],
    ["x", "https://user:", "pa55word@store.example/"],
])
def test_secret_cut_across_adjacent_json_strings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 parts: list[str]) -> None:
    p = tmp_path / "t.json"
    doc = {"traceEvents": [{"ph": "M", "name": "n", "args": {"argv": ["python", *parts, " run.py"]}},
                           {"ph": "M", "name": "m", "args": dict(zip("abcdef", parts))}]}
    p.write_bytes(orjson.dumps(doc))
    assert main(["scrub", "--check", str(p)]) == 1
    assert "cut across adjacent JSON strings" in capsys.readouterr().err
    assert main(["scrub", str(p)]) == 0, capsys.readouterr().err
    after = orjson.loads(p.read_bytes())
    argv = after["traceEvents"][0]["args"]["argv"]
    assert argv[0] == "python" and argv[-1] == " run.py"
    flat = orjson.dumps(after).decode()
    for part in parts:
        if len(part) > 3:
            assert part not in flat
    assert main(["scrub", "--check", str(p)]) == 0


def test_symlink_to_a_leaking_file_is_followed_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    leak = outside / "notes.log"
    leak.write_text(f"token {TOKEN}\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "ok.log").write_text("fine\n")
    os.symlink(leak, run / "notes.log")
    rc = main(["scrub", "--check", str(run)])
    out, err = capsys.readouterr()
    assert rc == 1 and "notes.log: NOT CLEAN" in err and "symbolic link to" in err and "outside" in err
    rc = main(["scrub", str(run)])  # not rewritten through the link (it may point anywhere) ...
    out, err = capsys.readouterr()
    assert rc == 1 and "not rewritten" in out and "after scrubbing" in err  # ... and the check says so
    assert TOKEN in leak.read_text()


@pytest.mark.parametrize("kind", ["folder", "broken"])
def test_symlink_that_cannot_be_read_is_never_clean(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str], kind: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "ok.log").write_text("fine\n")
    target = tmp_path / ("other" if kind == "folder" else "missing")
    if kind == "folder":
        target.mkdir()
        (target / "secret.log").write_text(f"{TOKEN}\n")
    os.symlink(target, run / "link")
    assert main(["scrub", "--check", str(run)]) == 1
    err = capsys.readouterr().err
    assert "link: NOT CLEAN: 1 files not read" in err


def test_nsys_rep_is_never_called_clean_and_the_forms_are_named(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    rep = tmp_path / "a.nsys-rep"
    rep.write_bytes(b"\x00\x01compressed\x00PATH=/usr/bin\x00LANG=C\x00\xff")
    assert main(["scrub", "--check", str(rep)]) == 0
    out = capsys.readouterr().out
    line, tally = out.splitlines()
    assert "clean" not in line.split(":", 1)[1].split("(")[0] and "NOT FULLY READ" in line
    assert "1 read in part" in tally and "0 clean" in tally
    for form in ("base64", "hex", "percent", "UTF-16", "cut across adjacent JSON strings"):
        assert form in tally


def test_nsys_rep_with_an_environment_outside_the_allow_list_is_reported(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rep = tmp_path / "a.nsys-rep"
    rep.write_bytes(b"\x00\x01\x00PATH=/usr/bin\x00CONTAINER_NAME=box-17\x00LD_PRELOAD={}\x00\xff")
    assert main(["scrub", "--check", str(rep)]) == 1
    err = capsys.readouterr().err
    assert "outside kvprof's allow-list" in err and "CONTAINER_NAME" in err and "box-17" not in err
