"""SARIF 2.1.0: findings as code-scanning results, the rule catalogue as the tool's rules.

Each finding with a location becomes a result at that ``file:line(:col)``, with the
settings it cites as related locations, so GitHub code scanning shows it inline in a
review. Findings without a location (a whole-run measurement such as GPU idle time)
cannot be results there (GitHub requires a location), so they are listed in the run's
property bag instead. ``tool.driver.rules`` is ``Report.rules``, the catalogue the
engine copied from the rule registry (this package imports only the model), with each
rule's documentation as its help text; a code without catalogue entry still gets a
rule so that every result's ``ruleIndex`` is valid.

Paths under the run's working directory become relative URIs against ``SRCROOT``
(``originalUriBaseIds`` says where that was); other absolute paths become ``file://``
URIs; everything is percent-encoded.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

from gpudoctor.model import Finding, Location, Report, RuleInfo, Severity
from gpudoctor.report import _fmt as f
from gpudoctor.report.jsonfmt import finite
from gpudoctor.safe import json_text

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "SRCROOT"

_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
_GROUP_TAGS = {
    "1": "gpu-utilization",
    "2": "input-pipeline",
    "3": "host-device-transfer",
    "4": "kernels-precision",
    "5": "memory",
    "6": "distributed",
    "7": "evaluation-inference",
}
_DRIVE = re.compile(r"^[A-Za-z]:/")


def _artifact_location(file: str, cwd: str | None) -> dict[str, Any]:
    path = file.replace("\\", "/")
    absolute = path.startswith("/") or bool(_DRIVE.match(path))
    if absolute:
        root = cwd.replace("\\", "/").rstrip("/") if cwd else None
        if root and path.startswith(root + "/"):
            return {"uri": quote(path[len(root) + 1 :], safe="/"), "uriBaseId": SRCROOT}
        return {"uri": "file://" + ("/" if _DRIVE.match(path) else "") + quote(path, safe="/:")}
    while path.startswith("./"):
        path = path[2:]
    return {"uri": quote(path, safe="/"), "uriBaseId": SRCROOT}


def _physical(loc: Location, cwd: str | None) -> dict[str, Any]:
    phys: dict[str, Any] = {"artifactLocation": _artifact_location(loc.file, cwd)}
    if loc.line >= 1:
        region: dict[str, Any] = {"startLine": loc.line}
        if loc.col is not None and loc.col >= 1:
            region["startColumn"] = loc.col
        phys["region"] = region
    return phys


def _first_paragraph(doc: str, heading: str) -> str:
    """The paragraph under ``heading`` (underlined with - or =) in a rule's documentation."""
    lines = doc.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.strip().lower() == heading.lower() and set(lines[i + 1].strip()) <= set("-=~") and lines[i + 1].strip():
            para: list[str] = []
            for nxt in lines[i + 2 :]:
                if not nxt.strip():
                    if para:
                        break
                    continue
                para.append(nxt.strip())
            return " ".join(para)
    return ""


def _rule(info: RuleInfo) -> dict[str, Any]:
    title = f.clean(info.title) or info.code
    rule: dict[str, Any] = {
        "id": info.code,
        "name": info.name,
        "shortDescription": {"text": title},
        "fullDescription": {"text": _first_paragraph(info.doc, "What it detects") or title},
    }
    if info.doc:
        rule["help"] = {"text": info.doc, "markdown": info.doc}
    tags = ["performance"]
    group = info.code[2:3]
    if group in _GROUP_TAGS:
        tags.append(_GROUP_TAGS[group])
    rule["properties"] = {"tags": tags}
    return rule


def _catalogue(report: Report) -> list[RuleInfo]:
    """The report's rule catalogue, plus a bare entry for any finding's code it lacks."""
    rules = list(report.rules)
    known = {r.code for r in rules}
    for fd in report.findings:
        if fd.code not in known:
            rules.append(RuleInfo(fd.code, fd.name, fd.name))
            known.add(fd.code)
    return rules


