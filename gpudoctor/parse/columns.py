"""Typed event structs (only the fields gpudoctor reads) and the column builder.

Both parsers end here: the chunked one hands lists of msgspec ``Event`` structs to
``ColumnBuilder.add_events``; the streaming fallback hands plain dicts to
``add_dicts``, which coerces them leniently into the same structs. ``build()`` turns
the columns into a ``Timeline``: timestamps become integer nanoseconds here, once.
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec
import numpy as np

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


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys gpudoctor reads; every other key is skipped by the decoder."""

    correlation: int = NO_VALUE
    external_id: int = msgspec.field(default=NO_VALUE, name="External id")
    external_id_legacy: int = msgspec.field(default=NO_VALUE, name="external id")  # 2021 traces
    device: Union[int, str] = NO_VALUE  # noqa: UP007 - ROCm runtime calls write "0x0" strings
    stream: Union[int, str] = NO_VALUE  # noqa: UP007
    bytes: Union[int, str] = NO_VALUE  # noqa: UP007
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    sequence: int = msgspec.field(default=NO_VALUE, name="Sequence number")
    fwd_thread: int = msgspec.field(default=NO_VALUE, name="Fwd thread id")
    total_allocated: int = msgspec.field(default=NO_VALUE, name="Total Allocated")
    total_reserved: int = msgspec.field(default=NO_VALUE, name="Total Reserved")
    mem_bytes: int = msgspec.field(default=0, name="Bytes")
    device_id: int = msgspec.field(default=NO_VALUE, name="Device Id")
    device_type: int = msgspec.field(default=NO_VALUE, name="Device Type")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0  # noqa: UP007 - msgspec needs the runtime union on 3.10
    tid: Union[int, str] = 0  # noqa: UP007
    ts: float = 0.0  # µs
    dur: float = 0.0  # µs
    id: Union[int, str, None] = None  # noqa: UP007 - flow events
    args: Union[Args, None] = None  # noqa: UP007


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
_NO_ARGS = Args()


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


def _float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return 0.0
    return 0.0


def _raw(v: Any) -> msgspec.Raw:
    if v is None:
        return _NO_RAW
    return msgspec.Raw(json.dumps(v, separators=(", ", ": ")).encode())


def event_from_dict(d: dict[str, Any]) -> Event:
    """A lenient conversion of one raw event (streaming fallback): odd types become defaults."""
    a = d.get("args")
    args = None
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
    return Event(
        ph=str(d.get("ph", "") or ""),
        cat=str(d.get("cat", "") or ""),
        name=str(d.get("name", "") or ""),
        pid=pid if isinstance(pid, (int, str)) and not isinstance(pid, bool) else str(pid),
        tid=tid if isinstance(tid, (int, str)) and not isinstance(tid, bool) else str(tid),
        ts=_float(d.get("ts")),
        dur=_float(d.get("dur")),
        id=fid if isinstance(fid, (int, str)) and not isinstance(fid, bool) else None,
        args=args,
    )


