"""A compiled launcher for kvprof's Triton kernels: the eager write's host path without
Triton's per-call launch machinery.

``kernel[grid](*args, **constexprs)`` runs Triton's ``JITFunction.run`` on every call: it
binds the arguments, specialises each one, formats the options into the kernel cache's key,
checks the kernel's globals and builds launch metadata before the launch itself, tens of
µs of host time per write. A :class:`CompiledLauncher` makes the first launch of each
specialisation through that path (which compiles or loads the kernel and returns Triton's
``CompiledKernel``), keeps the ``CompiledKernel`` under its own key, and launches later
calls with the same key through the kernel's own launcher (``CompiledKernel.run``, the call
``JITFunction.run`` ends with), on the stream and device Triton would use. Two more layers
of that call are skipped where they do nothing for these kernels: each tensor goes to the
launcher as its address, read once for the key (Triton's C launcher otherwise calls
``data_ptr`` again and asks the driver whether each pointer is a device pointer: the key
holds whether each tensor is a CUDA tensor, so a host tensor where a CUDA one was takes
Triton's path and its error), and where ``run`` is Triton 3.3-3.6's ``CudaLauncher``
allocating no scratch memory, its C launch function is called directly
(:func:`direct_launch`).

The key is at least as fine as Triton's specialisation: per tensor its dtype, device type and
whether its address is a multiple of 16; per scalar its Python type, and per int whether it is 1,
whether it is a multiple of 16 (both only where Triton specialises the parameter) and which
of int32/int64/uint64 holds it; the value of each int a caller passes as ``fixed`` (those
that stay the same for a model, such as strides: their values decide their specialisation);
every constexpr value and launch option; the current device.
So the kernel a key finds is the one Triton's own cache would have launched. Launch
options go to the first (JIT) launch: the number of warps, programmatic dependent launch
(``launch_pdl``, which Triton compiles into the ``CompiledKernel``'s launch metadata) and
``enable_fp_fusion``.

A writer can skip its own Python as well (:class:`SignedLaunch`): the C++ signature of its
tensors (:mod:`kvprof.kvcache.signature`, loaded at the first compiled launch) reads every
tensor's dtype, device, shape, strides, 16-byte alignment and address in one call, a fraction
of a µs where Python's attribute reads take several; a writer keys its call plan by those
bytes and its other arguments, and keeps, per plan and constexprs, the kernel a launch through
:meth:`CompiledLauncher.launch` kept (:meth:`CompiledLauncher.signed`). Equal bytes mean
everything that key holds of the tensors is equal, so the kept kernel is the one the key would
find. Without a C++ compiler, with ``KVPROF_TRITON_SIGNATURE=0`` at import, or for tensors it
does not read (a subclass, no storage), writers take their Python path (``signature.state()``
says why).

Every call that takes the JIT path is counted with its reason (:func:`launch_counts`):
a specialisation seen for the first time, a launch hook set (Triton's profiler hooks need
its own path), arguments whose key cannot be formed. Under Triton's interpreter
(``TRITON_INTERPRET=1``, the CPU path) and with ``KVPROF_TRITON_LAUNCHER=0`` in the
environment at import (or :func:`set_enabled` False) every call takes Triton's own path,
counted under that reason.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from kvprof.kvcache import signature

ENV_DISABLE = "KVPROF_TRITON_LAUNCHER"  # "0": every launch through Triton's JITFunction.run

# reasons a call took Triton's own path
FIRST = "first launch of a specialisation"
HOOK = "a Triton launch hook is set"
UNKEYED = "arguments without a key (a type the key does not know)"
INTERPRETED = "Triton's interpreter"
DISABLED = f"{ENV_DISABLE}=0"
UNSUPPORTED = "this Triton has no CompiledKernel.run taking every parameter (3.3+)"

_INT32 = (-(1 << 31), (1 << 31) - 1)
_REGISTRY: list[CompiledLauncher] = []
_LOCK = threading.Lock()


def triton_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string; (0, 0) where it does not read."""
    try:
        major, minor = text.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return 0, 0


