"""Kineto trace events as typed structs (only the fields gpudoctor reads), and what they mean.

``Event`` and ``Args`` are decoded by msgspec straight from the file's bytes (``EVENTS_DECODER``;
``KnownEvent``, the same fields with the known categories and phases as literals, first: ``KNOWN_EVENTS_DECODER``);
``event_from_dict`` converts what only a JSON parser reads (odd types, NaN) leniently. The
category codes (``CATEGORY_GROUPS``: host kinds, device kinds, flows, memory, ignored; the
2021 spellings apart) and ``Header`` (what the top-level object says besides
``traceEvents``) are read here; ``columns.ColumnBuilder`` turns batches of events into
columns with the vector helpers at the end of this module.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, Union

import msgspec
import numpy as np

from gpudoctor.model.metrics import DeviceInfo
from gpudoctor.model.trace import (
    NO_VALUE,
    DeviceKind,
    HostKind,
)

_NO_RAW = msgspec.Raw()
_NAN = float("nan")


class Args(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` keys gpudoctor reads; every other key is skipped by the decoder."""

    correlation: int = NO_VALUE
    external_id: int = msgspec.field(default=NO_VALUE, name="External id")
    external_id_legacy: int = msgspec.field(default=NO_VALUE, name="external id")  # 2021 traces
    device: Union[int, str] = NO_VALUE  # noqa: UP007 - ROCm runtime calls write "0x0" strings
    stream: Union[int, str] = NO_VALUE  # noqa: UP007
    bytes: Union[int, str] = NO_VALUE  # noqa: UP007
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    sequence: int = msgspec.field(default=NO_VALUE, name="Sequence number")
    fwd_thread: int = msgspec.field(default=NO_VALUE, name="Fwd thread id")
    total_allocated: int = msgspec.field(default=NO_VALUE, name="Total Allocated")
    total_reserved: int = msgspec.field(default=NO_VALUE, name="Total Reserved")
    mem_bytes: int = msgspec.field(default=0, name="Bytes")
    device_id: int = msgspec.field(default=NO_VALUE, name="Device Id")
    device_type: int = msgspec.field(default=NO_VALUE, name="Device Type")


_NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One trace event as the typed decoder keeps it. A missing ``ts``/``dur`` stays NaN (a
    JSON number is never NaN), so an event that lacks one is told from one at 0."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0  # noqa: UP007 - msgspec needs the runtime union on 3.10
    tid: Union[int, str] = 0  # noqa: UP007
    ts: float = _NAN  # µs
    dur: float = _NAN  # µs
    id: Union[int, str, None] = None  # noqa: UP007 - flow events
    args: Args = _NO_ARGS


# category -> group. 0..5: HostKind; 10..13: DeviceKind + 10; then the rest.
_FLOW = 20
_FWDBWD = 21
_MEMORY = 22
_IGNORED = 23
_UNKNOWN = 99

# 2021 spellings get their own codes so that one np.unique of the codes tells the schema
_LEGACY_OPERATOR, _LEGACY_RUNTIME = 6, 7
_LEGACY_KERNEL, _LEGACY_MEMCPY, _LEGACY_MEMSET = 14, 15, 16
_HOST_KIND_OF = np.array([0, 1, 2, 3, 4, 5, HostKind.CPU_OP, HostKind.RUNTIME], np.int8)  # code -> HostKind
_DEVICE_KIND_OF = np.array(
    [0, 1, 2, 3, DeviceKind.KERNEL, DeviceKind.MEMCPY, DeviceKind.MEMSET], np.int8
)  # code - 10 -> DeviceKind

CATEGORY_GROUPS: dict[str, int] = {
    "cpu_op": HostKind.CPU_OP,
    "Operator": _LEGACY_OPERATOR,
    "user_annotation": HostKind.USER_ANNOTATION,
    "python_function": HostKind.PYTHON_FUNCTION,
    "cuda_runtime": HostKind.RUNTIME,
    "Runtime": _LEGACY_RUNTIME,
    "cuda_driver": HostKind.DRIVER,
    "overhead": HostKind.OTHER,
    "kernel": 10 + DeviceKind.KERNEL,
    "Kernel": _LEGACY_KERNEL,
    "gpu_memcpy": 10 + DeviceKind.MEMCPY,
    "Memcpy": _LEGACY_MEMCPY,
    "gpu_memset": 10 + DeviceKind.MEMSET,
    "Memset": _LEGACY_MEMSET,
    "gpu_user_annotation": 10 + DeviceKind.ANNOTATION,
    "ac2g": _FLOW,
    "async_gpu": _FLOW,  # 2021
    "async_cpu_to_gpu": _FLOW,
    "fwdbwd": _FWDBWD,
    "cpu_instant_event": _MEMORY,
    "": _IGNORED,  # metadata ("M") and global instants without a category
    "Trace": _IGNORED,  # the profiler's own span
    "cuda_profiler_range": _IGNORED,
}
_LEGACY_CODES = frozenset({_LEGACY_OPERATOR, _LEGACY_RUNTIME, _LEGACY_KERNEL, _LEGACY_MEMCPY, _LEGACY_MEMSET})


