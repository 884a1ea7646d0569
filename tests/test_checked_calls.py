"""A contract's checks kept per call key (``ChecksItsCalls.checked_call``) decide every call as
``check_write`` decides it.

``checked_call`` keys a call by the C++ helper's ``call_key`` (each tensor's dtype, device,
shape, strides and address; every other argument's type and value) and takes, for a key that
passed once, that call's result rebuilt over the new call's arguments, running only the checks
that read values. Here one writer per contract keeps its memo across every drawn call (the
pools' and the direct calls' strategies, faults included, so freed addresses come back under
other calls), and each call's outcome -- what it returns, as addresses, shapes, strides and
values, or the words it is refused in -- equals a fresh writer's ``check_write``: at the first
call, again (where the result was kept), and after the call's slots or positions change in
place to values out of range (the key unchanged, the value checks run again).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import test_writer_contracts as wc
import test_writer_properties as wp
from kvprof.kvcache import signature
from kvprof.kvcache.contracts import KVWriter, MLAWriter, PagedWriter, RopeKVWriter
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers.rope_reference import cos_sin_table

CPU = torch.device("cpu")
FAR = 1 << 40  # a slot or position past every buffer and table


@pytest.fixture(scope="module", autouse=True)
def call_key(signature_helper: Any) -> Any:
    return signature_helper.CALL_KEY


def _null(contract: type, name: str) -> Any:
    """A writer of ``contract`` that writes nothing: only its contract's checks run."""
    return type(name, (contract,), {"name": name, "write": lambda self, *args: "null"})


NullStore, NullMLA, NullPaged, NullRope = (_null(c, n) for c, n in (
    (KVWriter, "null_store"), (MLAWriter, "null_mla"), (PagedWriter, "null_paged"), (RopeKVWriter, "null_rope")))


# one writer per contract for the whole module: its memo sees every call drawn below
KEPT = {"mha": NullStore(), "mla": NullMLA(), "paged": NullPaged(), "rope": NullRope()}


def _describe(x: Any, args: tuple[Any, ...]) -> Any:
    """A result as its arguments' addresses, shapes, strides and slot values; a copy by its
    contents (two calls make two copies)."""
    if isinstance(x, torch.Tensor):
        values = x.tolist() if x.dtype in (torch.int32, torch.int64) else None
        ours = {a.data_ptr() for a in args if isinstance(a, torch.Tensor)}
        where = x.data_ptr() if x.data_ptr() in ours else ("copy", x.view(torch.uint8).tolist())
        return ("tensor", where, tuple(x.shape), x.stride(), x.dtype, x.device, values)
    return (type(x), x)


def _outcome(fn: Any, args: tuple[Any, ...]) -> Any:
    try:
        out = fn(*args)
    except ValueError as exc:
        return ("refused", str(exc))
    return tuple(_describe(x, args) for x in out)


def _agree(layout: str, args: tuple[Any, ...], index_names: tuple[int, ...]) -> None:
    """The kept writer's checked_call against a fresh writer's check_write: first, again, and
    with each index tensor (``args`` positions) holding a value out of range."""
    kept = KEPT[layout]
    fresh = type(kept)()
    want = _outcome(fresh.check_write, args)
    assert _outcome(kept.checked_call, args) == want
    assert _outcome(kept.checked_call, args) == want
    memo = kept.__dict__.get("_passed_calls", {})
    key = signature.CALL_KEY(*args)  # type: ignore[misc]
    if want[0] != "refused" and key is not None:
        copied = any(d[0] == "tensor" and isinstance(d[1], tuple) for d in want)
        assert (key in memo) != copied, "a passed call is kept unless its result holds a copy"
    for i in index_names:
        t = args[i]
        if t.__class__ is not torch.Tensor or t.dim() != 1 or not t.numel() or t.dtype not in (torch.int32,
                                                                                              torch.int64):
            continue
        t[0] = FAR if t.dtype == torch.int64 else (1 << 31) - 1
        assert _outcome(kept.checked_call, args) == _outcome(fresh.check_write, args)


