"""What ``kvprof verify`` found, as plain data: per writer the cases it ran and their outcomes,
and each case that went wrong with the command that reruns exactly it.

Torch-free, so the renderers (``kvprof.report.verify``) and any reader of the JSON document
take it without the torch side; the differential engine that fills it is ``kvprof.verify``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# a case's outcome
OK = "ok"  # every byte of every cache buffer as the reference writes it
REFUSED = "refused"  # the writer refused the call (one-line ValueError) and changed nothing
WRONG = "wrong"  # a byte differs from the reference, or a refused call changed a buffer
ERROR = "error"  # the writer raised something other than a refusal
OUTCOMES = (OK, REFUSED, WRONG, ERROR)
FAILING = (WRONG, ERROR)

VERIFY_SCHEMA = 1


@dataclass(frozen=True)
class CaseReport:
    """One case that did not pass (or, under ``--case``, the one case asked for)."""

    layout: str
    writer: str
    contract: str  # "store", or the MHA layout's "rope"
    index: int  # the case's number for this writer and seed: --case INDEX reruns it
    outcome: str
    case: str  # the case in words: dtypes, shape, slot pattern, tokens
    wrong_rows: int = 0  # (buffer, row) pairs with a wrong byte, q/k rows out of tolerance included
    wrong_bytes: int = 0
    detail: str = ""  # where (the first wrong rows) or the refusal's / error's words
    reproduce: str = ""  # one command that reruns exactly this case


@dataclass
class WriterTally:
    """One writer's cases, by outcome; ``skipped``: why none ran (cannot run on the device)."""

    layout: str
    writer: str
    contract: str = ""
    cases: int = 0
    ok: int = 0
    refused: int = 0
    wrong: int = 0
    errors: int = 0
    seconds: float = 0.0
    skipped: str | None = None

    def count(self, outcome: str) -> None:
        self.cases += 1
        if outcome == OK:
            self.ok += 1
        elif outcome == REFUSED:
            self.refused += 1
        elif outcome == WRONG:
            self.wrong += 1
        else:
            self.errors += 1

    @property
    def failed(self) -> int:
        return self.wrong + self.errors


@dataclass
class VerifyResult:
    """A verify run: the device, seed and budget, each writer's tally, each failing case."""

    device: str
    seed: int
    budget_s: float
    cases_per_writer: int
    elapsed_s: float = 0.0
    budget_hit: bool = False  # the budget ran out before every writer ran all its cases
    interpreted: bool = False  # the Triton writers ran in Triton's interpreter (a CPU)
    writers: list[WriterTally] = field(default_factory=list)
    failures: list[CaseReport] = field(default_factory=list)
    only_case: CaseReport | None = None  # --case: the one case that ran, whatever its outcome

    @property
    def cases_run(self) -> int:
        return sum(w.cases for w in self.writers)

    @property
    def failed(self) -> int:
        return sum(w.failed for w in self.writers)

    @property
    def untested(self) -> list[WriterTally]:
        """Writers that could run here and ran no case (the budget ran out first)."""
        return [w for w in self.writers if w.skipped is None and w.cases == 0]

    @property
    def passed(self) -> bool:
        return self.failed == 0

    def to_json(self) -> dict[str, Any]:
        return {"schema": VERIFY_SCHEMA, "device": self.device, "seed": self.seed, "budget_s": self.budget_s,
                "cases_per_writer": self.cases_per_writer, "elapsed_s": round(self.elapsed_s, 3),
                "budget_hit": self.budget_hit, "interpreted": self.interpreted, "cases_run": self.cases_run,
                "failed": self.failed, "passed": self.passed,
                "writers": [asdict(w) | {"seconds": round(w.seconds, 3)} for w in self.writers],
                "failures": [asdict(c) for c in self.failures],
                "only_case": asdict(self.only_case) if self.only_case is not None else None}


@dataclass
class PdlTally:
    """``verify --pdl``: one writer's dependent reads and how many saw a stale row."""

    layout: str
    writer: str
    contract: str = ""
    pdl: str = ""  # "yes" (the writer launches with PDL), "library" (its library decides)
    tokens: list[int] = field(default_factory=list)  # the grid sizes: tokens per write
    trials: int = 0  # writes per grid size
    reads: int = 0  # rows read by the dependent kernel after its griddepcontrol.wait
    stale: int = 0  # of those, rows that were not the ones just written
    seconds: float = 0.0
    skipped: str | None = None


@dataclass
class PdlResult:
    """``verify --pdl``: per writer, stale rows among the dependent kernel's reads."""

    device: str
    trials: int
    tokens: list[int]
    writers: list[PdlTally] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def stale(self) -> int:
        return sum(w.stale for w in self.writers)

    @property
    def passed(self) -> bool:
        return self.stale == 0

    def to_json(self) -> dict[str, Any]:
        return {"schema": VERIFY_SCHEMA, "mode": "pdl", "device": self.device, "trials": self.trials,
                "tokens": self.tokens, "elapsed_s": round(self.elapsed_s, 3), "stale": self.stale,
                "passed": self.passed, "writers": [asdict(w) | {"seconds": round(w.seconds, 3)} for w in self.writers]}