@dataclass
class Header:
    """What the top-level object says besides ``traceEvents``."""

    devices: tuple[DeviceInfo, ...] = ()
    rank: int | None = None
    world_size: int | None = None
    backend: str = ""
    base_time_ns: int | None = None
    record_shapes: bool = False
    with_stack: bool = False
    profile_memory: bool = False
    trace_name: str = ""
    rocm: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Header:
        h = Header()
        devices = []
        for d in obj.get("deviceProperties") or ():
            if not isinstance(d, dict):
                continue
            try:
                idx = int(d.get("id", len(devices)))
            except (TypeError, ValueError):
                continue
            major, minor = d.get("computeMajor"), d.get("computeMinor")
            cc = f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None
            mem = d.get("totalGlobalMem")
            devices.append(
                DeviceInfo(
                    index=idx,
                    name=str(d.get("name", "")),
                    compute_capability=cc,
                    total_memory_bytes=int(mem) if isinstance(mem, (int, float)) else None,
                )
            )
        h.devices = tuple(devices)
        dist = obj.get("distributedInfo")
        if isinstance(dist, dict):
            h.rank = _int_or_none(dist.get("rank"))
            h.world_size = _int_or_none(dist.get("world_size"))
            h.backend = str(dist.get("backend", "") or "")
        h.base_time_ns = _int_or_none(obj.get("baseTimeNanoseconds"))
        h.record_shapes = bool(obj.get("record_shapes"))
        h.with_stack = bool(obj.get("with_stack"))
        h.profile_memory = bool(obj.get("profile_memory"))
        h.trace_name = str(obj.get("traceName", "") or "")
        h.rocm = any(k in obj for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version"))
        return h


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)  # "12", "0x0"
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return int(f) if f.is_integer() else None
    return None


def _int(v: Any, default: int = NO_VALUE) -> int:
    r = _int_or_none(v)
    return default if r is None else r


def _number(v: Any) -> float | None:
    """A finite JSON number as float (``True``, ``"12"``, NaN, ``null`` are not)."""
    if type(v) is float or type(v) is int:
        try:
            f = float(v)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    return None


def _raw(v: Any) -> msgspec.Raw:
    if v is None:
        return _NO_RAW
    return msgspec.Raw(json.dumps(v, separators=(", ", ": ")).encode())


def _is_used(cat: str, ph: str) -> bool:
    """Whether an event of this category and phase would be analyzed (flow endpoints are not:
    they only help recover correlation ids, and one without a time is just not used)."""
    g = CATEGORY_GROUPS.get(cat, _UNKNOWN)
    return (g < _FLOW and ph == "X") or g == _MEMORY


def event_from_dict(d: dict[str, Any]) -> tuple[Event | None, str]:
    """A lenient conversion of one raw event that the typed decoder refused, and why it is
    dropped (``""`` when it is kept). Odd types in ``args`` or ``pid``/``tid`` become
    defaults; an event that would be used but has no numeric ``ts`` (``dur`` for a
    complete event) is dropped and counted, never used with a made-up time."""
    cat = d.get("cat", "")
    cat = cat if isinstance(cat, str) else str(cat)
    ph = d.get("ph", "")
    ph = ph if isinstance(ph, str) else str(ph)
    ts = _number(d.get("ts"))
    dur = _number(d.get("dur"))
    if _is_used(cat, ph):
        if ts is None:
            return None, "ts missing" if "ts" not in d else "ts not a number"
        if ph == "X" and dur is None:
            return None, "dur missing" if "dur" not in d else "dur not a number"
    a = d.get("args")
    args = _NO_ARGS
    if isinstance(a, dict):
        args = Args(
            correlation=_int(a.get("correlation")),
            external_id=_int(a.get("External id")),
            external_id_legacy=_int(a.get("external id")),
            device=_int(a.get("device")),
            stream=_int(a.get("stream")),
            bytes=_int(a.get("bytes")),
            input_dims=_raw(a.get("Input Dims")),
            input_type=_raw(a.get("Input type")),
            concrete=_raw(a.get("Concrete Inputs")),
            sequence=_int(a.get("Sequence number")),
            fwd_thread=_int(a.get("Fwd thread id")),
            total_allocated=_int(a.get("Total Allocated")),
            total_reserved=_int(a.get("Total Reserved")),
            mem_bytes=_int(a.get("Bytes"), 0),
            device_id=_int(a.get("Device Id")),
            device_type=_int(a.get("Device Type")),
        )
    pid = d.get("pid", 0)
    tid = d.get("tid", 0)
    fid = d.get("id")
    name = d.get("name", "")
    return Event(
        ph=ph,
        cat=cat,
        name=name if isinstance(name, str) else str(name),
        pid=pid if isinstance(pid, (int, str)) and not isinstance(pid, bool) else str(pid),
        tid=tid if isinstance(tid, (int, str)) and not isinstance(tid, bool) else str(tid),
        ts=_NAN if ts is None else ts,
        dur=_NAN if dur is None else dur,
        id=fid if isinstance(fid, (int, str)) and not isinstance(fid, bool) else None,
        args=args,
    ), ""


