"""The JSON Schemas of the JSON report and of ``compare``'s JSON, generated from the model's dataclasses.

``docs/report-schema.json`` and ``docs/compare-schema.json`` are this module's output::

    python -m gpudoctor.report.schema > docs/report-schema.json
    python -m gpudoctor.report.schema compare > docs/compare-schema.json

Every dataclass of the model becomes a ``$defs`` entry whose description is the
class docstring and whose properties carry the comment written next to the field.
Every field is required (``to_dict`` always writes it) and no other property is
allowed, so a report that validates has exactly the documented shape. A test keeps
the file in step with the model and validates produced reports against it; a change
that breaks readers of ``schema_version`` N must raise ``REPORT_SCHEMA_VERSION`` (for the
comparison, ``COMPARISON_SCHEMA_VERSION``).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import io
import json
import sys
import tokenize
import types
import typing
from functools import cache
from typing import Any

from gpudoctor.model import COMPARISON_SCHEMA_VERSION, REPORT_SCHEMA_VERSION, Comparison, Report

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = f"urn:gpudoctor:report-schema:{REPORT_SCHEMA_VERSION}"
COMPARE_SCHEMA_ID = f"urn:gpudoctor:compare-schema:{COMPARISON_SCHEMA_VERSION}"
# the documents with a ``schema_version``: its value is a constant of the schema
_VERSIONS: dict[type, int] = {Report: REPORT_SCHEMA_VERSION, Comparison: COMPARISON_SCHEMA_VERSION}

# what Python 3.10 gives an Enum without a docstring (3.11 on: None): the schema is the same on every Python
_ENUM_DEFAULT_DOC = "An enumeration."
_SIMPLE: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


@cache
def _field_comments(cls: type) -> dict[str, str]:
    """``name: type = default  # comment`` → {name: comment}, read from the class source."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    line_names: dict[int, str] = {}
    for lineno, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        head = stripped.split(":", 1)[0]
        if line.startswith("    ") and not line.startswith("     ") and head.isidentifier() and ":" in stripped:
            line_names[lineno] = head
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in line_names:
            text = tok.string.lstrip("#").strip()
            comments[line_names[tok.start[0]]] = f"e.g. {text}" if text.startswith('"') else text
    return comments


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp in _SIMPLE:
        return {"type": _SIMPLE[tp]}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        subs = [_type_schema(a, defs) for a in typing.get_args(tp)]
        if all(set(s) == {"type"} for s in subs):
            names: list[str] = []
            for s in subs:
                for t in s["type"] if isinstance(s["type"], list) else [s["type"]]:
                    if t not in names:
                        names.append(t)
            if "number" in names and "integer" in names:
                names.remove("integer")
            return {"type": names if len(names) > 1 else names[0]}
        return {"anyOf": subs}
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", "prefixItems": [_type_schema(a, defs) for a in args], "items": False}
        return {"type": "array", "items": _type_schema(args[0], defs)}
    if origin is dict:
        _, value = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(value, defs)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        if tp.__name__ not in defs:
            doc = tp.__doc__ if tp.__doc__ != _ENUM_DEFAULT_DOC else None
            defs[tp.__name__] = {
                "description": inspect.cleandoc(doc or tp.__name__),
                "type": "string",
                "enum": [m.value for m in tp],
            }
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if dataclasses.is_dataclass(tp):
        _dataclass_def(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema for the model type {tp!r}")


def _dataclass_def(cls: type, defs: dict[str, Any]) -> None:
    if cls.__name__ in defs:
        return
    defs[cls.__name__] = {}  # placeholder against recursion
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    comments = _field_comments(cls)
    props: dict[str, Any] = {}
    for fld in dataclasses.fields(cls):
        prop = _type_schema(hints[fld.name], defs)
        if fld.name in comments:
            prop = {"description": comments[fld.name], **prop}
        props[fld.name] = prop
    if cls in _VERSIONS:
        props["schema_version"] = {
            "description": "version of this schema; raised when a change breaks readers",
            "const": _VERSIONS[cls],
        }
    doc = inspect.cleandoc(cls.__doc__) if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}(") else ""
    entry: dict[str, Any] = {"type": "object"}
    if doc:
        entry["description"] = doc
    entry.update(
        {
            "properties": props,
            "required": [fld.name for fld in dataclasses.fields(cls)],
            "additionalProperties": False,
        }
    )
    defs[cls.__name__] = entry


def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``render(report, "json")``."""
    defs: dict[str, Any] = {}
    _dataclass_def(Report, defs)
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": SCHEMA_ID,
        "title": f"gpudoctor report, schema_version {REPORT_SCHEMA_VERSION}",
        "description": (
            "The JSON report of gpudoctor (`gpudoctor report RUN --format json`, and report.json in a run "
            "directory): findings, checklist, headline numbers and the measurements they were computed from. "
            "Durations are integers in nanoseconds (*_ns), sizes in bytes, percentages say which window they "
            "are of. Generated from gpudoctor/model by `python -m gpudoctor.report.schema`."
        ),
        "$ref": "#/$defs/Report",
        "$defs": dict(sorted(defs.items())),
    }


def comparison_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``render_comparison(cmp, "json")`` (``gpudoctor compare --format json``)."""
    defs: dict[str, Any] = {}
    _dataclass_def(Comparison, defs)
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": COMPARE_SCHEMA_ID,
        "title": f"gpudoctor comparison, schema_version {COMPARISON_SCHEMA_VERSION}",
        "description": (
            "The JSON of `gpudoctor compare RUN_A RUN_B --format json`: both runs, step time before and after "
            "with the speed-up and the noise verdict, the figures and the step breakdown side by side, the "
            "findings fixed, remaining and new, and the settings that changed. Durations are integers in "
            "nanoseconds (*_ns), percentages say which window they are of, deltas are B minus A. Generated "
            "from gpudoctor/model by `python -m gpudoctor.report.schema compare`."
        ),
        "$ref": "#/$defs/Comparison",
        "$defs": dict(sorted(defs.items())),
    }


def schema_text() -> str:
    return json.dumps(report_schema(), indent=2, ensure_ascii=False) + "\n"


def comparison_schema_text() -> str:
    return json.dumps(comparison_schema(), indent=2, ensure_ascii=False) + "\n"


SCHEMAS = {"report": schema_text, "compare": comparison_schema_text}

if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "report"
    if which not in SCHEMAS:
        sys.exit(f"usage: python -m gpudoctor.report.schema [{' | '.join(SCHEMAS)}]")
    sys.stdout.write(SCHEMAS[which]())
