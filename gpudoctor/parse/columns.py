"""Typed event structs (only the fields gpudoctor reads) and the column builder.

The fast path hands lists of msgspec ``Event`` structs to ``ColumnBuilder.add_events``;
what only a JSON parser reads (odd types, NaN) comes as dicts to ``add_dicts``, which
sends well-typed batches through the same typed decoder and converts the rest leniently.
An event that would be used but has no usable ``ts`` (or ``dur``, for a complete event)
is dropped and counted by reason (``TraceInfo.dropped_events``), never used with a
made-up time. ``build()`` turns the columns into a ``Timeline``: timestamps become
integer nanoseconds here, once; a file with nothing usable is a ``TraceFormatError``.

Rows are kept in file order and the interned tables (names, threads, input shapes) in
order of first appearance, so the ``Timeline`` does not depend on how the file was cut
into pieces or parts (``extend`` joins consecutive parts read by other processes).
"""

from __future__ import annotations

import json
import math
import os
from array import array
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Union

import msgspec
import numpy as np

from gpudoctor.errors import TraceFormatError
from gpudoctor.model.metrics import DeviceInfo
from gpudoctor.model.trace import (
    HOST_FLAG_FWD_THREAD,
    HOST_FLAG_SEQUENCE,
    NO_VALUE,
    DeviceEvents,
    DeviceKind,
    HostEvents,
    HostKind,
    MemoryEvents,
    Timeline,
    TraceInfo,
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
COLUMNS = (
    "h_kind", "h_name", "h_ts", "h_dur", "h_thread", "h_corr", "h_ext", "h_dims", "h_types", "h_flags",
    "h_concrete", "d_kind", "d_name", "d_ts", "d_dur", "d_device", "d_stream", "d_corr", "d_ext", "d_bytes",
    "m_ts", "m_device", "m_alloc", "m_reserved", "m_delta", "f_ts", "f_id", "f_start",
)
_INTERNED = frozenset(("h_name", "h_thread", "h_dims", "h_types", "h_concrete", "d_name"))


class ColumnBuilder:
    """Accumulates events into typed columns; ``build()`` makes the ``Timeline``.

    Rows are kept in file order and names, threads and input shapes are interned in order
    of first appearance, so a file parsed in one piece or in consecutive parts joined with
    ``extend`` (the parts of one file read by several processes) gives the same
    ``Timeline``. A builder is picklable: that is how a part travels between processes.
    """

    def __init__(self, path: str, parser: str, keep_flows: bool = False) -> None:
        self.path = path
        self.parser = parser
        # Flow endpoints serve one purpose: the correlation ids of GPU activity that lacks
        # them (no real trace we have does). Unless kept, they are only counted; a builder
        # that then meets such activity says so (``needs_flows``) and the file is read again
        # with them kept.
        self.keep_flows = keep_flows
        self.needs_flows = False
        self.flow_endpoints = 0
        self.names: dict[str, int] = {}
        self.dims: dict[bytes, int] = {b"": NO_VALUE}
        self.types: dict[bytes, int] = {b"": NO_VALUE}
        self.concrete: dict[bytes, int] = {b"": NO_VALUE}  # "Concrete Inputs"
        self.threads: dict[tuple[Any, Any], int] = {}
        self.codes_seen: set[int] = set()
        self.unknown: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.event_count = 0
        self.fwdbwd = 0
        # host
        self.h_kind = array("b")
        self.h_name = array("i")
        self.h_ts = array("d")
        self.h_dur = array("d")
        self.h_thread = array("i")
        self.h_corr = array("q")
        self.h_ext = array("q")
        self.h_dims = array("i")
        self.h_types = array("i")
        self.h_flags = array("b")
        self.h_concrete = array("i")
        # device
        self.d_kind = array("b")
        self.d_name = array("i")
        self.d_ts = array("d")
        self.d_dur = array("d")
        self.d_device = array("i")
        self.d_stream = array("q")
        self.d_corr = array("q")
        self.d_ext = array("q")
        self.d_bytes = array("q")
        # memory
        self.m_ts = array("d")
        self.m_device = array("i")
        self.m_alloc = array("q")
        self.m_reserved = array("q")
        self.m_delta = array("q")
        # flow endpoints (only to recover correlation ids that the args lack)
        self.f_ts = array("d")
        self.f_id = array("q")
        self.f_start = array("b")
        self.spilled: list[int] | None = None  # the columns' lengths while they are in a file (spill)

    # ------------------------------------------------------------------ input
    def add_dicts(self, items: list[Any]) -> None:
        """Raw events from a JSON parser (Python's, for what msgspec refuses). Well-typed
        batches go through the typed decoder like the fast path; otherwise each event is
        converted leniently and the malformed ones are counted and dropped."""
        if not items:
            return
        try:
            events = EVENTS_DECODER.decode(_ENCODER.encode(items))
        except (msgspec.ValidationError, msgspec.EncodeError, OverflowError, TypeError, ValueError):
            events = []
            dropped = self.dropped
            for d in items:
                if not isinstance(d, dict):
                    dropped["not a JSON object"] += 1
                    continue
                e, why = event_from_dict(d)
                if e is None:
                    dropped[why] += 1
                else:
                    events.append(e)
            self.event_count += len(items) - len(events)
        self.add_events(events)

    def add_events(self, events: list[Event]) -> None:
        """Append a batch of decoded events, one column at a time (a comprehension or ``map``
        per field over the batch; one Python loop over events would be several times slower)."""
        n = len(events)
        self.event_count += n
        if not n:
            return
        group = _GROUP
        codes = [group(e.cat, _UNKNOWN) for e in events]
        g = np.frombuffer(array("b", codes), dtype=np.int8)
        seen = np.flatnonzero(np.bincount(g, minlength=_UNKNOWN + 1)).tolist()  # codes are 0..99
        self.codes_seen.update(seen)
        if _UNKNOWN in seen:
            for i in np.flatnonzero(g == _UNKNOWN).tolist():
                e = events[i]
                self.unknown[e.cat or f"(no category, phase {e.ph!r})"] += 1
        tabled = np.flatnonzero(g < _FLOW)  # host and device categories
        if len(tabled):
            sub = _take(events, tabled)
            gk = g[tabled]
            phases = [e.ph for e in sub]
            ts = _floats(_TS, sub)
            dur = _floats(_DUR, sub)
            all_x = phases.count("X") == len(phases)
            with np.errstate(invalid="ignore"):
                ok = _in_range(ts) & _in_range(dur) & (dur >= 0)
            if not all_x or not ok.all():  # other phases are not kept; malformed complete events are counted
                is_x = np.array([p == "X" for p in phases], dtype=bool)
                ok &= is_x
                self._count_malformed(is_x, ts, dur)
                keep = np.flatnonzero(ok)
                sub, gk, ts, dur = _take(sub, keep), gk[keep], ts[keep], dur[keep]
            if sub:
                self._add_tabled(sub, gk, ts, dur)
        flows = np.flatnonzero(g == _FLOW)
        if len(flows):
            fl = _take(events, flows)
            phases = [e.ph for e in fl]
            self.flow_endpoints += phases.count("s") + phases.count("f")
            if self.keep_flows:
                self._add_flows(fl, phases)
        for i in np.flatnonzero((g > _FLOW) & (g != _UNKNOWN) & (g != _IGNORED)).tolist():
            c = int(g[i])
            e = events[i]
            if c == _FWDBWD:
                if e.ph == "s":
                    self.fwdbwd += 1
            elif c == _MEMORY and e.name == "[memory]":
                if not abs(e.ts) <= _MAX_US:  # NaN too
                    self.dropped["ts missing" if math.isnan(e.ts) else "ts out of range"] += 1
                    continue
                a = e.args
                self.m_ts.append(e.ts)
                self.m_device.append(_int(a.device_id) if a.device_type != 0 else -1)
                self.m_alloc.append(a.total_allocated)
                self.m_reserved.append(a.total_reserved)
                self.m_delta.append(a.mem_bytes)

    def _count_malformed(self, is_x: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> None:
        no_ts = is_x & np.isnan(ts)  # NaN: absent (a JSON number is never NaN)
        far_ts = is_x & ~no_ts & ~_in_range(ts)
        no_dur = is_x & ~no_ts & ~far_ts & np.isnan(dur)
        far_dur = is_x & ~no_ts & ~far_ts & ~no_dur & ~_in_range(dur)
        with np.errstate(invalid="ignore"):
            neg = is_x & ~no_ts & ~far_ts & ~no_dur & ~far_dur & (dur < 0)
        for reason, mask in (("ts missing", no_ts), ("ts out of range", far_ts), ("dur missing", no_dur),
                             ("dur out of range", far_dur), ("dur negative", neg)):
            k = int(np.count_nonzero(mask))
            if k:
                self.dropped[reason] += k

    def _thread_ids(self, host: list[Event]) -> np.ndarray:
        """Ids of the (pid, tid) of each event, new ones in order of first appearance."""
        try:
            pid = np.fromiter(map(_PID, host), np.int64, len(host))
            tid = np.fromiter(map(_TID, host), np.int64, len(host))
        except (ValueError, TypeError, OverflowError):  # string pids/tids ("Spans"): one by one
            return _intern(self.threads, list(map(_PIDTID, host)))
        if not (len(pid) and pid.min() >= 0 and pid.max() < (1 << 31) and tid.min() >= -(1 << 31)
                and tid.max() < (1 << 31)):
            return _intern(self.threads, list(map(_PIDTID, host)))
        key = (pid << 32) + (tid & 0xFFFFFFFF)  # one int64 per (pid, tid)
        order = np.argsort(key, kind="stable")  # sort-based: np.unique hashes, slower here
        srt = key[order]
        head = np.empty(len(srt), dtype=bool)
        head[0] = True
        np.not_equal(srt[1:], srt[:-1], out=head[1:])
        group = np.cumsum(head) - 1
        first = order[head]  # the first event of each (pid, tid), stable sort: in file order
        ids = np.empty(len(first), dtype=np.int32)
        threads = self.threads
        for k in np.argsort(first, kind="stable").tolist():  # new threads in order of first appearance
            i = int(first[k])
            ids[k] = threads.setdefault((int(pid[i]), int(tid[i])), len(threads))
        out = np.empty(len(key), dtype=np.int32)
        out[order] = ids[group]
        return out

    def _add_tabled(self, sub: list[Event], g: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> None:
        """Complete events of host and device categories, in file order."""
        name_ids = _intern_names(self.names, sub)
        on_host = g < 10
        hsel = np.flatnonzero(on_host)
        if len(hsel):
            host = _take(sub, hsel)
            kinds = _HOST_KIND_OF[g[hsel]]
            k = len(host)
            corr = np.full(k, NO_VALUE, np.int64)
            ext = np.full(k, NO_VALUE, np.int64)
            dims = np.full(k, NO_VALUE, np.int32)
            types = np.full(k, NO_VALUE, np.int32)
            concrete = np.full(k, NO_VALUE, np.int32)
            flags = np.zeros(k, np.int8)
            runtime = (kinds == HostKind.RUNTIME) | (kinds == HostKind.DRIVER)
            calls = np.flatnonzero(runtime)  # correlation and external ids
            if len(calls):
                args = [e.args for e in _take(host, calls)]
                corr[calls] = _ints(_CORR, args)
                ext[calls] = _external_ids(args)
            ops = np.flatnonzero(~runtime & (kinds != HostKind.PYTHON_FUNCTION))  # frames carry none
            if len(ops):
                args = [e.args for e in _take(host, ops)]
                ext[ops] = _external_ids(args)
                dims[ops] = _intern_raw(self.dims, _DIMS, args)
                types[ops] = _intern_raw(self.types, _TYPES, args)
                shaped = np.flatnonzero(dims[ops] != NO_VALUE)  # Concrete Inputs come with Input Dims only
                if len(shaped):
                    concrete[ops[shaped]] = _intern_raw(self.concrete, _CONCRETE, _take(args, shaped))
                flags[ops] = ((_ints(_SEQ, args) != NO_VALUE) * HOST_FLAG_SEQUENCE
                              | (_ints(_FWD, args) != NO_VALUE) * HOST_FLAG_FWD_THREAD).astype(np.int8)
            self.h_kind.frombytes(kinds.tobytes())
            self.h_name.frombytes(name_ids[hsel].tobytes())
            self.h_ts.frombytes(ts[hsel].tobytes())
            self.h_dur.frombytes(dur[hsel].tobytes())
            self.h_thread.frombytes(self._thread_ids(host).tobytes())
            self.h_corr.frombytes(corr.tobytes())
            self.h_ext.frombytes(ext.tobytes())
            self.h_dims.frombytes(dims.tobytes())
            self.h_types.frombytes(types.tobytes())
            self.h_flags.frombytes(flags.tobytes())
            self.h_concrete.frombytes(concrete.tobytes())
        dsel = np.flatnonzero(~on_host)
        if len(dsel):
            dev = _take(sub, dsel)
            args = [e.args for e in dev]
            device = _ints(_DEVICE, args)
            missing = device == NO_VALUE
            if missing.any():  # the GPU's index is its pid in Kineto's layout
                pids = _ints(_PID, dev)
                device = np.where(missing, np.where(pids != NO_VALUE, pids, 0), device)
            dkinds = _DEVICE_KIND_OF[g[dsel] - 10]
            self.d_kind.frombytes(dkinds.tobytes())
            self.d_name.frombytes(name_ids[dsel].tobytes())
            self.d_ts.frombytes(ts[dsel].tobytes())
            self.d_dur.frombytes(dur[dsel].tobytes())
            self.d_device.frombytes(device.astype(np.int32).tobytes())
            self.d_stream.frombytes(_ints(_STREAM, args).tobytes())
            corr = _ints(_CORR, args)
            if not self.needs_flows and bool(((corr == NO_VALUE) & (dkinds != DeviceKind.ANNOTATION)).any()):
                self.needs_flows = True
            self.d_corr.frombytes(corr.tobytes())
            self.d_ext.frombytes(_external_ids(args).tobytes())
            self.d_bytes.frombytes(_ints(_BYTES, args).tobytes())

    def _add_flows(self, flows: list[Event], phases: list[str]) -> None:
        """Flow endpoints ("s"/"f" with an integer id): only their time, id and end are kept."""
        try:
            if phases.count("s") + phases.count("f") != len(phases):
                raise TypeError
            fid = np.fromiter(map(_ID, flows), np.int64, len(flows))  # TypeError: a string or no id
        except (TypeError, ValueError, OverflowError):
            flows = [e for e in flows if type(e.id) is int and (e.ph == "s" or e.ph == "f")
                     and -(1 << 63) <= e.id < (1 << 63)]
            phases = [e.ph for e in flows]
            fid = np.fromiter(map(_ID, flows), np.int64, len(flows))
        ts = _floats(_TS, flows)
        bad = ~_in_range(ts)
        start = np.fromiter(map("s".__eq__, phases), bool, len(phases)).view(np.int8)
        if bad.any():  # no time: of no use to match anything
            ts, start, fid = ts[~bad], start[~bad], fid[~bad]
        self.f_ts.frombytes(ts.tobytes())
        self.f_id.frombytes(fid.tobytes())
        self.f_start.frombytes(start.tobytes())

    # ------------------------------------------------------------------ parts
    def spill(self, fd: int) -> None:
        """Write the columns to the file ``fd`` (from its start) and empty them: a part goes
        back to the process that joins the parts with only its tables pickled (``unspill``
        reads the columns back)."""
        os.lseek(fd, 0, os.SEEK_SET)
        with open(fd, "wb", closefd=False) as f:
            for name in COLUMNS:
                getattr(self, name).tofile(f)
        self.spilled = [len(getattr(self, name)) for name in COLUMNS]
        for name in COLUMNS:
            setattr(self, name, array(getattr(self, name).typecode))

    def unspill(self, fd: int) -> None:
        """Read back the columns ``spill`` wrote to ``fd``."""
        if self.spilled is None:
            return
        os.lseek(fd, 0, os.SEEK_SET)
        with open(fd, "rb", closefd=False) as f:
            for name, n in zip(COLUMNS, self.spilled, strict=True):
                col = getattr(self, name)
                col.fromfile(f, n)  # EOFError: the file holds less than was written
        self.spilled = None

    def extend(self, other: ColumnBuilder) -> None:
        """Append ``other``'s rows: the part of the same file that comes right after this one's."""
        names = _remap(self.names, other.names)
        threads = _remap(self.threads, other.threads)
        dims = _remap_raw(self.dims, other.dims)
        types = _remap_raw(self.types, other.types)
        concrete = _remap_raw(self.concrete, other.concrete)

        def mapped(col: array, table: np.ndarray, code: str) -> array:
            a = np.frombuffer(col, dtype=np.int32) if len(col) else np.zeros(0, np.int32)
            out = np.where(a >= 0, table[np.maximum(a, 0)] if len(table) else a, a).astype(np.int32)
            return _to_array(code, out)

        self.h_name += mapped(other.h_name, names, "i")
        self.h_thread += mapped(other.h_thread, threads, "i")
        self.h_dims += mapped(other.h_dims, dims, "i")
        self.h_types += mapped(other.h_types, types, "i")
        self.h_concrete += mapped(other.h_concrete, concrete, "i")
        self.d_name += mapped(other.d_name, names, "i")
        for col in COLUMNS:
            if col not in _INTERNED:
                getattr(self, col).extend(getattr(other, col))
        self.codes_seen |= other.codes_seen
        self.unknown.update(other.unknown)
        self.dropped.update(other.dropped)
        self.event_count += other.event_count
        self.fwdbwd += other.fwdbwd
        self.flow_endpoints += other.flow_endpoints
        self.needs_flows |= other.needs_flows
        self.keep_flows &= other.keep_flows

    # ------------------------------------------------------------------ build
    def _recover_correlations(self, flow_ts: array, host_corr: np.ndarray, host_ts: np.ndarray,
                              host_kind: np.ndarray, dev_corr: np.ndarray, dev_ts: np.ndarray,
                              dev_kind: np.ndarray) -> None:
        """Fill missing correlation ids from flow endpoints (same timestamp), in place."""
        if not len(flow_ts):
            return
        f_ts = np.frombuffer(flow_ts, dtype=np.int64)
        f_id = np.frombuffer(self.f_id, dtype=np.int64)
        f_start = np.frombuffer(self.f_start, dtype=np.int8).astype(bool)
        for ends, corr, ts, mask in (
            (f_start, host_corr, host_ts, (host_kind == HostKind.RUNTIME) | (host_kind == HostKind.DRIVER)),
            (~f_start, dev_corr, dev_ts, dev_kind != DeviceKind.ANNOTATION),
        ):
            need = np.flatnonzero(mask & (corr == NO_VALUE))
            if not len(need) or not ends.any():
                continue
            ets, eid = f_ts[ends], f_id[ends]
            order = np.argsort(ets, kind="stable")
            ets, eid = ets[order], eid[order]
            pos = np.searchsorted(ets, ts[need])
            ok = pos < len(ets)
            hit = np.zeros(len(need), dtype=bool)
            hit[ok] = ets[pos[ok]] == ts[need][ok]
            corr[need[hit]] = eid[pos[hit]]

    def _check_usable(self) -> None:
        """A file with nothing gpudoctor can analyze is an error, not an empty report."""
        if len(self.h_kind) or len(self.d_kind) or len(self.m_ts):
            return
        hint = "it is JSON but not a torch.profiler (Kineto) trace; pass a trace that torch.profiler wrote"
        if self.event_count == 0:
            raise TraceFormatError(self.path, "traceEvents is empty",
                                   "the profiler recorded nothing; profile at least one step, or pass another trace")
        if self.dropped:
            raise TraceFormatError(
                self.path, f"none of its {self.event_count:,} events is usable ({_dropped_text(self.dropped)})", hint
            )
        raise TraceFormatError(
            self.path,
            f"none of its {self.event_count:,} events is a complete CPU or GPU event (ph \"X\" with a Kineto \"cat\")",
            hint,
        )

    def build(self, header: Header) -> Timeline:
        if self.needs_flows and not self.keep_flows:  # the reader must read the file again with flows kept
            raise RuntimeError(f"{self.path}: correlation ids are missing and the flow events were not kept")
        self._check_usable()
        # fractional µs anywhere (durations too: epoch-based starts lose their fraction in float64)
        fractional = any(_has_fraction(a) for a in (self.h_ts, self.d_ts, self.h_dur, self.d_dur))
        # µs floats -> integer ns, column by column, freeing each float column as it goes
        h_ts, self.h_ts = _ns(self.h_ts), array("d")
        h_dur, self.h_dur = _ns(self.h_dur), array("d")
        d_ts, self.d_ts = _ns(self.d_ts), array("d")
        d_dur, self.d_dur = _ns(self.d_dur), array("d")
        m_ts, self.m_ts = _ns(self.m_ts), array("d")
        f_ts, self.f_ts = _ns(self.f_ts), array("d")
        d_kind_np = np.frombuffer(self.d_kind, dtype=np.int8) if len(self.d_kind) else np.zeros(0, np.int8)
        h_kind_np = np.frombuffer(self.h_kind, dtype=np.int8) if len(self.h_kind) else np.zeros(0, np.int8)
        d_corr_np = np.frombuffer(self.d_corr, dtype=np.int64) if len(self.d_corr) else np.zeros(0, np.int64)
        if len(d_corr_np) and np.any((d_corr_np == NO_VALUE) & (d_kind_np != DeviceKind.ANNOTATION)):
            h_corr_np = (np.frombuffer(self.h_corr, dtype=np.int64) if len(self.h_corr)
                         else np.zeros(0, np.int64)).copy()
            d_corr_np = d_corr_np.copy()
            self._recover_correlations(
                f_ts, h_corr_np, np.frombuffer(h_ts, np.int64) if len(h_ts) else np.zeros(0, np.int64), h_kind_np,
                d_corr_np, np.frombuffer(d_ts, np.int64), d_kind_np,
            )
            self.h_corr = _to_array("q", h_corr_np)
            self.d_corr = _to_array("q", d_corr_np)
        del f_ts

        names = tuple(self.names)
        codes = self.codes_seen
        has_gpu = bool(len(d_kind_np) and np.any(d_kind_np != DeviceKind.ANNOTATION))
        rocm = header.rocm or any(n.startswith("hip") for n in _runtime_names(names, self))
        if not rocm:
            rocm = any(("AMD" in d.name or "Instinct" in d.name or "Radeon" in d.name) for d in header.devices)
        has_runtime = bool(len(h_kind_np) and np.any((h_kind_np == HostKind.RUNTIME) | (h_kind_np == HostKind.DRIVER)))
        platform = ("rocm" if rocm else "cuda") if (has_gpu or has_runtime) else "cpu"
        strings, dims_ids, types_ids, concrete_ids = _canonical_strings(self.dims, self.types, self.concrete)
        for col, table in (("h_dims", dims_ids), ("h_types", types_ids), ("h_concrete", concrete_ids)):
            a = np.frombuffer(getattr(self, col), dtype=np.int32) if len(getattr(self, col)) else np.zeros(0, np.int32)
            if len(a) and len(table):
                setattr(self, col, _to_array("i", np.where(a >= 0, table[np.maximum(a, 0)], a).astype(np.int32)))
        info = TraceInfo(
            schema="kineto-legacy" if codes & _LEGACY_CODES else "kineto",
            ts_unit="ns" if fractional else "us",
            platform=platform,
            devices=header.devices,
            rank=header.rank,
            world_size=header.world_size,
            backend=header.backend,
            base_time_ns=header.base_time_ns,
            record_shapes=header.record_shapes or len(strings) > 0,
            with_stack=header.with_stack or HostKind.PYTHON_FUNCTION in codes,
            profile_memory=header.profile_memory or len(m_ts) > 0,
            event_count=self.event_count,
            unknown_categories=dict(sorted(self.unknown.items())),
            flow_count=self.flow_endpoints,
            fwdbwd_flow_count=self.fwdbwd,
            trace_name=header.trace_name,
            parser=self.parser,
            dropped_events=dict(sorted(self.dropped.items())),
        )
        threads = tuple(f"{pid}/{tid}" for pid, tid in self.threads)
        return Timeline(
            path=self.path,
            names=names,
            strings=strings,
            threads=threads,
            host=HostEvents(
                kind=self.h_kind, name=self.h_name, ts_ns=h_ts, dur_ns=h_dur, thread=self.h_thread,
                correlation=self.h_corr, external_id=self.h_ext, input_dims=self.h_dims,
                input_types=self.h_types, flags=self.h_flags, concrete_inputs=self.h_concrete,
            ),
            device=DeviceEvents(
                kind=self.d_kind, name=self.d_name, ts_ns=d_ts, dur_ns=d_dur, device=self.d_device,
                stream=self.d_stream, correlation=self.d_corr, external_id=self.d_ext, bytes=self.d_bytes,
            ),
            memory=MemoryEvents(
                ts_ns=m_ts, device=self.m_device, allocated_bytes=self.m_alloc,
                reserved_bytes=self.m_reserved, delta_bytes=self.m_delta,
            ),
            info=info,
        )


def _dropped_text(dropped: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{n:,} {why}" if why != "not a JSON object" else f"{n:,} not JSON objects"
                     for why, n in sorted(dropped.items()))


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
    out.frombytes(np.ascontiguousarray(v).tobytes())
    return out


def _runtime_names(names: tuple[str, ...], b: ColumnBuilder) -> set[str]:
    if not len(b.h_kind):
        return set()
    kind = np.frombuffer(b.h_kind, dtype=np.int8)
    idx = np.frombuffer(b.h_name, dtype=np.int32)
    ids = np.flatnonzero(np.bincount(idx[(kind == HostKind.RUNTIME) | (kind == HostKind.DRIVER)],
                                     minlength=len(names)))
    return {names[i] for i in ids.tolist()}