class ColumnBuilder:
    """Accumulates events into typed columns; ``build()`` makes the ``Timeline``."""

    def __init__(self, path: str, parser: str) -> None:
        self.path = path
        self.parser = parser
        self.names: dict[str, int] = {}
        self.strings: dict[bytes, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.codes_seen: set[int] = set()
        self.unknown: Counter[str] = Counter()
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

    def add_dicts(self, dicts: list[Any]) -> None:
        self.add_events([event_from_dict(d) for d in dicts if isinstance(d, dict)])
        self.event_count += sum(1 for d in dicts if not isinstance(d, dict))

    def add_events(self, events: list[Event]) -> None:
        """Append a batch of decoded events, one column at a time (list comprehensions
        over the batch are several times faster than one Python loop over events)."""
        self.event_count += len(events)
        groups = CATEGORY_GROUPS
        g = np.array([groups.get(e.cat, _UNKNOWN) for e in events], dtype=np.int8)
        self.codes_seen.update(np.unique(g).tolist())
        hidx = np.flatnonzero(g < 10)
        didx = np.flatnonzero((g >= 10) & (g < 20))
        if len(hidx):
            # Python frames first (they carry none of the args columns), then the rest:
            # the host table is grouped by batch, not in file order
            py = g[hidx] == HostKind.PYTHON_FUNCTION
            if py.any():
                frames = _complete_only([events[i] for i in hidx[py].tolist()])
                self._add_frames(frames)
                hidx = hidx[~py]
            host = _complete_only([events[i] for i in hidx.tolist()])
            if len(host) != len(hidx):  # a host category in another phase: not kept
                hidx = hidx[[e.ph == "X" for e in (events[i] for i in hidx.tolist())]]
            if len(host):
                self._add_host(host, _HOST_KIND_OF[g[hidx]])
        if len(didx):
            dev = _complete_only([events[i] for i in didx.tolist()])
            if len(dev) != len(didx):
                didx = didx[[e.ph == "X" for e in (events[i] for i in didx.tolist())]]
            self._add_device(dev, _DEVICE_KIND_OF[g[didx] - 10])
        fidx = np.flatnonzero(g == _FLOW)
        if len(fidx):
            flows = [events[i] for i in fidx.tolist()]
            keep = [type(e.id) is int and (e.ph == "s" or e.ph == "f") for e in flows]
            flows = [e for e, k in zip(flows, keep, strict=True) if k]
            self.f_ts += array("d", [e.ts for e in flows])
            self.f_id += array("q", [e.id for e in flows])  # type: ignore[misc]
            self.f_start += array("b", [e.ph == "s" for e in flows])
        rest = np.flatnonzero(g > _FLOW)
        for i in rest.tolist():
            e = events[i]
            c = int(g[i])
            if c == _FWDBWD:
                if e.ph == "s":
                    self.fwdbwd += 1
            elif c == _MEMORY:
                a = e.args
                if e.name == "[memory]" and a is not None:
                    self.m_ts.append(e.ts)
                    self.m_device.append(_int(a.device_id) if a.device_type != 0 else -1)
                    self.m_alloc.append(a.total_allocated)
                    self.m_reserved.append(a.total_reserved)
                    self.m_delta.append(a.mem_bytes)
            elif c == _UNKNOWN:
                self.unknown[e.cat or f"(no category, phase {e.ph!r})"] += 1

    def _add_frames(self, frames: list[Event]) -> None:
        """python_function events: name, time and thread; no args columns to read."""
        n = len(frames)
        names, threads = self.names, self.threads
        self.h_kind += array("b", [HostKind.PYTHON_FUNCTION]) * n
        self.h_name += array("i", [names.setdefault(e.name, len(names)) for e in frames])
        self.h_ts += array("d", [e.ts for e in frames])
        self.h_dur += array("d", [e.dur for e in frames])
        self.h_thread += array("i", [threads.setdefault((e.pid, e.tid), len(threads)) for e in frames])
        none_q = array("q", [NO_VALUE]) * n
        none_i = array("i", [NO_VALUE]) * n
        self.h_corr += none_q
        self.h_ext += none_q
        self.h_dims += none_i
        self.h_types += none_i
        self.h_flags += array("b", [0]) * n

    def _add_host(self, host: list[Event], kinds: np.ndarray) -> None:
        names, strings, threads = self.names, self.strings, self.threads
        self.h_kind.frombytes(kinds.astype(np.int8).tobytes())
        self.h_name += array("i", [names.setdefault(e.name, len(names)) for e in host])
        self.h_ts += array("d", [e.ts for e in host])
        self.h_dur += array("d", [e.dur for e in host])
        self.h_thread += array("i", [threads.setdefault((e.pid, e.tid), len(threads)) for e in host])
        args = [e.args or _NO_ARGS for e in host]
        self.h_corr += array("q", [a.correlation for a in args])
        self.h_ext += array("q", [a.external_id if a.external_id != NO_VALUE else a.external_id_legacy for a in args])
        self.h_dims += array("i",
            [strings.setdefault(bytes(a.input_dims), len(strings)) if a.input_dims else NO_VALUE for a in args]
        )
        self.h_types += array("i",
            [strings.setdefault(bytes(a.input_type), len(strings)) if a.input_type else NO_VALUE for a in args]
        )
        self.h_flags += array("b",
            [
                (HOST_FLAG_SEQUENCE if a.sequence != NO_VALUE else 0)
                | (HOST_FLAG_FWD_THREAD if a.fwd_thread != NO_VALUE else 0)
                for a in args
            ]
        )

    def _add_device(self, dev: list[Event], kinds: np.ndarray) -> None:
        names = self.names
        self.d_kind.frombytes(kinds.astype(np.int8).tobytes())
        self.d_name += array("i", [names.setdefault(e.name, len(names)) for e in dev])
        self.d_ts += array("d", [e.ts for e in dev])
        self.d_dur += array("d", [e.dur for e in dev])
        args = [e.args or _NO_ARGS for e in dev]
        devices = [a.device if type(a.device) is int else _int(a.device) for a in args]
        self.d_device += array("i",
            [
                d if d != NO_VALUE else (e.pid if type(e.pid) is int else 0)
                for d, e in zip(devices, dev, strict=True)
            ]
        )
        self.d_stream += array("q", [a.stream if type(a.stream) is int else _int(a.stream) for a in args])
        self.d_corr += array("q", [a.correlation for a in args])
        self.d_ext += array("q", [a.external_id if a.external_id != NO_VALUE else a.external_id_legacy for a in args])
        self.d_bytes += array("q", [a.bytes if type(a.bytes) is int else _int(a.bytes) for a in args])

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

    def build(self, header: Header) -> Timeline:
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
            h_corr_np = np.frombuffer(self.h_corr, dtype=np.int64).copy()
            d_corr_np = d_corr_np.copy()
            self._recover_correlations(
                f_ts, h_corr_np, np.frombuffer(h_ts, np.int64), h_kind_np,
                d_corr_np, np.frombuffer(d_ts, np.int64), d_kind_np,
            )
            self.h_corr = _to_array("q", h_corr_np)
            self.d_corr = _to_array("q", d_corr_np)
        flow_count = len(f_ts)
        del f_ts

        names = tuple(self.names)
        codes = self.codes_seen
        has_gpu = bool(len(d_kind_np) and np.any(d_kind_np != DeviceKind.ANNOTATION))
        rocm = header.rocm or any(n.startswith("hip") for n in _runtime_names(names, self))
        if not rocm:
            rocm = any(("AMD" in d.name or "Instinct" in d.name or "Radeon" in d.name) for d in header.devices)
        has_runtime = bool(len(h_kind_np) and np.any((h_kind_np == HostKind.RUNTIME) | (h_kind_np == HostKind.DRIVER)))
        platform = ("rocm" if rocm else "cuda") if (has_gpu or has_runtime) else "cpu"
        info = TraceInfo(
            schema="kineto-legacy" if codes & _LEGACY_CODES else "kineto",
            ts_unit="ns" if fractional else "us",
            platform=platform,
            devices=header.devices,
            rank=header.rank,
            world_size=header.world_size,
            backend=header.backend,
            base_time_ns=header.base_time_ns,
            record_shapes=header.record_shapes or len(self.strings) > 0,
            with_stack=header.with_stack or HostKind.PYTHON_FUNCTION in codes,
            profile_memory=header.profile_memory or len(m_ts) > 0,
            event_count=self.event_count,
            unknown_categories=dict(sorted(self.unknown.items())),
            flow_count=flow_count,
            fwdbwd_flow_count=self.fwdbwd,
            trace_name=header.trace_name,
            parser=self.parser,
        )
        threads = tuple(f"{pid}/{tid}" for pid, tid in self.threads)
        strings, remap = _canonical_strings(self.strings)
        if remap is not None:
            for col in ("h_dims", "h_types"):
                a = np.frombuffer(getattr(self, col), dtype=np.int32)
                setattr(self, col, _to_array("i", np.where(a >= 0, remap[np.maximum(a, 0)], a).astype(np.int32)))
        return Timeline(
            path=self.path,
            names=names,
            strings=strings,
            threads=threads,
            host=HostEvents(
                kind=self.h_kind, name=self.h_name, ts_ns=h_ts, dur_ns=h_dur, thread=self.h_thread,
                correlation=self.h_corr, external_id=self.h_ext, input_dims=self.h_dims,
                input_types=self.h_types, flags=self.h_flags,
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


def _canonical_strings(raw: dict[bytes, int]) -> tuple[tuple[str, ...], np.ndarray | None]:
    """The interned "Input Dims"/"Input type" texts in one spelling (Kineto's own:
    ``[[64, 32], []]``), so a re-indented file gives the same strings; and the id remap
    when two spellings became one (None when nothing changed)."""
    out: list[str] = []
    index: dict[str, int] = {}
    remap = np.arange(len(raw), dtype=np.int32)
    changed = False
    for b, i in raw.items():
        s = b.decode("utf-8", errors="replace")
        if "\n" in s or "\t" in s or ",[" in s or '","' in s or s.startswith("[ ") or ",\"" in s:
            try:
                s = json.dumps(json.loads(s), separators=(", ", ": "))
            except ValueError:
                pass
        j = index.get(s)
        if j is None:
            j = index[s] = len(out)
            out.append(s)
        if j != i:
            changed = True
        remap[i] = j
    return tuple(out), (remap if changed else None)


_BLOCK = 1 << 18


def _complete_only(events: list[Event]) -> list[Event]:
    """Host/device categories are kept as complete ("X") events only."""
    phases = [e.ph for e in events]
    if phases.count("X") == len(phases):
        return events
    return [e for e in events if e.ph == "X"]


def _ns(a: array) -> array:
    """µs (float64 column) -> integer ns, in blocks so temporaries stay small. Whole µs and
    the fraction are converted separately: epoch-based µs (1.7e15) times 1000 would
    exceed float64's exact integers."""
    out = array("q")
    if not len(a):
        return out
    f = np.frombuffer(a, dtype=np.float64)
    for i in range(0, len(f), _BLOCK):
        blk = f[i : i + _BLOCK]
        whole = np.floor(blk)
        v = whole.astype(np.int64)
        v *= 1000
        v += np.rint((blk - whole) * 1000.0).astype(np.int64)
        out.frombytes(v.tobytes())
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
    ids = np.unique(idx[(kind == HostKind.RUNTIME) | (kind == HostKind.DRIVER)])
    return {names[i] for i in ids}
