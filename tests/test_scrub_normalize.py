"""scrub normalises before it matches: a secret is found in any form a reader would recognise.

The encodings are built as classes, not listed: a Hypothesis strategy composes a stack of
encoding layers (JSON, Python, HTML and percent escapes; base64 in either alphabet, hex, of
the text in UTF-8, UTF-16 or UTF-32, gzipped or not) over a secret that is first disguised as a
reader would not notice (zero-width and format characters, soft hyphens, ANSI sequences,
look-alike Cyrillic/Greek letters, full-width forms), and puts it in a container (a JSON trace,
a log in UTF-8/16/32, a deflated zip member, an SQLite value) or cuts it across any number
of JSON strings. ``scrub --check`` must not say clean; ``scrub`` must leave nothing it finds.

Regression cases (each said "clean", destroyed data or took minutes before): a secret in a
file's or a folder's name (and scrub printed it), a UTF-32 log and a numpy unicode array, a
deflated zip member, a secret cut across 12 JSON strings (the limit was 8), a secret value or
host name that is an ordinary word (``stream``, ``decode``, ``index_put``, ``h200``, ``cpu``)
removing variant names and the device name, a secret in an SQLite table name (exit 3, where 1
is "something remains"), ``--max-bytes`` not applied to SQLite, .nsys-rep and unknown files,
and a run of 256k letters (the URL pattern was quadratic in it).
"""

from __future__ import annotations

import base64
import codecs
import gzip
import html
import os
import shutil
import sqlite3
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kvprof.cli import main
from kvprof.tools.scrub import Rules, check_path, scrub_path
from kvprof.tools.scrub.normalize import fold, guess_encoding, unescape, views

CI_EXAMPLES = 25
LONG_EXAMPLES = int(os.environ.get("KVPROF_FUZZ_EXAMPLES", "0"))
NAME = "KVPROF_NORMALIZE_SECRET"
REAL = Path(__file__).parent / "fixtures" / "real"


def _settings(n: int = CI_EXAMPLES) -> settings:
    return settings(max_examples=max(n, LONG_EXAMPLES), deadline=None, database=None,
                    derandomize=LONG_EXAMPLES == 0,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------- strategies: classes of encodings

# A secret as envsafe flags it (looks_like_token: mixed case and digits, 20+ characters), or a
# token shape (found with no variable set).
secret_value = st.text("abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789", min_size=20, max_size=32).filter(
    lambda s: any(c.isdigit() for c in s) and any(c.isupper() for c in s) and any(c.islower() for c in s))
token_value = st.builds(lambda p, body: p + body, st.sampled_from(["hf_", "ghp_", "sk-", "AKIA", "glpat-"]),
                        st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=16, max_size=24))

LOOKALIKE = dict(zip("aeopcyxABEKMHOPCTX", "аеорсухАВЕКМНОРСТХ"))  # Cyrillic
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\x1b[0m", "\x1b[1;31m"]


@st.composite
def disguised(draw: Any, value: str) -> str:
    """``value`` as a reader still reads it: some characters swapped for look-alikes or
    full-width forms, invisible characters and ANSI sequences put between others."""
    out = []
    for c in value:
        how = draw(st.sampled_from(["same", "same", "lookalike", "fullwidth"]))
        if how == "lookalike" and c in LOOKALIKE:
            c = LOOKALIKE[c]
        elif how == "fullwidth" and "!" <= c <= "~":
            c = chr(ord(c) + 0xFEE0)
        out.append(c)
        if draw(st.integers(0, 4)) == 0:
            out.append(draw(st.sampled_from(INVISIBLE)))
    return "".join(out)


def _utf16_units(s: str) -> list[int]:
    data = s.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


TEXT_LAYERS = {
    "json": lambda s: "".join(f"\\u{u:04x}" for u in _utf16_units(s)),
    "python": lambda s: "".join(f"\\x{b:02x}" for b in s.encode()),
    "html-dec": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "html-hex": lambda s: "".join(f"&#x{ord(c):x};" for c in s),
    "html-named": lambda s: html.escape(s).replace("-", "&#45;"),
    "percent": lambda s: "".join(f"%{b:02X}" for b in s.encode()),
}
CODECS = ["utf-8", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be", "utf-16", "utf-32", "utf-8-sig"]


@st.composite
def byte_layer(draw: Any, s: str) -> str:
    """``s`` encoded to bytes in some codec (BOM or not), maybe gzipped, then base64 (either
    alphabet) or hex (either case)."""
    data = s.encode(draw(st.sampled_from(CODECS)))
    if draw(st.booleans()):
        data = gzip.compress(data, mtime=0)
    form = draw(st.sampled_from(["b64", "b64url", "hex", "HEX"]))
    if form == "b64":
        return base64.b64encode(data).decode()
    if form == "b64url":
        return base64.urlsafe_b64encode(data).decode()
    return data.hex().upper() if form == "HEX" else data.hex()


@st.composite
def hidden(draw: Any) -> tuple[str, str, dict[str, str]]:
    """(the secret, the secret through a random stack of 0-3 layers, the environment)."""
    kind = draw(st.sampled_from(["value", "token"]))
    value = draw(secret_value if kind == "value" else token_value)
    env = {NAME: value} if kind == "value" else {}
    s = draw(disguised(value)) if draw(st.booleans()) else value
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            s = TEXT_LAYERS[draw(st.sampled_from(sorted(TEXT_LAYERS)))](s)
        else:
            s = draw(byte_layer(s))
    return value, s, env


filler = st.text("abcdef ghij:klm,nop.qrs", max_size=12)


def _container(folder: Path, kind: str, text: str) -> Path:
    if kind == "json":
        p = folder / "t.pt.trace.json"
        p.write_bytes(orjson.dumps({"traceEvents": [{"ph": "M", "name": "x", "args": {"note": text}}]}))
    elif kind.startswith("log"):
        codec = kind.split(":")[1]
        p = folder / "run.log"
        p.write_bytes(("step 1\n" + text + "\nstep 2\n").encode(codec))
    elif kind == "zip":
        p = folder / "logs.zip"
        with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("inner/run.log", "step 1\n" + text + "\n")
    else:
        p = folder / "t.sqlite"
        con = sqlite3.connect(p)
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "kernel"), (2, text)])
        con.commit()
        con.close()
    return p


