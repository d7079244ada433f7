"""Every script of sample_scripts/ gives its planted code; tuned_baseline.py nothing at warning or above.

The planted code is read from each script's docstring (``Expected: GD201``; several
codes separated by ``/`` mean any of them). Codes that only a run can show (GD103
launch-bound, GD203 CPU-bound main process, GD204 thread oversubscription, …) are
outside what `gpudoctor check` reports: those scripts are skipped with the reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.model.findings import Severity
from gpudoctor.static import STATIC_CODES, check_paths

SAMPLES = Path(__file__).resolve().parents[2] / "sample_scripts"
BASELINE = "tuned_baseline.py"
_EXPECTED = re.compile(r"^\s*Expected:\s*(.+)$", re.MULTILINE)


def _scripts() -> list[Path]:
    return sorted(SAMPLES.glob("*.py")) if SAMPLES.is_dir() else []


def expected_codes(path: Path) -> set[str]:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    m = _EXPECTED.search(doc)
    return set(re.findall(r"GD\d{3}", m.group(1))) if m else set()


def test_sample_scripts_folder_is_checked_when_present():
    if not _scripts():
        pytest.skip("sample_scripts/ has no scripts yet")
    planted = [p for p in _scripts() if p.name != BASELINE]
    assert all(expected_codes(p) for p in planted), "every planted script names its code in its docstring"


@pytest.mark.parametrize("path", [p for p in _scripts() if p.name != BASELINE], ids=lambda p: p.name)
def test_planted_code_is_found(path: Path):
    codes = expected_codes(path)
    static = codes & set(STATIC_CODES)
    if not static:
        pytest.skip(f"{', '.join(sorted(codes))} is judged from a run (`gpudoctor profile`), not from the source")
    report = check_paths([path], Config())
    assert report.errors == ()
    found = {f.code for f in report.findings}
    assert found & static, f"{path.name}: expected one of {sorted(static)}, got {sorted(found)}"


def test_tuned_baseline_has_nothing_at_warning_or_above():
    path = SAMPLES / BASELINE
    if not path.is_file():
        pytest.skip(f"sample_scripts/{BASELINE} does not exist yet")
    report = check_paths([path], Config())
    assert report.errors == ()
    loud = [f for f in report.findings if f.severity.rank <= Severity.WARNING.rank]
    assert loud == [], [f"{f.code} {f.location}: {f.message}" for f in loud]
