"""``--steps N``: the exception that stops the script cleanly after N steps."""

from __future__ import annotations


class StopAfterSteps(SystemExit):
    """Raised at the step boundary after ``--steps N``; the script unwinds and exits 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(0)
        self.steps = steps
