"""scrub: planted secrets leave no byte behind; kernel, runtime and NVTX rows stay intact."""

from __future__ import annotations

import argparse
import gzip
import secrets
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest

from kvprof.commands import scrub as scrub_command
from kvprof.core.errors import TraceError, UsageError
from kvprof.tools.scrub import MARKER, Rules, file_kind, scrub_path, scrub_tree

PLANTED = "KVPROF_TEST_SECRET"
HOME = "/home/alice"

KERNEL_NAMES = [
    "store_kv_cache",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...>>(long, T1)",
    "triton_poi_fused_index_put_0",
]
RUNTIME_NAMES = ["cudaLaunchKernel", "cudaGraphLaunch", "cudaStreamWaitEvent"]
NVTX_NAMES = ["kvprof.write variant=two_streams layer=3 tokens=512", "kvprof"]


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = secrets.token_hex(20)
    monkeypatch.setenv(PLANTED, value)
    return value


def _all_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data += gzip.decompress(data)
    return data


def make_export(path: Path, secret: str, *, wal_only: bool = False) -> None:
    """A small SQLite shaped like an nsys export, with the environment in it."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA secure_delete=OFF")  # so dropped pages keep their bytes, as on disk
    con.executescript(
        """
        CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT);
        CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, shortName INTEGER NOT NULL,
            demangledName INTEGER, mangledName INTEGER, graphNodeId INTEGER,
            gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
            returnValue INTEGER, callchainId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER,
            int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
            floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
        CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
        """
    )
    strings = [*KERNEL_NAMES, *RUNTIME_NAMES, *NVTX_NAMES]
    strings += [
        f"HF_TOKEN=hf_{secrets.token_urlsafe(20)} {PLANTED}={secret} PATH=/usr/bin HOME={HOME}",
        f"{PLANTED}={secret}",
        f"python3 -m kvprof capture --token {secret}",  # the value alone, no NAME=
        f"{HOME}/work/kvprof/kvprof/capture/run.py",
        "python3",
    ]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(strings, 1)))
    con.executemany(
        "INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
        [
            ("PROCESS_1:ENVIRONMENT_VARIABLE", f"{PLANTED}={secret}"),
            ("PROCESS_1:ENVIRONMENT_VARIABLE", "CUDA_VISIBLE_DEVICES=0"),
            ("PROCESS_1:ENVIRONMENT_VARIABLE", "LANG=C.UTF-8"),
            ("PROCESS_1:COMMAND_LINE", f"python3 {HOME}/work/run.py"),
            ("NSYS_VERSION", "2025.3.1"),
        ],
    )
    con.execute("INSERT INTO META_DATA_EXPORT VALUES ('EXPORT_SCHEMA_VERSION', '3.14')")
    kernels, runtime, nvtx = [], [], []
    for i in range(300):
        t = 1_000_000 + 1000 * i
        kernels.append((t, t + 400 + i % 7, 0, 1, 7 + i % 2, 10_000 + i, 42, 1 + i % 3, 1 + i % 3, None,
                        i if i % 2 else None, 128, 1, 1, 256, 1, 1))
        runtime.append((t - 50, t - 10, 1, 99, 10_000 + i, 4 + i % 3, 0, None))
        nvtx.append((t - 100, t + 500, 59, None, None, None, None, 99, None, 7, 0, None, 512, None,
                     None, None, None, None, None))
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({','.join('?' * 17)})", kernels)
    con.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES ({','.join('?' * 8)})", runtime)
    con.executemany(f"INSERT INTO NVTX_EVENTS VALUES ({','.join('?' * 19)})", nvtx)
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, domainId) VALUES (1, 2, 75, 'kvprof', 0)")
    con.execute("INSERT INTO ThreadNames VALUES (13, 0, 99)")
    # freed pages that still hold the secret (no VACUUM, secure_delete off)
    con.execute("CREATE TABLE junk (x TEXT)")
    con.executemany("INSERT INTO junk VALUES (?)", [(f"{PLANTED}={secret} {i}" * 20,) for i in range(200)])
    con.commit()
    con.execute("DROP TABLE junk")
    con.commit()
    con.close()


SUMMARY = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "SELECT count(*), sum(start), sum(end), sum(streamId), sum(correlationId), "
    "sum(shortName), sum(demangledName), sum(graphNodeId), group_concat(shortName) FROM CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "SELECT count(*), sum(start), sum(end), sum(correlationId), sum(nameId), "
    "sum(globalTid) FROM CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS": "SELECT count(*), sum(start), sum(end), sum(eventType), sum(textId), sum(domainId), "
    "sum(int64Value), group_concat(text) FROM NVTX_EVENTS",
    "names": "SELECT group_concat(s.value, '|') FROM CUPTI_ACTIVITY_KIND_KERNEL k "
    "JOIN StringIds s ON s.id = k.shortName",
    "runtime_names": "SELECT group_concat(s.value, '|') FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
    "JOIN StringIds s ON s.id = r.nameId",
    "nvtx_names": "SELECT group_concat(s.value, '|') FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId",
    "string_ids": "SELECT count(*), sum(id) FROM StringIds",
}


def summary(path: Path) -> dict[str, tuple]:
    con = sqlite3.connect(path)
    try:
        return {k: con.execute(q).fetchone() for k, q in SUMMARY.items()}
    finally:
        con.close()


def test_sqlite_scrub_removes_planted_values_and_keeps_rows(tmp_path: Path, secret: str) -> None:
    db = tmp_path / "report.sqlite"
    make_export(db, secret)
    assert secret.encode() in db.read_bytes()  # planted, including in free pages
    before = summary(db)

    report = scrub_path(db)

    assert secret.encode() not in db.read_bytes()
    assert summary(db) == before
    assert report.rewritten and report.kind == "sqlite"
    # the planted row goes; CUDA_VISIBLE_DEVICES and LANG are on kvprof's allow-list and stay
    assert report.env_rows == 1 and report.strings == 3 and report.paths == 2  # StringIds + COMMAND_LINE
    con = sqlite3.connect(db)
    meta = dict(con.execute("SELECT value, name FROM META_DATA_CAPTURE"))
    assert set(con.execute("SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT%'")) == {
        (MARKER,), ("CUDA_VISIBLE_DEVICES=0",), ("LANG=C.UTF-8",)}
    assert "python3 ~/work/run.py" in meta
    home_path = con.execute("SELECT value FROM StringIds WHERE id = 12").fetchone()
    assert home_path == ("~/work/kvprof/kvprof/capture/run.py",)
    assert con.execute("PRAGMA freelist_count").fetchone() == (0,)
    assert [r[0] for r in con.execute("SELECT value FROM StringIds ORDER BY id")][:8] == [
        *KERNEL_NAMES, *RUNTIME_NAMES, *NVTX_NAMES
    ]
    con.close()
    assert not list(tmp_path.glob(".*tmp*")) and sorted(p.name for p in tmp_path.iterdir()) == ["report.sqlite"]
    assert "1 environment rows, 3 strings removed, 2 home paths rewritten" in report.line()

    again = scrub_path(db)  # idempotent: nothing left to do, file untouched
    assert not again.rewritten and again.strings == again.env_rows == 0


def test_sqlite_wal_content_is_scrubbed_and_sidecars_removed(tmp_path: Path, secret: str) -> None:
    live = tmp_path / "live.sqlite"
    make_export(live, "x" * 8)
    con = sqlite3.connect(live)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("INSERT INTO StringIds VALUES (100, ?)", (f"{PLANTED}={secret}",))
    con.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, shortName) VALUES (5, 9, 0, 7, 1)"
    )
    con.commit()
    crashed = tmp_path / "crashed.sqlite"  # as a crash would leave it: main file + its -wal
    shutil.copy(live, crashed)
    shutil.copy(live.with_name("live.sqlite-wal"), crashed.with_name("crashed.sqlite-wal"))
    con.close()
    assert secret.encode() in crashed.with_name("crashed.sqlite-wal").read_bytes()

    report = scrub_path(crashed)

    assert report.rewritten and report.strings >= 1
    for side in ("-wal", "-shm", "-journal"):
        assert not crashed.with_name(crashed.name + side).exists()
    assert secret.encode() not in crashed.read_bytes()
    con = sqlite3.connect(crashed)
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone() == (301,)  # WAL row kept
    assert con.execute("SELECT value FROM StringIds WHERE id = 100").fetchone() == (MARKER,)
    con.close()


def test_unique_string_column_gets_distinct_markers(tmp_path: Path, secret: str) -> None:
    db = tmp_path / "u.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT UNIQUE)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, f"A_B={secret}"), (2, f"C_D={secret}"), (3, "k")])
    con.commit()
    con.close()
    report = scrub_path(db)
    assert report.strings == 2
    con = sqlite3.connect(db)
    values = [r[0] for r in con.execute("SELECT value FROM StringIds ORDER BY id")]
    con.close()
    assert values[0].startswith(MARKER) and values[1].startswith(MARKER) and values[2] == "k"
    assert secret.encode() not in db.read_bytes()


def chrome_trace(secret: str) -> dict:
    events = [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
         "args": {"name": f"python3 {HOME}/run.py --env {PLANTED}={secret}"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "thread 7 (python3)"}},
    ]
    for i in range(50):
        ts = 5.35e12 + i * 10.5
        events.append({"ph": "X", "cat": "kernel", "name": KERNEL_NAMES[i % 3], "pid": 0, "tid": 7,
                       "ts": ts, "dur": 1.25, "args": {"correlation": 100 + i, "stream": 7, "grid": [1, 1, 1]}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,
                       "ts": ts - 3, "dur": 2.0, "args": {"correlation": 100 + i}})
        events.append({"ph": "X", "cat": "user_annotation", "name": NVTX_NAMES[0], "pid": 7, "tid": 7,
                       "ts": ts - 5, "dur": 9.0, "args": {"External id": i}})
    events.append({"ph": "X", "cat": "python_function", "name": f"{HOME}/work/kvprof/kvcache/pool.py(12): write",
                   "pid": 7, "tid": 7, "ts": 5.35e12, "dur": 1.0})
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1, "pg_config": {"ranks": [0]}},
        "traceName": f"{HOME}/runs/r1/trace.json",
        "kvprof": {"HF_TOKEN": "hf_" + secrets.token_urlsafe(20), "env": [f"{PLANTED}={secret}"], "key": "kept"},
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": events,
    }


def _gpu_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "cuda_runtime", "user_annotation")]


@pytest.mark.parametrize("name", ["trace.json", "trace.pt.trace.json.gz"])
def test_chrome_trace_scrub(tmp_path: Path, secret: str, name: str) -> None:
    doc = chrome_trace(secret)
    raw = orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)

    report = scrub_path(path)

    assert report.rewritten and report.kind == "json" and report.strings == 3 and report.paths == 2
    data = _all_bytes(path)
    assert secret.encode() not in data and HOME.encode() not in data
    new = orjson.loads(gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes())
    assert _gpu_events(new) == _gpu_events(doc)  # every kernel, runtime and annotation event unchanged
    assert len(new["traceEvents"]) == len(doc["traceEvents"])
    assert sum(e.get("ts", 0) for e in new["traceEvents"]) == sum(e.get("ts", 0) for e in doc["traceEvents"])
    assert new["traceName"] == "~/runs/r1/trace.json"
    assert new["kvprof"]["HF_TOKEN"] == MARKER and new["kvprof"]["key"] == "kept"
    assert new["distributedInfo"] == doc["distributedInfo"] and new["baseTimeNanoseconds"] == doc["baseTimeNanoseconds"]
    assert new["traceEvents"][0]["args"]["name"] == MARKER
    assert new["traceEvents"][-1]["name"] == "~/work/kvprof/kvcache/pool.py(12): write"


def test_clean_trace_is_not_rewritten(tmp_path: Path, secret: str) -> None:
    path = tmp_path / "clean.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2}]}')
    before = path.stat().st_mtime_ns
    report = scrub_path(path)
    assert not report.rewritten and path.stat().st_mtime_ns == before
    assert "unchanged" in report.line()


def test_rules_keep_lowercase_messages_and_kernel_names() -> None:
    rules = Rules({"HOME": HOME, "http_proxy": "http://proxy:3128"}, home=HOME)
    for keep in [*KERNEL_NAMES, *NVTX_NAMES, "a==b", "x=1", "operator=", "N=128"]:
        assert rules.scrub(keep) == (keep, None)
    for drop in ["PATH=/usr/bin", "X_Y=", "env http_proxy=http://x python", "\x00HF_HOME=/data\x00"]:
        assert rules.scrub(drop) == (MARKER, "env")
    # a process's environ block (NUL-separated) is cut down to kvprof's allow-list, not dropped whole
    assert rules.scrub("\x00LANG=C\x00") == ("\x00LANG=C\x00", None)
    assert rules.scrub("LANG=C\x00HF_HOME=/data\x00HOME=/home/alice") == ("LANG=C\x00HOME=~\x00", "env")
    assert rules.scrub(f"{HOME}/x /Users/bob/y /mnt/home/z /root/out /rooted") == (
        "~/x ~/y /mnt/home/z ~/out /rooted", "home"
    )


def test_run_folder_keeps_no_byte_of_the_planted_secret(tmp_path: Path, secret: str) -> None:
    run = tmp_path / "run"
    (run / "nsys").mkdir(parents=True)
    make_export(run / "nsys" / "pass.sqlite", secret)
    (run / "kineto.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(chrome_trace(secret))))
    (run / "nsys" / "pass.nsys.log").write_text(f"starting\n{PLANTED}={secret}\nGenerated:\n")
    (run / "manifest.json").write_bytes(orjson.dumps({"env_names": [PLANTED, "PATH"], "out": f"{HOME}/run"}))
    (run / "nsys" / "pass.nsys-rep").write_bytes(b"\x00binary report built from the allowlisted env\x00")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"trace": [f"{HOME}/run/kineto.pt.trace.json.gz"], "n": [1]}), run / "events.parquet")

    reports = scrub_tree(run)

    kinds = sorted(r.kind for r in reports)
    assert kinds == ["json", "json", "nsys-rep", "parquet", "sqlite", "text"]
    assert pq.read_table(run / "events.parquet").column("trace").to_pylist() == ["~/run/kineto.pt.trace.json.gz"]
    assert not any(r.leaks for r in reports)
    files = [p for p in run.rglob("*") if p.is_file()]
    assert files and all(secret.encode() not in _all_bytes(p) for p in files)
    assert not [p for p in run.rglob(".*")]


def test_unrewritable_file_holding_the_secret_is_reported(tmp_path: Path, secret: str) -> None:
    rep = tmp_path / "x.nsys-rep"
    rep.write_bytes(b"\x00" + f"{PLANTED}={secret}".encode() + b"\x00")
    report = scrub_path(rep)
    assert report.leaks == (PLANTED,) and "do not share" in report.line()
    assert rep.read_bytes().count(secret.encode()) == 1  # untouched


# ------------------------------------------------------------ errors and exit codes


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        scrub_path(tmp_path / "nope.sqlite")
    assert "no such file" in _one_line(info)


def test_not_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "fake.sqlite"
    path.write_text("hello, not a database\n" * 10)
    with pytest.raises(TraceError) as info:
        scrub_path(path)
    assert "not an SQLite database" in _one_line(info)
    assert path.read_text().startswith("hello")


def test_corrupt_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.sqlite"
    make_export(path, "y" * 10)
    data = bytearray(path.read_bytes())
    data[4096 * 2 : 4096 * 2 + 2000] = secrets.token_bytes(2000)
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError) as info:
        scrub_path(path)
    assert "corrupt SQLite" in _one_line(info)
    assert path.read_bytes() == bytes(data) and sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.sqlite"]


def test_truncated_gzip_trace(tmp_path: Path, secret: str) -> None:
    path = tmp_path / "trace.json.gz"
    whole = gzip.compress(orjson.dumps(chrome_trace(secret)))
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceError) as info:
        scrub_path(path)
    assert "truncated gzip" in _one_line(info)


def test_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text('{"traceName": "/home/alice/t.json", "traceEvents": [{"ph": "X", ')  # truncated
    with pytest.raises(TraceError) as info:
        scrub_path(path)
    assert "not valid JSON" in _one_line(info)
    assert path.read_text().startswith('{"traceName": "/home/alice')  # original kept
    path.write_text("garbage")
    with pytest.raises(TraceError, match="not JSON"):
        scrub_path(path)


def test_unknown_file_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x00\x01")
    assert file_kind(path) is None
    report = scrub_path(path)  # capture scrubs every file it wrote: unknown ones are only checked
    assert report.kind == "other" and not report.changed and not report.leaks
    code = scrub_command.run(argparse.Namespace(paths=[path]))  # named on the command line: an error
    err = capsys.readouterr().err
    assert code == 2 and "unknown file type" in err and err.count("\n") == 1


def test_report_str_is_the_line_with_the_file_name(tmp_path: Path, secret: str) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(orjson.dumps({"env": f"{PLANTED}={secret}"}))
    report = scrub_path(path)
    assert report.changed and str(report).startswith("t.json: 1 strings removed")
    assert report.line().startswith(str(path))


def _run(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str, str]:
    code = scrub_command.run(argparse.Namespace(paths=list(paths)))
    out, err = capsys.readouterr()
    return code, out, err


def test_command_exit_codes(tmp_path: Path, secret: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert scrub_command.__doc__ and scrub_command.add_arguments and scrub_command.run
    db = tmp_path / "a.sqlite"
    make_export(db, secret)
    rep = tmp_path / "a.nsys-rep"
    rep.write_bytes(b"\x00clean\x00")
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not sqlite")

    code, out, err = _run(capsys, rep)
    assert code == 2 and "cannot be rewritten" in out and len(out.splitlines()) == 1

    code, out, err = _run(capsys, db, rep)
    assert code == 0 and len(out.splitlines()) == 2 and "bytes" in out.splitlines()[0]

    code, out, err = _run(capsys, tmp_path / "missing.sqlite", bad, db)
    assert code == 2 and len(err.splitlines()) == 2 and "unchanged" in out  # first error decides

    code, out, err = _run(capsys, bad)
    assert code == 3 and err.count("\n") == 1

    leaky = tmp_path / "leaky.nsys-rep"
    leaky.write_bytes(secret.encode())
    code, out, err = _run(capsys, leaky, db)
    assert code == 1 and PLANTED in err and secret not in err + out

    code, out, err = _run(capsys, tmp_path)  # a folder: every file is tried
    assert code == 3 and "bad.sqlite" in err and "leaky.nsys-rep" in err and "a.sqlite" in out

    bad.unlink()
    code, out, err = _run(capsys, tmp_path)
    assert code == 1  # the folder still holds leaky.nsys-rep


# ------------------------------------------------------------ real exports (tests/fixtures/real)

REAL = Path(__file__).parent / "fixtures" / "real"


def _replant_environment(db: Path) -> None:
    """The committed export is scrubbed already: put back what nsys stored there (env rows,
    KEY=VALUE blocks, the device environment) so the scrub has real work to do."""
    con = sqlite3.connect(db)
    env = [f"VAR_{i}=value-{i}" for i in range(60)] + [
        "LD_LIBRARY_PATH=/work/main/.gpu/lib:/usr/local/nvidia/lib64", "NV_LIBNCCL_PACKAGE=libnccl2=2.21",
        "UV_CONCURRENT_DOWNLOADS=8", "HF_TOKEN=hf_replantedTokenValue0123456789"]
    con.executemany("INSERT INTO META_DATA_CAPTURE(name, value) VALUES (?, ?)",
                    [(f"PROCESS_{i % 3}:ENVIRONMENT_VARIABLE", e) for i, e in enumerate(env)])
    top = con.execute("SELECT max(id) FROM StringIds").fetchone()[0]
    con.executemany("INSERT INTO StringIds(id, value) VALUES (?, ?)",
                    [(top + 1 + i, " ".join(env[i * 8:(i + 1) * 8])) for i in range(8)])
    con.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'DeviceEnvironment'", (";".join(env),))
    con.commit()
    con.close()


@pytest.mark.skipif(not (REAL / "nsys_run.sqlite").exists(), reason="no real nsys export in this checkout")
def test_real_nsys_export_reads_the_same_after_scrub(tmp_path: Path) -> None:
    """A real H200 export with its environment put back: every env row and KEY=VALUE
    string goes, and kvprof's reader returns the very same event table."""
    from kvprof.trace.nsys_sqlite import read_nsys_sqlite

    db = tmp_path / "nsys_run.sqlite"
    shutil.copy(REAL / "nsys_run.sqlite", db)
    _replant_environment(db)
    before = read_nsys_sqlite(db).events
    report = scrub_path(db)
    assert report.rewritten and report.env_rows >= 64 and report.strings >= 8
    after = read_nsys_sqlite(db).events
    assert after.equals(before)
    con = sqlite3.connect(db)
    env_block = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'DeviceEnvironment'").fetchone()
    left = [v for (v,) in con.execute("SELECT value FROM StringIds") if "=" in v and not v.startswith("kvprof.")]
    con.close()
    # the device environment keeps only what is on kvprof's allow-list (envsafe.allowed)
    assert env_block == ("LD_LIBRARY_PATH=/work/main/.gpu/lib:/usr/local/nvidia/lib64",) and left == []
    for needle in (b"VAR_1", b"NV_LIBNCCL_PACKAGE", b"UV_CONCURRENT_DOWNLOADS", b"hf_replanted"):
        assert needle not in db.read_bytes()


