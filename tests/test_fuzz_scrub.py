"""Fuzzing scrub and scrub --check: secrets written in any form scrub knows, environments of any
shape, constraints it cannot satisfy, decompression bombs, links.

Properties: ``check`` finds every planted secret (plain, base64 at any alignment in either
alphabet, hex in either case, percent-encoded, cut across adjacent JSON strings) in a JSON
trace, a log and an SQLite export, whatever text surrounds it; ``scrub`` then leaves none
(its own check is clean, and no byte form of the secret remains); an environment is cut down
to exactly the allow-listed entries and a second scrub changes nothing; an SQLite constraint
ends in success or one TraceError with the file untouched, never a loop; a gzip over the
bound is refused, one under it read; a link is either checked through or reported as not read.

The CI run is derandomized and small (``CI_EXAMPLES`` per property, a few seconds in all);
``KVPROF_FUZZ_EXAMPLES=N pytest -m fuzz_long tests/test_fuzz_scrub.py`` runs a long random one.
"""

from __future__ import annotations

import base64
import gzip
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.core.errors import ResourceError, TraceError
from kvprof.tools.envsafe import allowed
from kvprof.tools.scrub import MARKER, Rules, check_path, scrub_path

CI_EXAMPLES = 10
LONG_EXAMPLES = int(os.environ.get("KVPROF_FUZZ_EXAMPLES", "0"))
NAME = "KVPROF_FUZZ_SECRET"


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None, derandomize=LONG_EXAMPLES == 0,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def examples() -> int:
    return max(LONG_EXAMPLES, CI_EXAMPLES)


# ---------------------------------------------------------------- strategies

# A secret as envsafe flags it (looks_like_token: mixed case and digits, 20+ characters), so
# scrub hunts its value; or a token shape (found with no variable set).
secret_value = st.text("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=20, max_size=40).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isupper() for c in s) and any(c.islower() for c in s))
token_value = st.builds(lambda p, body: p + body, st.sampled_from(["hf_", "ghp_", "sk-", "AKIA", "glpat-"]),
                        st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=30))
filler = st.text("abcdef ghij:klm,nop./qrs", max_size=20)


@st.composite
def encoded(draw: Any, value: str) -> str:
    """``value`` in one form scrub decodes, inside a larger payload where that form has one."""
    form = draw(st.sampled_from(["plain", "b64", "b64url", "hex", "HEX", "percent"]))
    raw = value.encode()
    if form in ("b64", "b64url"):
        before = draw(st.binary(max_size=5))
        after = draw(st.binary(max_size=5))
        enc = base64.urlsafe_b64encode if form == "b64url" else base64.b64encode
        return enc(before + raw + after).decode()
    if form in ("hex", "HEX"):
        text = raw.hex()
        return text.upper() if form == "HEX" else text
    if form == "percent":
        return "".join(f"%{b:02X}" if draw(st.booleans()) else chr(b) for b in raw)
    return value


def write_container(folder: Path, kind: str, texts: list[str]) -> Path:
    if kind == "json":
        p = folder / "t.pt.trace.json.gz"
        events = [{"ph": "X", "name": "kernel", "ts": i, "dur": 1, "args": {"text": t}} for i, t in enumerate(texts)]
        p.write_bytes(gzip.compress(orjson.dumps({"traceEvents": events})))
    elif kind == "log":
        p = folder / "run.log"
        p.write_text("".join(f"line {t}\n" for t in texts))
    else:
        p = folder / "e.sqlite"
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(["cudaLaunchKernel", *texts])))
        con.commit()
        con.close()
    return p


def all_text(p: Path) -> bytes:
    raw = p.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


# ---------------------------------------------------------------- properties


@_settings(examples())
@given(st.data(), st.sampled_from(["json", "log", "sqlite"]), st.booleans())
def test_any_form_of_a_secret_is_found_then_removed(data: st.DataObject, kind: str, as_token: bool) -> None:
    value = data.draw(token_value if as_token else secret_value)
    text = data.draw(filler) + " " + data.draw(encoded(value)) + " " + data.draw(filler)
    env = {} if as_token else {NAME: value}
    with tempfile.TemporaryDirectory() as d:
        p = write_container(Path(d), kind, [text, "plain words"])
        rules = Rules(env, home="/home/fuzz", hostnames=[])
        (before,) = check_path(p, rules=rules)
        assert not before.clean
        scrub_path(p, env=env)
        (after,) = check_path(p, rules=Rules(env, home="/home/fuzz", hostnames=[]))
        assert after.clean, after.line()
        assert value.encode() not in all_text(p) and text.encode() not in all_text(p)


@_settings(examples())
@given(st.data(), st.booleans(), st.integers(2, 4))
def test_a_secret_cut_across_adjacent_json_strings_is_found_then_removed(data: st.DataObject, as_token: bool,
                                                                         pieces: int) -> None:
    value = data.draw(token_value if as_token else secret_value)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(value) - 1), min_size=pieces - 1, max_size=pieces - 1)))
    parts = [value[a:b] for a, b in zip([0, *cuts], [*cuts, len(value)])]
    env = {} if as_token else {NAME: value}
    doc = {"traceEvents": [{"ph": "M", "name": "argv", "args": {"argv": ["python", " ", *parts, " ", "run.py"]}}]}
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_bytes(orjson.dumps(doc))
        (before,) = check_path(p, rules=Rules(env, hostnames=[]))
        assert not before.clean
        scrub_path(p, env=env)
        argv = orjson.loads(p.read_bytes())["traceEvents"][0]["args"]["argv"]
        assert argv[0] == "python" and argv[-1] == "run.py"
        assert "".join(argv).find(value) < 0
        (after,) = check_path(p, rules=Rules(env, hostnames=[]))
        assert after.clean, after.line()


