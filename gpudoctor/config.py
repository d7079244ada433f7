"""Thresholds and rule selection: ``[tool.gpudoctor]`` in the user's pyproject and CLI flags.

``Thresholds`` is the one place a rule reads a number from. Each field has a unit
suffix and a comment saying where its value comes from. Imports nothing of ours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


@dataclass(frozen=True, slots=True)
class Thresholds:
    # Severity scale, the same for every rule: share of step time at stake.
    error_share_pct: float = 20.0  # ≥ this: error
    warning_share_pct: float = 5.0  # ≥ this: warning, else info


@dataclass(frozen=True, slots=True)
class Config:
    thresholds: Thresholds = field(default_factory=Thresholds)
    select: tuple[str, ...] = ()  # codes or prefixes ("GD2"); empty = all
    ignore: tuple[str, ...] = ()
    source: str = ""  # the pyproject.toml it came from, if any

    def rule_enabled(self, code: str) -> bool:
        code = code.upper()
        if self.select and not any(code.startswith(s.upper()) for s in self.select):
            return False
        return not any(code.startswith(s.upper()) for s in self.ignore)


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above ``start``."""
    start = start.resolve()
    for d in (start, *start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(
    where: Path,
    select: tuple[str, ...] = (),
    ignore: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
) -> Config:
    """``[tool.gpudoctor]`` from the nearest pyproject.toml, then CLI flags on top."""
    raise NotImplementedError  # the rules issue completes this