def _rules(env: dict[str, str]) -> Rules:
    return Rules(env, home="/home/nobody-here", hostnames=[])


CONTAINERS = ["json", "log:utf-8", "log:utf-16", "log:utf-32", "zip", "sqlite"]


ESC_IN_HTML = ("&#50;&#8203;" * 5 + "&#50;" * 13 + "&#27;&#91;&#48;&#109;&#50;&#50;&#65;&#97;")


@_settings()
@given(h=hidden(), kind=st.sampled_from(CONTAINERS), before=filler, after=filler)
# found by a long run: HTML's numeric references to a control character (an ANSI sequence's ESC)
# were decoded to nothing, leaving "[0m" inside the secret; a gzip inside base64 was seen by
# --check but not taken as a candidate by scrub's JSON pass
@example(h=("22222222222222222222Aa", ESC_IN_HTML, {NAME: "22222222222222222222Aa"}), kind="json", before="",
         after="")
@example(h=("hf_0000000000000000", "H4sIAAAAAAACA1NTNjQwsVYDkkZA0tIUSJhYUJMAAM1nwLlhAAAA", {}), kind="json",
         before="", after="")
# (and UTF-16 of text with zero-width and full-width characters has too few NULs for the guess)
@example(h=("ghp_0000000000000000", "ZwALIGgACyBwAAsgXwALIDAAMAAwADAAMAAwADAACyAwADAAMAALIDAAMAAwABD/EP8Q/w==", {}),
         kind="json", before="", after="")
@example(h=("hf_000A00A00000000000000",
            "aAALIGYACyA//xD/EP8Q/xAEMAAQ/xAECyAwADAAMAAwADAACyAwADAAMAAwAAsgMAAwABD/EP8Q/w==", {}),
         kind="json", before="", after="")
@example(h=("hf_0000000000000000", "aOKAi2ZfMDAwMOKAizAwMBtbMG0wMDAwMDAbWzBtMBtbMG0wG1swbTA=", {}), kind="json",
         before="", after="")  # ANSI sequences' ESC counted as binary
def test_a_secret_through_any_stack_of_layers_is_never_called_clean(h: tuple[str, str, dict[str, str]], kind: str,
                                                                     before: str, after: str) -> None:
    value, text, env = h
    with tempfile.TemporaryDirectory() as tmp:
        p = _container(Path(tmp), kind, before + " " + text + " " + after)
        reports = check_path(p, rules=_rules(env))
        assert reports and not all(r.clean for r in reports), (kind, text[:80])
        if kind == "zip":
            return  # a zip is reported, not rewritten
        scrub_path(p, env=env)
        again = check_path(p, rules=_rules(env))
        assert all(r.clean for r in again), [r.line() for r in again]
        assert value.encode() not in p.read_bytes()