env_name = st.one_of(
    st.sampled_from(["PATH", "HOME", "LANG", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "TORCH_CUDA_ARCH_LIST",
                     "KVPROF_SGLANG", "LC_ALL", "CONTAINER_NAME", "PWD", "SSL_CERT_FILE", "HF_TOKEN", "OLDPWD"]),
    st.from_regex(r"[A-Z][A-Z0-9_]{1,12}", fullmatch=True))
env_value = st.one_of(st.text("abcXYZ019/._-:", max_size=16), secret_value, token_value)


@_settings(examples())
@given(st.dictionaries(env_name, env_value, min_size=1, max_size=12), st.sampled_from(["meta", "device", "environ"]))
def test_an_environment_is_cut_down_to_the_allow_list(env: dict[str, str], shape: str) -> None:
    entries = [f"{k}={v}" for k, v in env.items()]
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "e.sqlite"
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT)")
        con.execute("CREATE TABLE TARGET_INFO_SYSTEM_ENV (name TEXT NOT NULL, value TEXT NOT NULL)")
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        if shape == "meta":
            con.executemany("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                            [(f'{k}="{v}"',) for k, v in env.items()])
        elif shape == "device":
            con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES ('DeviceEnvironment', ?)", (";".join(entries),))
        else:
            con.execute("INSERT INTO StringIds VALUES (1, ?)", ("\x00".join(entries) + "\x00",))
        con.commit()
        con.close()
        scrub_path(db, env={})
        first = db.read_bytes()
        con = sqlite3.connect(db)
        values = [v for t in ("META_DATA_CAPTURE", "TARGET_INFO_SYSTEM_ENV", "StringIds")
                  for (v,) in con.execute(f"SELECT value FROM {t}")]
        con.close()
        kept = set()
        for v in values:
            if v == MARKER:
                continue
            for entry in v.replace("\x00", ";").split(";"):
                if entry:
                    name, _, value = entry.partition("=")
                    assert allowed(name, value.strip('"')), (shape, entry)
                    kept.add(name)
        judge = Rules({}, hostnames=[])
        assert kept == {k for k, v in env.items() if allowed(k, v) and judge.scrub(v)[1] != "env"}
        assert not scrub_path(db, env={}).rewritten and db.read_bytes() == first  # idempotent


@_settings(max(6, examples() // 2))
@given(st.sampled_from(["CHECK (value NOT LIKE '[kvprof%')", "UNIQUE", "NOT NULL CHECK (length(value) < 12)",
                        "trigger"]), st.integers(1, 5))
def test_a_constraint_ends_in_success_or_one_error_never_a_loop(constraint: str, rows: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        db = Path(d) / "c.sqlite"
        con = sqlite3.connect(db)
        column = "" if constraint == "trigger" else constraint
        con.execute(f"CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT {column})")
        if constraint == "trigger":
            con.execute("CREATE TRIGGER ro BEFORE UPDATE ON StringIds BEGIN SELECT RAISE(ABORT, 'no'); END")
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, f"A{i}=x") for i in range(rows)])
        con.commit()
        con.close()
        before = db.read_bytes()
        start = time.monotonic()
        try:
            report = scrub_path(db, env={})
            assert constraint == "UNIQUE" and report.strings == rows
        except TraceError as exc:
            assert "\n" not in str(exc) and "original kept" in str(exc)
            assert db.read_bytes() == before and os.listdir(d) == ["c.sqlite"]
        assert time.monotonic() - start < 20


@_settings(max(6, examples() // 2))
@given(st.integers(1, 6), st.integers(1, 6))
def test_decompressed_bytes_are_bounded(mib: int, limit_mib: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json.gz"
        p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (mib << 20) + b"]}"))
        if mib >= limit_mib:
            with pytest.raises(ResourceError):
                check_path(p, max_bytes=limit_mib << 20)
            with pytest.raises(ResourceError):
                scrub_path(p, max_bytes=limit_mib << 20)
        else:
            assert check_path(p, max_bytes=limit_mib << 20)[0].clean


@_settings(examples())
@given(st.lists(st.sampled_from(["leaky-file", "clean-file", "folder", "broken"]), min_size=1, max_size=4))
def test_links_are_checked_through_or_reported_as_not_read(links: list[str]) -> None:
    with tempfile.TemporaryDirectory() as d:
        root, run = Path(d), Path(d) / "run"
        run.mkdir()
        (root / "leaky.log").write_text("token ghp_ABCDEFGHIJKLMNOPQRSTUV0123\n")
        (root / "clean.log").write_text("fine\n")
        (root / "dir").mkdir()
        target = {"leaky-file": root / "leaky.log", "clean-file": root / "clean.log", "folder": root / "dir",
                  "broken": root / "nowhere"}
        for i, kind in enumerate(links):
            os.symlink(target[kind], run / f"link{i}")
        reports = {r.path.name: r for r in check_path(run, rules=Rules({}, hostnames=[]))}
        for i, kind in enumerate(links):
            r = reports[f"link{i}"]
            assert "symbolic link to" in r.line()
            assert r.clean == (kind == "clean-file"), r.line()
