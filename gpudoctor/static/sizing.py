"""What ``gpudoctor check``'s fixes write: values sized as ``gpudoctor profile`` sizes them.

- ``num_workers``: ``--workers N``; with nothing given or measured, GD201 sizes it itself
  (``workers_here``: the cores of the machine ``check`` runs on less those kept for the
  training process, the cap it puts on a load it did not measure);
- ``check --from RUN``: what ``--verify`` measured in a run of ``gpudoctor profile``: the
  settings of every confirmed fix (the best rung of its ladder: ``num_workers=8``) at the
  call site it was tried at, and no fix where ``--verify`` refuted it;
- every other knob (``pin_memory``, ``persistent_workers``, ``fused``, ``non_blocking``,
  ``cudnn.benchmark``) is a switch: on.

``check`` without ``--fix`` shows the same values in its after, so that the report says what
``--fix`` would write.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.errors import UsageError
from gpudoctor.model import layout
from gpudoctor.model._serde import check
from gpudoctor.model.findings import Report
from gpudoctor.rules.static_api import Sized


@dataclass(frozen=True, slots=True)
class _Measured:
    path: str  # absolute
    line: int
    key: str
    value: Any
    why: str
    refused: str = ""


@dataclass(frozen=True, slots=True)
class Sizing:
    workers: int | None = None  # --workers N
    measured: tuple[_Measured, ...] = field(default=())

    def sized(self, key: str, path: str, first: int, last: int) -> Sized:
        """What ``key`` is set to at lines first..last of ``path``: measured there, else --workers for
        num_workers, else ``Sized(None, "")``: the rule sizes it (a switch: on)."""
        for m in self.measured:
            if m.key == key and (m.path == "" or (m.path == path and first <= m.line <= last)):
                return Sized(m.value, m.why, m.refused)
        if key == "num_workers" and self.workers is not None:
            return Sized(self.workers, f"--workers {self.workers}")
        return Sized(None, "")


def sizing(workers: int | None = None, run: Path | None = None) -> Sizing:
    """The values of this ``check``: ``--workers N``, then what ``--verify`` measured in ``run`` (a run
    directory of ``gpudoctor profile``), which wins at its call sites."""
    return Sizing(workers, _measured(run) if run is not None else ())


def _measured(run: Path) -> tuple[_Measured, ...]:
    path = run / layout.REPORT
    if not path.is_file():
        raise UsageError(f"--from {run}: no {layout.REPORT} in it; pass a run directory of `gpudoctor profile` "
                         "(run `gpudoctor verify` on it to measure its fixes)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        check(Report, data)  # untrusted: each field of its type, no integer past 64 bits
        report = Report.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as err:  # FieldTypeError is a ValueError
        raise UsageError(f"--from {run}: {layout.REPORT} cannot be read ({type(err).__name__}: {err})") from None
    base = _recorded_cwd(run)
    out: list[_Measured] = []
    for f in report.findings:
        v = f.verification
        if v is None or v.status.value not in ("confirmed", "refuted"):
            continue
        confirmed = v.status.value == "confirmed"
        speed = f" ({v.speedup:.2f}× faster)" if confirmed and v.speedup else ""
        for inj in v.changes:
            site = inj.call_site
            file = os.path.normpath(os.path.join(base, site.file)) if site is not None else ""
            line = site.line if site is not None else 0
            if confirmed:
                why = f"measured by --verify in {run}: {inj.key}={inj.value!r}{speed}"
                out.append(_Measured(file, line, inj.key, inj.value, why))
            else:
                out.append(_Measured(file, line, inj.key, inj.value, "",
                                     refused=f"--verify in {run} measured no gain from {inj.key}={inj.value!r}: "
                                             f"{v.reason}"))
    return tuple(out)


def _recorded_cwd(run: Path) -> str:
    """The working directory the run recorded (its call sites' relative paths start there); the
    current one when the manifest is missing or says nothing."""
    try:
        cwd = json.loads((run / layout.MANIFEST).read_text(encoding="utf-8")).get("cwd")
    except (OSError, ValueError, AttributeError):
        cwd = None
    return cwd if isinstance(cwd, str) and os.path.isabs(cwd) else os.getcwd()