@_settings()
@given(value=st.one_of(secret_value, token_value), data=st.data())
def test_a_secret_cut_across_any_number_of_json_strings(value: str, data: st.DataObject) -> None:
    """Cut at any points into any number of adjacent strings (up to its length): found, and
    scrub takes the strings it touches, keeping the strings around them."""
    env = {NAME: value} if not value.startswith(("hf_", "ghp_", "sk-", "AKIA", "glpat-")) else {}
    cuts = sorted(data.draw(st.sets(st.integers(1, len(value) - 1), min_size=1, max_size=len(value) - 1)))
    parts = [value[a:b] for a, b in zip([0, *cuts], [*cuts, len(value)])]
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp, "t.json")
        p.write_bytes(orjson.dumps({"traceEvents": [{"ph": "M", "name": "n",
                                                     "args": {"argv": ["python", *parts, " run.py"]}}]}))
        assert not check_path(p, rules=_rules(env))[0].clean
        scrub_path(p, env=env)
        argv = orjson.loads(p.read_bytes())["traceEvents"][0]["args"]["argv"]
        assert argv[0] == "python" and argv[-1] == " run.py"  # (a token's end is where its characters end)
        assert value not in "".join(argv) and check_path(p, rules=_rules(env))[0].clean


# ---------------------------------------------------------------- the views themselves


def test_views_map_back_to_the_characters_they_came_from() -> None:
    s = "x\u200bAB\\u0043%44&#69;\x1b[1mF"
    v = fold(s)
    assert v is not None and v.text == "xAB\\u0043%44&#69;F"
    u = unescape(v.text)
    assert u is not None and u.text == "xABCDEF"
    both = v.compose(u, "escapes")
    assert both.span(3, 4) == (4, 10)  # C came from \u0043
    assert [x.text for x in views(s)][-1] == "xABCDEF"


@pytest.mark.parametrize("codec", CODECS)
def test_encoding_is_recognised_with_or_without_bom(codec: str) -> None:
    data = "step 1 set_kv_buffer tokens=256\n".encode(codec)
    name, skip = guess_encoding(data)
    assert data[skip:].decode(name) == "step 1 set_kv_buffer tokens=256\n"


# ---------------------------------------------------------------- regressions

TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz012345"