@pytest.mark.parametrize("name", ["index_put.pt.trace.json.gz", "two_stream.pt.trace.json.gz"])
def test_real_kineto_trace_reads_the_same_after_scrub(tmp_path: Path, name: str) -> None:
    if not (REAL / name).exists():
        pytest.skip("no real Kineto trace in this checkout")
    from kvprof.trace.kineto import read_kineto

    path = tmp_path / name
    shutil.copy(REAL / name, path)
    before = read_kineto(path)
    scrub_path(path)
    after = read_kineto(path)
    assert after.events.equals(before.events) and after.kvprof == before.kvprof


def test_a_gzipped_log_is_scrubbed_and_stays_gzipped(tmp_path: Path, secret: str) -> None:
    """Sample logs are kept gzipped beside their runs: scrub reads them as text (they were read
    as JSON and refused), rewrites them gzipped, and --check finds the planted line first."""
    from kvprof.tools.scrub import check_path

    path = tmp_path / "capture.txt.gz"
    path.write_bytes(gzip.compress(f"starting\n{PLANTED}={secret}\ndone\n".encode()))
    assert file_kind(path) == "text"
    assert [r for r in check_path(path) if not r.clean]
    report = scrub_path(path)
    assert report.rewritten
    text = gzip.decompress(path.read_bytes()).decode()
    assert secret not in text and text.startswith("starting\n") and text.endswith("done\n")
    assert all(r.clean for r in check_path(path))
