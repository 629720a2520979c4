"""Trainable agents that get no rows: counted per agent over consecutive steps, loud from the
:data:`WARN_AFTER`-th step on.

A trainable model gets no rows in a step when nothing called it: for a sub-agent, the main agent made no
``ask_<name>`` call that the tool parser could read (an untrained main agent rarely calls a tool), or the
forced relay loop calls another sub-agent. The trainer then writes ``agent/<name>/skipped = 1.0`` and trains
nothing for it, which alone is easy to miss (the run exits 0): :class:`RowlessSteps` turns a streak of such
steps into a warning printed every step, and ``main_ppo``'s summary line names the agent at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: The consecutive step without rows from which a trainable agent is warned about, every step.
WARN_AFTER = 3


@dataclass
class RowlessSteps:
    """Consecutive steps without rows, per trainable model owner (reset by a step where it trains)."""

    main: str = "main"
    """The main agent's name (the agent that calls the others)."""
    warn_after: int = WARN_AFTER
    streak: dict[str, int] = field(default_factory=dict)

    def observe(self, step: int, skipped: Iterable[str], trained: Iterable[str],
                plays: Mapping[str, tuple[str, ...]] | None = None) -> list[str]:
        """Count one step: ``skipped`` got no rows, ``trained`` did. Returns a warning per agent whose streak is
        at least :attr:`warn_after` (``plays``: owner -> the agents its model plays, for the hint)."""
        for name in trained:
            self.streak[name] = 0
        warnings = []
        for name in skipped:
            count = self.streak[name] = self.streak.get(name, 0) + 1
            if count >= self.warn_after:
                warnings.append(self.warning(name, count, step, (plays or {}).get(name, (name,))))
        return warnings

    def warning(self, name: str, count: int, step: int, plays: tuple[str, ...]) -> str:
        """The warning for ``name`` after ``count`` consecutive steps without rows, at ``step``."""
        asked = [a for a in plays if a != self.main]
        if asked:
            calls = " / ".join(f"ask_{a}" for a in asked)
            cause = (f"the main agent {self.main!r} never asked it: no {calls} call was parsed from its responses "
                     f"(see the delegation metrics: val-aux/<source>/calls/mean@n, val-aux/<source>/tool/ask_{asked[0]}"
                     f"/mean@n, tool/parse_errors); an untrained main agent rarely calls a tool: warm-start it "
                     f"(docs/warmstart.md) or force the calls (agent loop mgrpo_relay)")
        else:
            cause = "no rollout of its model was sampled (the agent loop never generated with it)"
        return (f"mgrpo warning: trainable agent {name!r} got no rows for {count} steps in a row (step {step}): "
                f"its model was never called, so it does not train. Likely cause: {cause}")