EVENTS_DECODER = msgspec.json.Decoder(list[Event])

# The phases of the Trace Event Format ("" where absent).
PHASES = ("", "X", "B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O", "N", "D", "M", "V", "v",
          "R", "c", "(", ")")


class KnownEvent(msgspec.Struct, gc=False):
    """``Event`` for the usual file, whose every ``cat`` is one of ``CATEGORY_GROUPS`` and every
    ``ph`` one of ``PHASES``: decoded as literals, each is one shared string (its hash cached)
    instead of two new strings per event, to make and to free. Measured on the 320 MB benchmark
    trace's pieces: decoding ~25% faster, and the passes over ``cat`` and ``ph`` several times.
    A piece with another category or phase fails validation and is decoded as ``Event``."""

    ph: Literal[PHASES] = ""  # type: ignore[valid-type]
    cat: Literal[tuple(CATEGORY_GROUPS)] = ""  # type: ignore[valid-type]
    name: str = ""
    pid: Union[int, str] = 0  # noqa: UP007
    tid: Union[int, str] = 0  # noqa: UP007
    ts: float = _NAN  # µs
    dur: float = _NAN  # µs
    id: Union[int, str, None] = None  # noqa: UP007
    args: Args = _NO_ARGS


KNOWN_EVENTS_DECODER = msgspec.json.Decoder(list[KnownEvent])
_ENCODER = msgspec.json.Encoder()

_CAT = attrgetter("cat")
_PH = attrgetter("ph")
_TS = attrgetter("ts")
_DUR = attrgetter("dur")
_ARGS = attrgetter("args")
_PID = attrgetter("pid")
_TID = attrgetter("tid")
_PIDTID = attrgetter("pid", "tid")
_ID = attrgetter("id")
_CORR = attrgetter("correlation")
_EXT = attrgetter("external_id")
_EXT_LEGACY = attrgetter("external_id_legacy")
_DIMS = attrgetter("input_dims")
_TYPES = attrgetter("input_type")
_CONCRETE = attrgetter("concrete")
_SEQ = attrgetter("sequence")
_FWD = attrgetter("fwd_thread")
_DEVICE = attrgetter("device")
_STREAM = attrgetter("stream")
_BYTES = attrgetter("bytes")
_IS_X = "X".__eq__
_GROUP = CATEGORY_GROUPS.get


_MAX_US = 9.0e15  # |µs| beyond this (year 2255 from the epoch) overflows int64 nanoseconds


def _in_range(us: np.ndarray) -> np.ndarray:
    """Finite and convertible to int64 ns (False for NaN: absent)."""
    with np.errstate(invalid="ignore"):
        return np.abs(us) <= _MAX_US


def _take(items: list[Any], idx: np.ndarray) -> list[Any]:
    if len(idx) == len(items):
        return items
    return list(map(items.__getitem__, idx.tolist()))


def _floats(getter: Any, items: list[Any]) -> np.ndarray:
    return np.fromiter(map(getter, items), np.float64, len(items))


def _ints(getter: Any, items: list[Any]) -> np.ndarray:
    """An int64 column from an attribute that is an int, or a string such as ROCm's "0x0"."""
    try:
        return np.fromiter(map(getter, items), np.int64, len(items))
    except (ValueError, TypeError, OverflowError):  # a string among them, or beyond int64
        pass
    values = list(map(getter, items))
    out = [v if type(v) is int else _int(v) for v in values]
    return np.array([v if -(1 << 63) <= v < (1 << 63) else NO_VALUE for v in out], dtype=np.int64)


def _external_ids(args: list[Args]) -> np.ndarray:
    """"External id", or the 2021 spelling "external id" where it is absent."""
    ext = _ints(_EXT, args)
    missing = np.flatnonzero(ext == NO_VALUE)
    if len(missing):
        ext[missing] = _ints(_EXT_LEGACY, _take(args, missing))
    return ext


