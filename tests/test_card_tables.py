"""Launch tables per card (kvprof/kvcache/writers/card_tables.py): which row a device takes, the
fallback for a card without one, and what bench reports."""

from __future__ import annotations

import pytest
import torch

from kvprof.kvcache.writers import card_tables as ct, layout_tables, rope_tables, triton_tables


@pytest.mark.parametrize("name,sms,row", [
    ("NVIDIA H200", 132, "H200"),
    ("NVIDIA H100 80GB HBM3", 132, "H100-SXM"),
    ("NVIDIA H100 PCIe", 114, None),  # another memory system and SM count: the fallback
    ("NVIDIA A100-SXM4-80GB", 108, None),
    ("NVIDIA H200 NVL", 132, "H200"),
    ("NVIDIA H100 NVL", 132, None),  # H100 in its name, 132 SMs, but HBM3 at 3.9 TB/s: not the SXM row
    ("NVIDIA GH200 480GB", 132, None),  # H200 inside a word of its name: not the H200 row
    ("NVIDIA H800", 132, None),
    ("H100-SXM5-80GB", 132, "H100-SXM"),  # the name written another way
    ("NVIDIA H200", 114, None),  # a row's model with another SM count (a partitioned card)
])
def test_a_device_matches_by_its_name_and_sm_count(name, sms, row):
    card = ct.match_card(name, sms)
    assert (card.name if card else None) == row


def test_every_card_row_names_a_model_of_the_spec_table():
    """A row's model is one the name lookup can return, so no row is unreachable."""
    from kvprof.core.devices import SPEC_BANDWIDTH

    models = [e.model for e in SPEC_BANDWIDTH]
    for card in ct.CARDS:
        assert models.count(card.model) == 1, card


@pytest.mark.parametrize("tables", [triton_tables.STORE_TABLES, rope_tables.ROPE_TABLES, layout_tables.MLA_TABLES,
                                    layout_tables.PAGED_TABLES])
def test_every_table_has_a_fallback_and_only_known_card_rows(tables):
    assert ct.FALLBACK in tables
    assert set(tables) - {ct.FALLBACK} <= {c.name for c in ct.CARDS}
    for module in (triton_tables, rope_tables, layout_tables):
        assert set(module.SOURCES) >= {ct.FALLBACK} and module.FALLBACK_WHY


def test_a_card_without_a_row_takes_the_fallback_and_a_card_with_one_its_own():
    assert ct.entry(triton_tables.STORE_TABLES, None)[0] == ct.FALLBACK
    assert ct.entry(triton_tables.STORE_TABLES, "no such card")[0] == ct.FALLBACK
    assert ct.entry(triton_tables.STORE_TABLES, "H200") == ("H200", triton_tables.STORE_TABLES["H200"])
    assert triton_tables.store_tables("no such card") is triton_tables.STORE_TABLES[ct.FALLBACK]


def test_each_card_row_decides_the_writers_shape(monkeypatch):
    """A row of its own changes what pick_config hands out for that card and no other."""
    special = triton_tables.TritonConfig(64, 16)
    rows: triton_tables.Table = [(1 << 62, 1 << 62, special)]
    monkeypatch.setitem(triton_tables.STORE_TABLES, "H100-SXM", (rows, rows))
    assert triton_tables.pick_config(512, 4096, card="H100-SXM") == special
    assert triton_tables.pick_config(512, 4096, card="H100-SXM", fp8=True) == special
    assert triton_tables.pick_config(512, 4096, card="H200") != special
    assert triton_tables.pick_config(512, 4096) != special


def test_the_report_on_a_cpu_says_the_interpreter_shapes():
    rep = ct.tables_report(torch.device("cpu"))
    assert set(rep["tables"]) == {"store", "rope", "mla", "paged"}
    assert all(v["entry"] == "interpreted" for v in rep["tables"].values())
    assert ct.describe(rep) == "launch tables: none on cpu (Triton's interpreter takes its own shapes)"


def test_the_report_names_the_fallback_and_why(monkeypatch):
    monkeypatch.setattr(ct, "device_card", lambda device: (None, "NVIDIA H100 PCIe", 114))
    rep = ct.tables_report(torch.device("cuda", 0))
    assert rep["card"] is None and rep["device"] == "NVIDIA H100 PCIe"
    assert all(v["entry"] == ct.FALLBACK and v["why"] for v in rep["tables"].values())
    assert "no card row (NVIDIA H100 PCIe, 114 SMs)" in ct.describe(rep)
    monkeypatch.setattr(ct, "device_card", lambda device: ("H200", "NVIDIA H200", 132))
    rep = ct.tables_report(torch.device("cuda", 0))
    assert rep["tables"]["store"] == {"entry": "H200", "source": triton_tables.SOURCES["H200"]}
