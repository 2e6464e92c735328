"""The pieces of `bench/harbor_anchor_bench.py` (Harbor 0.25.0 beside this harness):

- `harbor_anchor.daemon`: the one private dockerd, its baseline of images, the purge between
  measurements;
- `harbor_anchor.harbor`: the trixie root with Harbor in it, the upstream tags and local
  stand-ins Harbor's runs need here, one Harbor job, its trials' outcomes;
- `harbor_anchor.ours`: this harness through its CLI only (``validate image build``,
  ``validate freeze``, ``validate run``), its outcomes read from the run's own files.

What one measurement returns is a `Measurement`; what stops the bench with a message (exit
2, no traceback) is a `BenchError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class BenchError(Exception):
    """Something the bench cannot go on without; the message says what and how to fix it."""


@dataclass
class Measurement:
    """One timed run of one side: its trials, its wall time, each task's outcome."""

    side: str  #: 'harbor', 'ours-oracle-nop' or 'ours-default'
    trials: int  #: trials recorded (Harbor: trial results written; ours: attempt rows)
    played: int  #: of those, the ones that ran an agent (Harbor: an agent phase; ours: a runtime)
    wall_s: float  #: Harbor: the `harbor run` process; ours: `validate freeze` + `validate run`
    #: task → agent → the outcome as a short text ('1.0', 'RewardFileNotFoundError', 'timeout')
    outcomes: dict[str, dict[str, str]] = field(default_factory=dict)
    verdicts: dict[str, tuple[str, str]] = field(default_factory=dict)  #: ours: task → (verdict, reason)
    details: dict[str, str] = field(default_factory=dict)  #: ours: task → the verdict's detail
    parts_s: dict[str, float] = field(default_factory=dict)  #: ours: 'freeze' and 'run' apart
    #: ours: task images the freeze 'built' / found 'cached'
    images: dict[str, int] = field(default_factory=dict)
    phases_s: dict[str, float] = field(default_factory=dict)  #: the median trial's seconds, by phase
    where: str = ""  #: the job or run directory (kept with --keep)
    temp: str = ""  #: 'cold' or 'warm' (set by the schedule)
    round: int = 0

    def line(self) -> str:
        parts = "".join(f", {k} {v:.1f} s" for k, v in self.parts_s.items())
        parts += "".join(f", images {k} {v}" for k, v in sorted(self.images.items()))
        if self.phases_s:
            parts += "; median trial: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.phases_s.items())
        return (f"{self.side} {self.temp}: {self.played} trials played ({self.trials} recorded) in "
                f"{self.wall_s:.1f} s{parts} = {self.played / self.wall_s:.3f} trials/s")

    def summary(self) -> dict:
        return {"side": self.side, "temp": self.temp, "round": self.round, "trials": self.trials,
                "played": self.played,
                "wall_s": round(self.wall_s, 2), "parts_s": {k: round(v, 2) for k, v in self.parts_s.items()},
                "images": self.images, "phases_s": {k: round(v, 2) for k, v in self.phases_s.items()},
                "outcomes": self.outcomes, "verdicts": {t: list(v) for t, v in self.verdicts.items()},
                "where": self.where}
