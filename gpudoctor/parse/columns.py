"""The column builder: Kineto events (``parse.events``) into the columns of a ``Timeline``.

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

import math
import os
from array import array
from collections import Counter
from typing import Any

import msgspec
import numpy as np

from gpudoctor.errors import TraceFormatError
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
from gpudoctor.parse.events import (  # noqa: F401 - EVENTS_DECODER, Header, _BLOCK, _ns: re-exported
    _BLOCK,
    _BYTES,
    _CONCRETE,
    _CORR,
    _DEVICE,
    _DEVICE_KIND_OF,
    _DIMS,
    _DUR,
    _ENCODER,
    _FLOW,
    _FWD,
    _FWDBWD,
    _GROUP,
    _HOST_KIND_OF,
    _ID,
    _IGNORED,
    _LEGACY_CODES,
    _MAX_US,
    _MEMORY,
    _PID,
    _PIDTID,
    _SEQ,
    _STREAM,
    _TID,
    _TS,
    _TYPES,
    _UNKNOWN,
    EVENTS_DECODER,
    Event,
    Header,
    _canonical_strings,
    _external_ids,
    _floats,
    _has_fraction,
    _in_range,
    _int,
    _intern,
    _intern_names,
    _intern_raw,
    _ints,
    _ns,
    _remap,
    _remap_raw,
    _take,
    _to_array,
    event_from_dict,
)

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
            self.h_kind.frombytes(_bytes(kinds))
            self.h_name.frombytes(_bytes(name_ids[hsel]))
            self.h_ts.frombytes(_bytes(ts[hsel]))
            self.h_dur.frombytes(_bytes(dur[hsel]))
            self.h_thread.frombytes(_bytes(self._thread_ids(host)))
            self.h_corr.frombytes(_bytes(corr))
            self.h_ext.frombytes(_bytes(ext))
            self.h_dims.frombytes(_bytes(dims))
            self.h_types.frombytes(_bytes(types))
            self.h_flags.frombytes(_bytes(flags))
            self.h_concrete.frombytes(_bytes(concrete))
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
            self.d_kind.frombytes(_bytes(dkinds))
            self.d_name.frombytes(_bytes(name_ids[dsel]))
            self.d_ts.frombytes(_bytes(ts[dsel]))
            self.d_dur.frombytes(_bytes(dur[dsel]))
            self.d_device.frombytes(_bytes(device.astype(np.int32)))
            self.d_stream.frombytes(_bytes(_ints(_STREAM, args)))
            corr = _ints(_CORR, args)
            if not self.needs_flows and bool(((corr == NO_VALUE) & (dkinds != DeviceKind.ANNOTATION)).any()):
                self.needs_flows = True
            self.d_corr.frombytes(_bytes(corr))
            self.d_ext.frombytes(_bytes(_external_ids(args)))
            self.d_bytes.frombytes(_bytes(_ints(_BYTES, args)))

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
        self.f_ts.frombytes(_bytes(ts))
        self.f_id.frombytes(_bytes(fid))
        self.f_start.frombytes(_bytes(start))

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


def _bytes(a: np.ndarray) -> np.ndarray:
    """A 1-D contiguous column as its bytes, without a copy (``array.frombytes`` takes a buffer of bytes;
    ``tobytes()`` would copy each batch once more)."""
    return a.view(np.uint8)


def _dropped_text(dropped: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{n:,} {why}" if why != "not a JSON object" else f"{n:,} not JSON objects"
                     for why, n in sorted(dropped.items()))


def _runtime_names(names: tuple[str, ...], b: ColumnBuilder) -> set[str]:
    if not len(b.h_kind):
        return set()
    kind = np.frombuffer(b.h_kind, dtype=np.int8)
    idx = np.frombuffer(b.h_name, dtype=np.int32)
    ids = np.flatnonzero(np.bincount(idx[(kind == HostKind.RUNTIME) | (kind == HostKind.DRIVER)],
                                     minlength=len(names)))
    return {names[i] for i in ids.tolist()}
