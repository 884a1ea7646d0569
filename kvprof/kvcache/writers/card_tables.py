"""Which card's launch tables a kvprof Triton writer takes on a device.

A launch shape that is fastest on one card is not on the next (the H200's store table left
the H100's 32x128 writes at 4096 and 32768 tokens slower than SGLang's ``store_cache``), so
the tables of :mod:`kvprof.kvcache.writers.triton_tables`, :mod:`kvprof.kvcache.writers.rope_tables` and
:mod:`kvprof.kvcache.writers.layout_tables` hold one row per card they were tuned on, keyed by the
:data:`CARDS` names below. A device is matched by the words of its name
(``torch.cuda.get_device_name``) and its multiprocessor count: an H100 PCIe (114 SMs, HBM2e)
is not the H100 SXM the H100 row was tuned on, and takes the fallback.

Each table module also has a ``fallback`` entry for a card without a row, and says how it
was chosen (``FALLBACK_WHY``). :func:`tables_report` says, per table, which entry a device
takes; ``kvprof bench`` prints it in its header and keeps it in ``bench.json``
(``launch_tables``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvprof.core.devices import spec_entry

FALLBACK = "fallback"


@dataclass(frozen=True)
class Card:
    """A card the tables have rows for: ``model``, the spec table's model its rows were tuned
    on (``kvprof.core.devices.SPEC_BANDWIDTH``), and ``sms`` its multiprocessor count (None: any)."""

    name: str
    model: str
    sms: int | None


CARDS: tuple[Card, ...] = (
    Card("H200", "H200 (SXM and NVL, 141 GB HBM3e)", 132),
    Card("H100-SXM", "H100 SXM (80 GB HBM3)", 132),
)


def match_card(device_name: str, sms: int | None) -> Card | None:
    """The card row for a device name and SM count, or None: the name must read as the row's
    model in the spec table, where a more specific model (``H100 NVL``) wins over ``H100``."""
    spec = spec_entry(device_name)
    if spec is None:
        return None
    return next((c for c in CARDS if c.model == spec.model and (c.sms is None or c.sms == sms)), None)


_BY_INDEX: dict[int, tuple[str, str, int]] = {}


def device_card(device: Any) -> tuple[str | None, str, int | None]:
    """(card row name or None, device name, SM count) of a CUDA device; (None, type, None)
    for any other (a CPU under Triton's interpreter takes its own shapes)."""
    if getattr(device, "type", str(device)) != "cuda":
        return None, str(getattr(device, "type", device)), None
    import torch

    index = getattr(device, "index", None)
    index = torch.cuda.current_device() if index is None else index
    found = _BY_INDEX.get(index)
    if found is None:
        p = torch.cuda.get_device_properties(index)
        card = match_card(p.name, p.multi_processor_count)
        found = _BY_INDEX[index] = (card.name if card else "", p.name, p.multi_processor_count)
    return found[0] or None, found[1], found[2]


def entry(tables: dict[str, Any], card: str | None) -> tuple[str, Any]:
    """(entry name, entry) of a per-card table dict: the card's row, else ``fallback``."""
    if card is not None and card in tables:
        return card, tables[card]
    return FALLBACK, tables[FALLBACK]


def tables_report(device: Any) -> dict[str, Any]:
    """Per table, the entry ``device`` takes and, for the fallback, how it was chosen."""
    from kvprof.kvcache.writers import layout_tables, rope_tables, triton_tables

    card, name, sms = device_card(device)
    out: dict[str, Any] = {"device": name, "sms": sms, "card": card, "tables": {}}
    for label, module, tables in (("store", triton_tables, triton_tables.STORE_TABLES),
                                  ("rope", rope_tables, rope_tables.ROPE_TABLES),
                                  ("mla", layout_tables, layout_tables.MLA_TABLES),
                                  ("paged", layout_tables, layout_tables.PAGED_TABLES)):
        if card is None and getattr(device, "type", str(device)) != "cuda":
            out["tables"][label] = {"entry": "interpreted", "source": "Triton's interpreter shapes (CPU)"}
            continue
        used, _ = entry(tables, card)
        rec = {"entry": used, "source": module.SOURCES.get(used, "")}
        if used == FALLBACK:
            rec["why"] = module.FALLBACK_WHY
        out["tables"][label] = rec
    return out


def describe(report: dict[str, Any]) -> str:
    """One line: the card and each table's entry (``store H100-SXM, rope fallback, ...``)."""
    tables = report.get("tables") or {}
    if tables and all(v.get("entry") == "interpreted" for v in tables.values()):
        return f"launch tables: none on {report.get('device')} (Triton's interpreter takes its own shapes)"
    parts = [f"{k} {v.get('entry')}" for k, v in tables.items()]
    card = report.get("card") or f"no card row ({report.get('device')}, {report.get('sms')} SMs)"
    return f"launch tables: {card}: " + ", ".join(parts)


__all__ = ["CARDS", "FALLBACK", "Card", "describe", "device_card", "entry", "match_card", "tables_report"]