def _properties(fd: Finding) -> dict[str, Any]:
    props: dict[str, Any] = {"confidence": fd.confidence.value}
    if fd.gain.share_pct is not None:
        props["stepTimeShareAtStakePct"] = fd.gain.share_pct
    if fd.gain.speedup_bound is not None:
        props["speedupBound"] = fd.gain.speedup_bound
    if fd.gain.note:
        props["gainNote"] = fd.gain.note
    if fd.rank is not None:
        props["rank"] = fd.rank
    if fd.verification is not None:  # --verify: the fix measured in trial runs
        v = fd.verification
        props["verification"] = {"status": v.status.value, "reason": v.reason}
        if v.speedup is not None:
            props["verification"]["speedup"] = v.speedup
        if v.ci is not None:
            props["verification"]["ci"] = list(v.ci)
    evidence = [f.metric_text(m) for m in fd.evidence.metrics] + list(fd.evidence.notes)
    if evidence:
        props["evidence"] = evidence
    return props


def _result(fd: Finding, loc: Location, index: int, cwd: str | None) -> dict[str, Any]:
    text = fd.message.rstrip()
    if fd.fix.instruction:
        text += f" Fix: {fd.fix.instruction}"
    result: dict[str, Any] = {
        "ruleId": fd.code,
        "ruleIndex": index,
        "kind": "fail",
        "level": _LEVEL[fd.severity],
        "message": {"text": text},
        "locations": [{"physicalLocation": _physical(loc, cwd)}],
    }
    related = []
    for s in fd.evidence.settings:
        if s.location is not None:
            related.append(
                {
                    "id": len(related) + 1,
                    "message": {"text": f"{s.name} = {f.with_unit(s.value)}"},
                    "physicalLocation": _physical(s.location, cwd),
                }
            )
    if related:
        result["relatedLocations"] = related
    result["properties"] = _properties(fd)
    return result


def sarif_log(report: Report) -> dict[str, Any]:
    """The SARIF log as a dict (what ``render(report, "sarif")`` writes)."""
    manifest = report.run.manifest if report.run is not None else None
    cwd = manifest.cwd if manifest is not None and manifest.cwd else None
    rules = _catalogue(report)
    index = {r.code: i for i, r in enumerate(rules)}
    results = [_result(fd, fd.location, index[fd.code], cwd) for fd in report.findings if fd.location is not None]
    unlocated = [
        {"ruleId": fd.code, "level": _LEVEL[fd.severity], "message": fd.message, "fix": fd.fix.instruction}
        for fd in report.findings
        if fd.location is None
    ]
    invocation: dict[str, Any] = {"executionSuccessful": True}
    notes = [{"level": "warning", "message": {"text": w}} for w in report.warnings]
    notes += [{"level": "error", "message": {"text": e}} for e in report.errors]
    if notes:
        invocation["toolExecutionNotifications"] = notes
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "gpudoctor",
                "version": report.gpudoctor_version,
                "rules": [_rule(r) for r in rules],
            }
        },
        "invocations": [invocation],
        "columnKind": "unicodeCodePoints",
    }
    if cwd:
        root = cwd.replace("\\", "/").rstrip("/") + "/"
        prefix = "file://" + ("/" if _DRIVE.match(root) else "")
        run["originalUriBaseIds"] = {SRCROOT: {"uri": prefix + quote(root, safe="/:")}}
    run["results"] = results
    run["properties"] = {
        "kind": report.kind,
        "source": report.source,
        "createdAt": report.created_at,
        "reportSchemaVersion": report.schema_version,
        "findingsWithoutLocation": unlocated,
    }
    return {"version": SARIF_VERSION, "$schema": SARIF_SCHEMA, "runs": [run]}


def render_sarif(report: Report) -> str:
    text = json.dumps(finite(sarif_log(report)), indent=2, ensure_ascii=False, allow_nan=False, default=str)
    return json_text(text) + "\n"
