"""The verify tests build runs with the rule tests' builders (tests/rules/rule_builders.py)."""

from __future__ import annotations

import sys
from pathlib import Path

_RULES = str(Path(__file__).resolve().parents[1] / "rules")
if _RULES not in sys.path:
    sys.path.insert(0, _RULES)