def _store_args(layout: str, case: dict[str, Any]) -> tuple[Any, ...]:
    """The call tests/test_writer_contracts.py makes directly, as positional arguments."""
    gen = torch.Generator().manual_seed(case["seed"])
    _, buffers = wp._pool(layout, KEPT[layout], case, CPU)
    wp._fill(buffers, gen)
    loc = wp._loc(case, buffers)
    inputs = [wp._rows(case, i, shape, buffers, gen) for i, shape in enumerate(wp._input_shapes(layout, case))]
    bufs = wc._direct_buffers(case, buffers)
    scale = wp._scale(case, CPU)
    cache = case["cache"]
    if layout == "mha":
        return (bufs[0], bufs[1], loc, inputs[0], inputs[1], cache, scale, scale)
    if layout == "mla" and case["split"]:
        return (bufs[0], loc, inputs[0], inputs[1], cache, 0)
    if layout == "mla":
        r = 2 * case["dim"]
        return (bufs[0], loc, inputs[0][..., :r], inputs[0][..., r:], cache, -1)
    s = None
    if cache in wp.FP8:
        s = scale if isinstance(scale, torch.Tensor) else torch.tensor([1.0 if scale is None else scale])
    return (bufs[0], bufs[1], loc, inputs[0], inputs[1], cache, s, s)