def _disabled_by_env(name: str = ENV_DISABLE) -> bool:
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "no", "off")


_ON = not _disabled_by_env()  # read once, at import (a per-call read of the environment costs the path)

def set_enabled(on: bool) -> bool:
    """Turn the compiled path on or off for every launcher (off: every call takes Triton's
    path, counted under ``KVPROF_TRITON_LAUNCHER=0``); returns the previous setting."""
    global _ON
    before, _ON = _ON, bool(on)
    return before


def _int_class(v: int) -> int:
    """0: int32, 1: int64, 2: uint64 (Triton's three integer argument types)."""
    if _INT32[0] <= v <= _INT32[1]:
        return 0
    return 2 if v >= 1 << 63 else 1


def hook_set(hook: Any) -> bool:
    """Whether a Triton launch hook would run: a callable (Triton up to 3.4: None when unset), or
    a ``HookChain`` holding calls (3.5 on: the knob is always a chain, empty when nothing is
    set; the launcher still calls an empty one, which does nothing). Read as "set", an empty
    chain sent every launch through Triton's path (docs/benchmarks.md, "Eager launches")."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if isinstance(calls, list) else True


def key_source(example: Sequence[Any], specialized: Sequence[bool]) -> str:
    """The source of the key function for arguments shaped like ``example`` (``a``: the
    argument tuple). It returns (key, launch arguments): the key holds per tensor its dtype,
    whether it is a CUDA tensor and its 16-byte alignment, per int its type, class and (where
    ``specialized``) ==1 and %16, per float or bool its type, else the value itself; the
    launch arguments are ``a`` with each tensor replaced by its address, read once here (the
    launcher then neither calls ``data_ptr`` again nor asks the driver about the pointer)."""
    parts: list[str] = []
    body: list[str] = []
    call: list[str] = []
    for i, (value, spec) in enumerate(zip(example, specialized)):
        a = f"a{i}"
        if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
            body.append(f"    p{i} = {a}.data_ptr()")
            parts.append(f"{a}.dtype, {a}.is_cuda, not p{i} & 15")
            call.append(f"p{i}")
            continue
        call.append(a)
        if type(value) is int:
            # one number per int: -1 for 1; else %16 (0/1) + 2 x its class (int32 1, int64 3, uint64 4)
            cls = f"(-2147483648 <= {a} <= 2147483647 or cls({a}) + 2)"
            parts.append(f"type({a}), -1 if {a} == 1 else (not {a} & 15) + 2 * {cls}" if spec
                         else f"type({a}), {cls}")
        elif isinstance(value, (bool, float)):
            parts.append(f"type({a})")
        else:
            parts.append(a)

    def tup(items: list[str]) -> str:
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"

    names = [f"a{i}" for i in range(len(example))]
    unpack = f"    {', '.join(names)}{',' if len(names) == 1 else ''} = a" if names else "    pass"
    return "\n".join(["def key(a):", unpack, *body, f"    return {tup(parts)}, {tup(call)}", ""])


def direct_launch(run: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """Triton's per-kernel C launch function behind ``CompiledKernel.run`` and the arguments
    ``run`` (a ``CudaLauncher``, Triton 3.3-3.6) puts between the function and the kernel's
    metadata, or None where ``run`` is not of that form or would allocate scratch memory.

    ``CudaLauncher.__call__`` builds two closures, allocates no scratch for these kernels and
    calls ``launch(gridX, gridY, gridZ, stream, function, cooperative[, pdl], global_scratch
    [, profile_scratch], *rest)``; which optional arguments it passes is read from the names
    its code uses. Calling ``launch`` directly skips that Python layer."""
    launch = getattr(run, "launch", None)
    code = getattr(type(run).__dict__.get("__call__"), "__code__", None)
    if launch is None or code is None or type(run).__name__ != "CudaLauncher":
        return None
    if code.co_varnames[:code.co_argcount] != ("self", "gridX", "gridY", "gridZ", "stream", "function") \
            or not code.co_flags & 0x04:  # *args
        return None
    names = set(code.co_names)
    if not {"launch", "launch_cooperative_grid", "global_scratch_size"} <= names or names & {
            "arg_annotations", "kernel_signature", "gsan_enabled"}:  # 3.7 on: another launch function
        return None
    if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 0):
        return None
    prefix: list[Any] = [bool(run.launch_cooperative_grid)]
    if "launch_pdl" in names:
        prefix.append(bool(run.launch_pdl))
    prefix.append(None)  # global scratch
    if "profile_scratch_size" in names:
        prefix.append(None)
    return launch, tuple(prefix)


class CompiledLauncher:
    """Launches one ``@triton.jit`` kernel; see the module's docstring.

    ``launch(grid, args, consts, num_warps, pdl, fp_fusion)``: ``args`` the runtime
    arguments in the kernel's order, ``consts`` the values of its constexpr parameters that
    follow them, in order (every constexpr given: no defaults)."""

    def __init__(self, fn: Any, name: str, *, compiled: bool | None = None,
                 device: Callable[[], int] | None = None, stream: Callable[[int], int] | None = None,
                 hooks: Callable[[], bool] | None = None) -> None:
        """``compiled``/``device``/``stream``/``hooks`` are for tests (a fake kernel on a CPU):
        by default they come from Triton (``compiled``: the kernel is not the interpreter's)."""
        self.fn = fn
        self.name = name
        self._kernels: dict[tuple[Any, ...], tuple[Any, Any, Any, Any]] = {}
        self._keyfn: Callable[[Sequence[Any]], tuple[tuple[Any, ...], tuple[Any, ...]]] | None = None
        self._const_names: tuple[str, ...] | None = None
        self._compiled = compiled
        self._off: str | None = None  # why every call takes Triton's path, for good
        self._device, self._stream, self._hooks = device, stream, hooks
        self.fast = 0
        self.signed_calls = 0  # of ``fast``: launched by a writer's SignedLaunch
        self.slow: Counter[str] = Counter()
        _REGISTRY.append(self)

    # -- set-up, once -------------------------------------------------------------------
    def _setup(self) -> str | None:
        """None when the fast path may run, else why every call takes Triton's path."""
        if self._compiled is None:
            try:
                from triton.runtime.interpreter import InterpretedFunction
            except ImportError:
                InterpretedFunction = ()  # noqa: N806  (no interpreter: nothing is one)
            self._compiled = not isinstance(self.fn, InterpretedFunction)
        if not self._compiled:
            return INTERPRETED
        if self._device is None or self._stream is None or self._hooks is None:
            try:
                import triton
                from triton import knobs
            except ImportError:
                return UNSUPPORTED
            if triton_version(triton.__version__) < (3, 3):  # constexprs joined the launcher's arguments in 3.3
                return UNSUPPORTED
            if self._hooks is None:
                runtime = knobs.runtime
                self._hooks = lambda: hook_set(runtime.launch_enter_hook) or hook_set(runtime.launch_exit_hook)
        if self._device is None or self._stream is None:
            from triton.runtime import driver

            active = driver.active
            # the current device as Triton reads it (torch.cuda.current_device), without its lazy-init
            # check: the fast path runs only after a launch through Triton's path initialised CUDA
            import torch

            self._device = self._device or getattr(torch._C, "_cuda_getDevice", None) or active.get_current_device
            self._stream = self._stream or active.get_current_stream
        signature.load()  # the writers' fast path; a failure only leaves them on their Python path
        return None

    def _names(self, nargs: int, nconsts: int) -> tuple[str, ...]:
        names = tuple(getattr(self.fn, "arg_names", ()))
        if len(names) != nargs + nconsts:
            raise TypeError(f"{self.name}: {nargs} arguments and {nconsts} constexprs given, the kernel has "
                            f"{len(names)} parameters")
        return names[nargs:]

    def _make_key(self, args: Sequence[Any]) -> Callable[[Sequence[Any]], tuple[tuple[Any, ...], tuple[Any, ...]]]:
        skip = set()
        for p in getattr(self.fn, "do_not_specialize", ()) or ():
            skip.add(p if isinstance(p, int) else list(getattr(self.fn, "arg_names", [])).index(p))
        scope: dict[str, Any] = {"cls": _int_class, "type": type}
        exec(key_source(args, [i not in skip for i in range(len(args))]), scope)  # noqa: S102
        return scope["key"]  # type: ignore[no-any-return]

    # -- the call -----------------------------------------------------------------------
    def launch(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: tuple[Any, ...], num_warps: int,
               pdl: bool = False, fp_fusion: bool = True, fixed: tuple[int, ...] = ()) -> None:
        """``fixed``: int arguments that follow ``args`` and change rarely (a model's strides, a
        cache's rows), keyed by their values: a caller that passes the same values call after
        call skips their per-int key. Python ints: an int's value decides everything Triton
        specialises it on, so a key holding the value is at least as fine. A value of another
        type is never kept; one equal to a kept int (``True`` for 1, ``3.0`` for 3) finds that
        kernel, whose C launcher takes ``True`` as 1 and refuses a float before launching (a
        ``TypeError``: the call then takes Triton's path, counted as unkeyed)."""
        keyfn = self._keyfn
        if keyfn is None or not _ON:
            self._first(grid, args, consts, num_warps, pdl, fp_fusion, fixed)
            return
        if self._hooks():  # type: ignore[misc]
            self._jit(grid, args + fixed, consts, num_warps, pdl, fp_fusion, None, HOOK)
            return
        try:
            arg_key, call = keyfn(args)
            device = self._device()  # type: ignore[misc]
            key = (device, consts, num_warps, pdl, fp_fusion, arg_key, fixed)
            found = self._kernels.get(key)
        except (AttributeError, TypeError, ValueError):  # arguments of another kind or number than the first call's
            self._jit(grid, args + fixed, consts, num_warps, pdl, fp_fusion, None, UNKEYED)
            return
        if found is None:
            if fixed and any(type(i) is not int for i in fixed):  # keyed by value: ints only
                self._jit(grid, args + fixed, consts, num_warps, pdl, fp_fusion, None, UNKEYED)
                return
            self._jit(grid, args + fixed, consts, num_warps, pdl, fp_fusion, key, FIRST)
            return
        run, function, packed, direct = found
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        stream = self._stream(device)  # type: ignore[misc]
        try:
            if direct is not None:
                direct[0](grid[0], gy, gz, stream, function, *direct[1], packed, None, None, None, *call, *fixed,
                          *consts)
            else:
                run(grid[0], gy, gz, stream, function, packed, None, None, None, *call, *fixed, *consts)
        except TypeError:  # refused before launching, as the C launcher parses its arguments first: a
            # fixed value equal to a kept int but of another type (3.0 for 3) -- Triton's path
            self._jit(grid, args + fixed, consts, num_warps, pdl, fp_fusion, None, UNKEYED)
            return
        self.fast += 1

    def _first(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: tuple[Any, ...], num_warps: int,
               pdl: bool, fp_fusion: bool, fixed: tuple[int, ...] = ()) -> None:
        """Until the key exists: Triton's path, with the reason the key does not (yet) exist."""
        reason = self._off
        if reason is None:
            reason = DISABLED if not _ON else self._setup()
            if reason is None:
                try:
                    self._const_names = self._names(len(args) + len(fixed), len(consts))
                    self._keyfn = self._make_key(args)
                except (TypeError, ValueError, SyntaxError) as exc:
                    reason = f"{UNKEYED}: {exc}"
            if reason is not None and reason != DISABLED:
                self._off = reason  # for good: the kernel or this Triton does not change
        elif not _ON:
            reason = DISABLED
        if reason is not None:
            self._jit(grid, args + fixed, consts, num_warps, pdl, fp_fusion, None, reason)
            return
        self.launch(grid, args, consts, num_warps, pdl, fp_fusion, fixed)

    def _jit(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: tuple[Any, ...], num_warps: int,
             pdl: bool, fp_fusion: bool, key: tuple[Any, ...] | None, reason: str) -> None:
        """Triton's own launch (``JITFunction.run``); with ``key``, its ``CompiledKernel`` is kept."""
        self.slow[reason] += 1
        names = self._const_names or self._names(len(args), len(consts))
        options: dict[str, Any] = {"num_warps": num_warps}
        if pdl:
            options["launch_pdl"] = True
        if not fp_fusion:
            options["enable_fp_fusion"] = False
        kernel = self.fn[grid](*args, **dict(zip(names, consts)), **options)
        if key is None or kernel is None:
            return
        run = getattr(kernel, "run", None)
        if run is None or not hasattr(kernel, "packed_metadata") or not hasattr(kernel, "function"):
            self._keyfn, self._off = None, UNSUPPORTED  # every later call: Triton's path
            return
        meta = getattr(kernel, "metadata", None)
        if meta is not None and bool(getattr(meta, "launch_pdl", pdl)) != bool(pdl):
            return  # a kernel whose launch attribute is not the one asked for is never reused
        self._kernels[key] = (run, kernel.function, kernel.packed_metadata, direct_launch(run))

    def signed(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: tuple[Any, ...], num_warps: int,
               pdl: bool = False, fp_fusion: bool = True, fixed: tuple[int, ...] = (),
               fn: Any = None) -> SignedLaunch | None:
        """After a :meth:`launch` with these arguments: the kernel it kept, as a
        :class:`SignedLaunch` of this grid on the current device; None where none was kept
        (Triton's path, a key not formed, a non-int fixed value). ``fn``: the kernel the caller
        looked this launcher up by (default the launcher's own)."""
        if self._keyfn is None or not _ON or any(type(i) is not int for i in fixed):
            return None
        try:
            arg_key, _ = self._keyfn(args)
            device = self._device()  # type: ignore[misc]
            found = self._kernels.get((device, consts, num_warps, pdl, fp_fusion, arg_key, fixed))
        except (AttributeError, TypeError, ValueError):
            return None
        if found is None:
            return None
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        return SignedLaunch(self, self.fn if fn is None else fn, (grid[0], gy, gz), device, found)

    def launch_signed(self, grid: tuple[int, ...], args: tuple[Any, ...], consts: tuple[Any, ...], num_warps: int,
                      pdl: bool, fp_fusion: bool, fixed: tuple[int, ...], fn: Any) -> SignedLaunch | None:
        """:meth:`launch`, then :meth:`signed` for the same arguments (a writer's first call of a plan)."""
        self.launch(grid, args, consts, num_warps, pdl, fp_fusion, fixed)
        return self.signed(grid, args, consts, num_warps, pdl, fp_fusion, fixed, fn)

    def counts(self) -> dict[str, Any]:
        """Launches on the compiled path (of them, by a writer's SignedLaunch), Triton's path by reason, kept."""
        return {"compiled": self.fast, "signed": self.signed_calls, "triton": dict(self.slow),
                "kernels": len(self._kernels)}


class SignedLaunch:
    """A kept kernel's launch for one call plan of a writer, made again without a key.

    A writer keeps it under the C++ signature of the call's tensors (``SIGNATURE``) and its
    other arguments, which together decide everything the launcher's key holds: calling it
    with the call's arguments (the tensors' addresses in place of the tensors) launches what
    :meth:`CompiledLauncher.launch` would. ``False`` (nothing launched; the writer takes its
    Python path) where that path would not take this kernel: the launcher switched off, a
    launch hook set, another current device, the kernel replaced (``fn``), or the C launcher
    refusing an argument."""

    __slots__ = ("device", "fn", "grid", "kept", "launcher")

    def __init__(self, launcher: CompiledLauncher, fn: Any, grid: tuple[int, int, int], device: int,
                 kept: tuple[Any, Any, Any, Any]) -> None:
        self.launcher, self.fn, self.grid, self.device, self.kept = launcher, fn, grid, device, kept

    def __call__(self, fn: Any, call: tuple[Any, ...]) -> bool:
        """Launch ``call`` if ``fn`` is still the kernel it was kept for; whether it did."""
        launcher = self.launcher
        if fn is not self.fn or not _ON or launcher._hooks():  # type: ignore[misc]
            return False
        device = launcher._device()  # type: ignore[misc]
        if device != self.device:
            return False
        run, function, packed, direct = self.kept
        gx, gy, gz = self.grid
        stream = launcher._stream(device)  # type: ignore[misc]
        try:
            if direct is not None:
                direct[0](gx, gy, gz, stream, function, *direct[1], packed, None, None, None, *call)
            else:
                run(gx, gy, gz, stream, function, packed, None, None, None, *call)
        except TypeError:  # refused before launching (the C launcher parses its arguments first)
            return False
        launcher.fast += 1
        launcher.signed_calls += 1
        return True


_BY_FN: dict[int, CompiledLauncher] = {}


def launcher_for(fn: Any, name: str | None = None) -> CompiledLauncher:
    """The one launcher of kernel ``fn`` (made on first use): writers look it up per call, so
    a kernel replaced at run time (lab's probes do) gets its own."""
    found = _BY_FN.get(id(fn))
    if found is None or found.fn is not fn:
        with _LOCK:
            found = _BY_FN.get(id(fn))
            if found is None or found.fn is not fn:
                found = _BY_FN[id(fn)] = CompiledLauncher(fn, name or str(getattr(fn, "__name__", "kernel")))
    return found


def launch_counts() -> dict[str, dict[str, Any]]:
    """Every launcher's counts, by kernel name (launchers of one kernel summed)."""
    out: dict[str, dict[str, Any]] = {}
    with _LOCK:
        launchers = list(_REGISTRY)
    for launcher in launchers:
        c = launcher.counts()
        if not c["compiled"] and not c["triton"]:
            continue
        mine = out.setdefault(launcher.name, {"compiled": 0, "signed": 0, "triton": {}, "kernels": 0})
        mine["compiled"] += c["compiled"]
        mine["signed"] += c["signed"]
        mine["kernels"] += c["kernels"]
        for reason, n in c["triton"].items():
            mine["triton"][reason] = mine["triton"].get(reason, 0) + n
    return out


def describe_counts(counts: dict[str, dict[str, Any]]) -> str:
    """One line of :func:`launch_counts` (or ``bench.json``'s ``launches``), every kernel summed:
    whether an eager run took the signed, the compiled or Triton's own path, and why Triton's."""
    compiled = sum(int(c.get("compiled", 0)) for c in counts.values())
    signed = sum(int(c.get("signed", 0)) for c in counts.values())
    reasons: Counter[str] = Counter()
    for c in counts.values():
        reasons.update({str(k): int(v) for k, v in (c.get("triton") or {}).items()})
    why = "; ".join(f"{reason} {n:,}" for reason, n in reasons.most_common())
    return (f"kvprof's Triton launches: {signed:,} signed, {compiled - signed:,} compiled by key, "
            f"{sum(reasons.values()):,} through Triton" + (f" ({why})" if why else ""))


__all__ = ["ENV_DISABLE", "CompiledLauncher", "SignedLaunch", "describe_counts", "direct_launch", "hook_set",
           "key_source", "launch_counts", "launcher_for", "set_enabled"]