def test_secret_in_a_file_or_folder_name_is_found_and_never_printed(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    (run / f"by.{TOKEN}").mkdir(parents=True)
    (run / f"by.{TOKEN}" / "a.log").write_text("fine\n")
    (run / f"{TOKEN}.log").write_text("fine\n")
    (run / "ok.log").write_text("fine\n")
    assert main(["scrub", "--check", str(run)]) == 1
    out = capsys.readouterr()
    assert "file or folder names" in out.err and TOKEN not in out.out + out.err
    assert "2 not clean" in out.out  # the folder and the named file (the file inside is shown redacted)
    assert main(["scrub", str(run)]) == 1  # a name cannot be scrubbed: something remains
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err and "ghp_abcdefgh" not in out.out + out.err


def test_utf32_log_and_numpy_unicode_array(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = "Zq8RkT2mWv9LpX4nBc7Ys1Dj"
    monkeypatch.setenv(NAME, value)
    log = tmp_path / "run.log"
    log.write_bytes(f"step 1\nkey {value}\n".encode("utf-32"))
    assert main(["scrub", "--check", str(log)]) == 1
    assert main(["scrub", str(log)]) == 0 and value.encode("utf-32-le") not in log.read_bytes()
    assert log.read_bytes().startswith(codecs.BOM_UTF32_LE) and "step 1" in log.read_bytes().decode("utf-32")
    np = pytest.importorskip("numpy")
    arr = tmp_path / "names.npy"
    np.save(arr, np.array(["kernel", value]))  # '<U' arrays are UTF-32 without a BOM
    assert main(["scrub", "--check", str(arr)]) == 1


def test_deflated_zip_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = "Zq8RkT2mWv9LpX4nBc7Ys1Dj"
    monkeypatch.setenv(NAME, value)
    z = tmp_path / "logs.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("run.log", "step\n" * 100 + f"token {value}\n")
    assert value.encode() not in z.read_bytes()
    assert main(["scrub", "--check", str(z)]) == 1


def test_secret_cut_across_twelve_json_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    value = "Zq8RkT2mWv9LpX4nBc7Ys1Dj"  # 12 strings of 2: no 8 adjacent ones hold it
    monkeypatch.setenv(NAME, value)
    parts = [value[i:i + 2] for i in range(0, len(value), 2)]
    assert len(parts) == 12
    p = tmp_path / "t.json"
    p.write_bytes(orjson.dumps({"traceEvents": [{"ph": "M", "name": "n", "args": {"argv": ["run", *parts, " x"]}}]}))
    assert main(["scrub", "--check", str(p)]) == 1
    assert main(["scrub", str(p)]) == 0
    argv = orjson.loads(p.read_bytes())["traceEvents"][0]["args"]["argv"]
    assert argv[0] == "run" and argv[-1] == " x" and value not in "".join(argv)


@pytest.mark.skipif(not (REAL / "two_stream.pt.trace.json.gz").exists(), reason="no real trace in this checkout")
def test_an_ordinary_word_as_a_secret_or_host_keeps_the_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """API_TOKEN=stream, DB_PASSWORD=decode, SESSION_SECRET=index_put and hosts h200, cpu: the
    traces keep their variant names, phases and device name, analysis gives the same groups,
    and the check still refuses the words where they stand as values or hosts."""
    from kvprof import api
    from kvprof.tools.scrub import rules as rules_module

    for name in ("two_stream.pt.trace.json.gz", "index_put.pt.trace.json.gz"):
        shutil.copy(REAL / name, tmp_path / name)
    groups = [api.analyze(api.open_run(tmp_path / n)).groups for n in sorted(os.listdir(tmp_path))]
    for k, v in {"API_TOKEN": "stream", "DB_PASSWORD": "decode", "SESSION_SECRET": "index_put"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(rules_module, "this_hostnames", lambda: ["h200", "cpu"])
    assert main(["scrub", str(tmp_path)]) == 0, capsys.readouterr().err
    for n, before in zip(sorted(os.listdir(tmp_path)), groups):
        result = api.analyze(api.open_run(tmp_path / n))
        cols = ["variant", "phase", "tokens"]
        assert result.groups[cols].equals(before[cols])
        assert result.summary.device["name"] == "NVIDIA H200"
    for line in ("export API_TOKEN=stream", "ssh user@h200 ls", "connect to https://cpu/"):
        log = tmp_path / "x.log"
        log.write_text(line + "\n")
        assert main(["scrub", "--check", str(log)]) == 1, line
    log.write_text("NVIDIA H200 decode stream index_put on cpu\n")
    assert main(["scrub", "--check", str(log)]) == 0


def test_a_real_secret_is_still_refused_beside_ordinary_words() -> None:
    r = Rules({"API_TOKEN": "stream", "HF_HOME_TOKEN": "Zq8RkT2mWv9LpX4nBc7Ys1Dj"}, home="/x", hostnames=["h200"])
    assert r.scrub("decode stream on NVIDIA H200")[1] is None
    assert r.scrub("key Zq8RkT2mWv9LpX4nBc7Ys1Dj")[1] == "env"
    assert r.scrub("user@h200")[1] == "host"


def test_secret_in_an_sqlite_table_name_is_something_remains(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "t.sqlite"
    con = sqlite3.connect(db)
    con.execute(f'CREATE TABLE "{TOKEN}" (value TEXT)')
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("INSERT INTO StringIds VALUES (1, ?)", (f"x {TOKEN}",))
    con.commit()
    con.close()
    assert main(["scrub", "--check", str(db)]) == 1
    assert main(["scrub", str(db)]) == 1
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM StringIds").fetchone()[0] != f"x {TOKEN}"  # the rest is scrubbed
    con.close()


@pytest.mark.parametrize("name, data", [
    ("t.sqlite", b"SQLite format 3\x00" + b"\x00" * 4096),
    ("r.nsys-rep", b"\x00" * 4096),
    ("blob.bin", b"\x01" * 4096),
])
def test_max_bytes_bounds_every_file_type(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          name: str, data: bytes) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    for args in (["scrub", "--check", str(p)], ["scrub", str(tmp_path)]):
        assert main([*args, "--max-bytes", "1K"]) == 2
        assert "--max-bytes raises it" in capsys.readouterr().err
    assert p.read_bytes() == data


def test_a_long_run_of_letters_is_judged_in_time() -> None:
    """A hang guard, not a speed target (benchmarks/bench_scrub_scaling.py measures): 64k letters
    took 13.8 s before and 256k minutes; now well under a second each."""
    r = Rules({"HF_TOKEN": "hf_Zq8RkT2mWv9LpX4nBc7Ys1Dj"}, home="/x", hostnames=["gpu-node-77"])
    t = time.perf_counter()
    assert r.scrub("a" * (256 << 10))[1] is None
    assert r.split_secrets(["abcdef"] * 40000) == []
    assert time.perf_counter() - t < 30


def test_a_host_name_behind_escapes_or_look_alikes_is_found() -> None:
    r = Rules({}, home="/x", hostnames=["gpu-node-77", "h200"])
    assert r.scrub("on gpu\u2011node\u201177 today") == ("[kvprof: host]", "host")  # non-breaking hyphens
    assert r.scrub("on gpu-n\u043ede-77") == ("[kvprof: host]", "host")  # a Cyrillic o
    assert r.scrub("user@h\\u0032\\u0030\\u0030")[1] == "host"
    assert r.scrub("NVIDIA H200 \u00b5s") == ("NVIDIA H200 \u00b5s", None)
