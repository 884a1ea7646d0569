"""Instrumentation: named NVTX and torch.profiler ranges when on, the plain pool when off."""

from __future__ import annotations

import pytest
import torch

import kvprof.kvcache.instrument as instrument
from kvprof.kvcache.instrument import InstrumentedKVPool, make_pool, variant_color
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import create_writer


class FakeDomain:
    def __init__(self) -> None:
        self.stack: list[dict] = []
        self.pushed: list[dict] = []

    def get_event_attributes(self, message=None, color=None, category=None, payload=None):
        return {"message": message, "color": color, "category": category, "payload": payload}

    def push_range(self, attributes=None):
        self.stack.append(attributes)
        self.pushed.append(attributes)

    def pop_range(self):
        self.stack.pop()


@pytest.fixture
def fake_nvtx(monkeypatch):
    dom = FakeDomain()
    monkeypatch.setattr(instrument.nvtx, "get_domain", lambda name: dom)
    return dom


def pool(instrument_on: bool, layers: int = 2):
    return make_pool(16, 1, torch.bfloat16, 1, 8, layers, "cpu", writer=create_writer("index_put"),
                     instrument=instrument_on, start_layer=4)


def test_off_is_the_plain_pool():
    p = pool(False)
    assert type(p) is KVPool
    assert type(p).set_kv_buffer is KVPool.set_kv_buffer


def test_nvtx_range_per_write(fake_nvtx):
    p = pool(True)
    assert isinstance(p, InstrumentedKVPool)
    k = torch.randn(3, 1, 8).to(torch.bfloat16)
    p.set_kv_buffer(5, torch.tensor([1, 2, 3]), k, k)
    (attr,) = fake_nvtx.pushed
    assert attr == {"message": "set_kv_buffer[index_put] L5", "color": variant_color("index_put"),
                    "category": "index_put", "payload": 3}
    assert fake_nvtx.stack == []


def test_range_is_popped_when_the_write_fails(fake_nvtx):
    p = pool(True)
    k = torch.randn(2, 1, 8).to(torch.bfloat16)
    with pytest.raises(ValueError, match="negative slot"):
        p.set_kv_buffer(4, torch.tensor([1, -3]), k, k)
    assert fake_nvtx.stack == []
    with pytest.raises(ValueError, match="not in this pool"):
        p.set_kv_buffer(0, torch.tensor([1, 2]), k, k)  # no range for a call on no layer
    assert len(fake_nvtx.pushed) == 1


def test_record_function_only_under_a_profiler():
    p = pool(True)
    k = torch.randn(2, 1, 8).to(torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        p.set_kv_buffer(4, torch.tensor([1, 2]), k, k)
        p.set_kv_buffer(5, torch.tensor([1, 2]), k, k)
    names = [e.name for e in prof.events() if e.name.startswith("set_kv_buffer")]
    assert names == ["set_kv_buffer[index_put] L4", "set_kv_buffer[index_put] L5"]


def test_colors_are_stable_and_distinct():
    assert variant_color("my_writer") == variant_color("my_writer")
    assert variant_color("index_put") != variant_color("triton_fused")
    assert variant_color("x") >> 24 == 0xFF