SLOTS_AT = {"mha": (2,), "mla": (1,), "paged": (2,)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(data=st.data(), layout=st.sampled_from(["mha", "mla", "paged"]))
def test_kept_store_checks_decide_every_call_as_the_checks_do(data: Any, layout: str) -> None:
    case = data.draw(wc._direct_cases(layout))
    _agree(layout, _store_args(layout, case), SLOTS_AT[layout])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(case=wc._rope_cases(), flat=st.sampled_from(["", "q", "k", "qkv"]),
       scale=st.sampled_from([None, 0.5, 2, -1.0, "tensor"]), neox=st.sampled_from([True, False, 1, 0]))
def test_kept_rope_checks_decide_every_call_as_the_checks_do(case: dict[str, Any], flat: str, scale: Any,
                                                             neox: Any) -> None:
    """2-D q/k (the checks return [T, H, D] views of them), an int is_neox (returned as a
    bool) and every kind of scale included."""
    call = wc._rope_call(case)
    call.pop("slots")
    for name in flat:
        t = call[name]
        if t.dim() == 3 and t.shape[1] * t.shape[2]:
            try:
                call[name] = t.view(t.shape[0], -1)
            except RuntimeError:
                pass
    k_scale = torch.tensor([0.5]) if scale == "tensor" else scale
    args = (call["q"], call["k"], call["v"], call["k_buf"], call["v_buf"], call["loc"], call["positions"],
            call["cos_sin_cache"], neox, case["cache"], k_scale, k_scale)
    _agree("rope", args, (5, 6))


def test_arguments_equal_in_value_but_not_in_type_are_other_keys() -> None:
    """skip=1 passes the MLA checks and skip=True does not: a key holds each argument's type."""
    kv = torch.zeros(8, 1, 12, dtype=torch.bfloat16)
    loc = torch.tensor([2, 3])
    nope, rope = torch.randn(2, 1, 8).to(torch.bfloat16), torch.randn(2, 1, 4).to(torch.bfloat16)
    w = NullMLA()
    assert w.write(kv, loc, nope, rope, torch.bfloat16, 1) == "null"
    assert w.write(kv, loc, nope, rope, torch.bfloat16, 1) == "null"
    with pytest.raises(ValueError, match="skip must be -1"):
        w.write(kv, loc, nope, rope, torch.bfloat16, True)
    with pytest.raises(ValueError, match="skip must be -1"):
        w.write(kv, loc, nope, rope, torch.bfloat16, 1.0)


def test_what_the_helper_does_not_key_is_checked_in_python_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor subclass, a keyword argument, a writer that opts out, or no helper: no memo, and
    the checks still refuse what they refuse."""
    k_buf = torch.zeros(8, 2, 4)
    v_buf = torch.zeros(8, 2, 4)
    loc = torch.tensor([1, 2])
    k, v = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    w = NullStore()
    param = torch.nn.Parameter(k_buf.clone(), requires_grad=False)
    w.write(param, v_buf, loc, k, v, torch.float32)
    w.write(k_buf, v_buf, loc, k, v, dtype=torch.float32)
    assert not w.__dict__.get("_passed_calls")
    w.write(k_buf, v_buf, loc, k, v, torch.float32)
    assert len(w.__dict__["_passed_calls"]) == 1

    class Stateful(NullStore):
        checks_by_key = False

    s = Stateful()
    s.write(k_buf, v_buf, loc, k, v, torch.float32)
    assert not s.__dict__.get("_passed_calls")
    monkeypatch.setattr(signature, "CALL_KEY", None)
    fresh = NullStore()
    fresh.write(k_buf, v_buf, loc, k, v, torch.float32)
    assert not fresh.__dict__.get("_passed_calls")
    with pytest.raises(ValueError, match="shares memory"):
        fresh.write(k_buf, v_buf, loc, k_buf[:2], v, torch.float32)


def test_the_rope_pool_refuses_an_aliased_call_after_a_kept_one() -> None:
    """The rope pool checks through checked_call: a call that passed is kept, and the same
    tensors with q made k's view are still refused before anything is rotated."""
    pool = KVPool(16, 1, torch.float32, 2, 8, 1, CPU, writer=NullRope())
    qkv = torch.randn(3, 8 * 8)
    q, k, v = qkv[:, :32].view(3, 4, 8), qkv[:, 32:48].view(3, 2, 8), qkv[:, 48:].view(3, 2, 8)
    loc, pos = torch.tensor([1, 2, 3]), torch.tensor([0, 5, 9])
    table = cos_sin_table(64, 8)
    pool.set_kv_buffer_with_rope(0, loc, q, k, v, pos, table, True)
    pool.set_kv_buffer_with_rope(0, loc, q, k, v, pos, table, True)
    assert len(pool.writer.__dict__["_passed_calls"]) == 1
    with pytest.raises(ValueError, match="shares memory"):
        pool.set_kv_buffer_with_rope(0, loc, qkv[:, 24:56].view(3, 4, 8), k, v, pos, table, True)
    pos[1] = 64
    with pytest.raises(ValueError, match="position 64"):
        pool.set_kv_buffer_with_rope(0, loc, q, k, v, pos, table, True)


# -- real writers, memo kept across calls: the pools' and the direct calls' own property tests ----
POOL_WRITERS = {"mha": "index_put", "mla": "mla_index_put", "paged": "paged_index_put"}
ROPE_WRITER: dict[str, RopeKVWriter] = {}


def _run_twice(layout: str, writer: Any, case: dict[str, Any]) -> None:
    """tests/test_writer_properties.py's ``_run`` with the same call made twice on the same
    tensors (the second takes the kept checks where the pool hands the call to its writer's
    checked_call), then, where it passed, once more with a slot out of range in place."""
    gen = torch.Generator().manual_seed(case["seed"])
    pool, buffers = wp._pool(layout, writer, case, CPU)
    wp._fill(buffers, gen)
    loc = wp._loc(case, buffers)
    inputs = [wp._rows(case, i, shape, buffers, gen) for i, shape in enumerate(wp._input_shapes(layout, case))]
    snapshot = [wp._rows_of(b).clone() for b in buffers]
    held = [x.clone() for x in inputs]
    refuse = wp._expect_refusal(case, writer, CPU)
    scale = wp._scale(case, CPU)
    for _ in range(2):
        try:
            wp._write(layout, pool, case, loc, inputs, scale)
        except ValueError as exc:
            assert refuse, f"{writer.name} refused a valid call: {exc}"
            assert case["fault"] is None or wp.REFUSALS[case["fault"]] in str(exc), f"{case['fault']}: {exc}"
            for before, b in zip(snapshot, buffers):
                assert torch.equal(before, wp._rows_of(b)), f"{writer.name} changed the cache, then refused"
            continue
        assert not refuse, f"{writer.name} took a call it must refuse: {case}"
        wp._check_written(layout, writer.name, case, snapshot, buffers, held, scale, CPU)
    if refuse or loc.dim() != 1 or not loc.numel() or loc.stride(0) == 0 or loc.data_ptr() in {
            x.data_ptr() for x in inputs}:
        return
    after = [wp._rows_of(b).clone() for b in buffers]
    loc[0] = FAR if loc.dtype == torch.int64 else (1 << 31) - 1
    with pytest.raises(ValueError, match="slot"):
        wp._write(layout, pool, case, loc, inputs, scale)
    for before, b in zip(after, buffers):
        assert torch.equal(before, wp._rows_of(b)), f"{writer.name} wrote a call with a slot out of range"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(data=st.data(), layout=st.sampled_from(sorted(POOL_WRITERS)))
def test_pools_write_the_reference_rows_or_nothing_with_their_checks_kept(data: Any, layout: str) -> None:
    """The pools' property test, each layout's writer kept across every call."""
    _run_twice(layout, wp._writer(layout, POOL_WRITERS[layout], CPU), data.draw(wp.cases(layout)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(case=wc._rope_cases())
def test_a_rope_writer_rotates_and_stores_the_reference_or_nothing_with_its_checks_kept(case: dict[str, Any]) -> None:
    if not ROPE_WRITER:
        ROPE_WRITER["w"] = wc._rope_writer("rope_then_store")
    wc._run_rope_direct(ROPE_WRITER["w"], case)
    wc._run_rope_direct(ROPE_WRITER["w"], case)