def _intern(table: dict[Any, int], keys: list[Any]) -> np.ndarray:
    """Ids of ``keys`` in ``table`` (new keys get the next ids, in order of first appearance)."""
    ids = list(map(table.get, keys))
    if None in ids:
        for i, v in enumerate(ids):
            if v is None:
                ids[i] = table.setdefault(keys[i], len(table))
    return np.array(ids, dtype=np.int32)


def _intern_names(table: dict[str, int], events: list[Event]) -> np.ndarray:
    """``_intern`` of the events' names: one pass (a comprehension, faster here than ``map``
    with an attrgetter) when every name is known already, the usual case after a first batch."""
    get = table.get
    try:
        return np.fromiter([get(e.name) for e in events], np.int32, len(events))
    except TypeError:  # a name not seen yet (None)
        return _intern(table, [e.name for e in events])


def _intern_raw(table: dict[bytes, int], getter: Any, args: list[Args]) -> np.ndarray:
    """Ids of JSON texts; ``table`` starts as ``{b"": NO_VALUE}`` (absent), so ids count from 0."""
    try:  # one pass when every text is known already
        return np.fromiter(map(table.get, map(bytes, map(getter, args))), np.int32, len(args))
    except TypeError:  # a text not seen yet (None)
        pass
    keys = list(map(bytes, map(getter, args)))
    ids = list(map(table.get, keys))
    if None in ids:
        for i, v in enumerate(ids):
            if v is None:
                ids[i] = table.setdefault(keys[i], len(table) - 1)
    return np.array(ids, dtype=np.int32)


# the columns of a ColumnBuilder; those of interned ids are remapped when parts are joined


# --------------------------------------------------------------------------- the builder's vector helpers


def _remap(mine: dict[Any, int], theirs: dict[Any, int]) -> np.ndarray:
    """Their id -> my id, adding their keys I lack (in their order, after mine)."""
    out = np.empty(len(theirs), dtype=np.int32)
    for key, i in theirs.items():
        out[i] = mine.setdefault(key, len(mine))
    return out


def _remap_raw(mine: dict[bytes, int], theirs: dict[bytes, int]) -> np.ndarray:
    out = np.empty(max(len(theirs) - 1, 0), dtype=np.int32)
    for key, i in theirs.items():
        if key:
            out[i] = mine.setdefault(key, len(mine) - 1)
    return out


def _canonical_strings(
    dims: dict[bytes, int], types: dict[bytes, int], concrete: dict[bytes, int]
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray]:
    """The interned "Input Dims", "Input type" and "Concrete Inputs" texts as one table in one spelling
    (Kineto's own: ``[[64, 32], []]``), so a re-indented file gives the same strings; and
    each table's id -> string index."""
    out: list[str] = []
    index: dict[str, int] = {}
    maps = []
    for table in (dims, types, concrete):
        remap = np.empty(max(len(table) - 1, 0), dtype=np.int32)
        for b, i in table.items():
            if not b:
                continue
            s = b.decode("utf-8", errors="replace")
            try:  # every spelling of the same value becomes one (a few hundred distinct texts)
                s = json.dumps(json.loads(s), separators=(", ", ": "))
            except ValueError:
                pass
            j = index.get(s)
            if j is None:
                j = index[s] = len(out)
                out.append(s)
            remap[i] = j
        maps.append(remap)
    return tuple(out), maps[0], maps[1], maps[2]


_BLOCK = 1 << 18


def _ns(a: array) -> array:
    """µs (float64 column) -> integer ns, in blocks so temporaries stay small, written in place
    into the new column. Whole µs and the fraction are converted separately: epoch-based µs
    (1.7e15) times 1000 would exceed float64's exact integers; a block of whole µs (older
    Kineto writes integers) skips the fraction."""
    n = len(a)
    if not n:
        return array("q")
    out = array("q", bytes(8 * n))
    f = np.frombuffer(a, dtype=np.float64)
    o = np.frombuffer(out, dtype=np.int64)
    for i in range(0, n, _BLOCK):
        blk = f[i : i + _BLOCK]
        whole = np.floor(blk)
        frac = blk - whole
        ob = o[i : i + _BLOCK]
        ob[:] = whole  # exact: |µs| <= _MAX_US < 2**53
        ob *= 1000
        if frac.any():
            frac *= 1000.0
            ob += np.rint(frac).astype(np.int64)
    return out


def _has_fraction(a: array, sample: int = 1 << 16) -> bool:
    if not len(a):
        return False
    f = np.frombuffer(a, dtype=np.float64)[:sample]
    return bool(np.any(f != np.floor(f)))


def _to_array(code: str, v: np.ndarray) -> array:
    out = array(code)
    out.frombytes(np.ascontiguousarray(v).view(np.uint8))
    return out
