"""A Kineto trace as compact columns: what ``parse/`` produces and ``analysis/`` reads.

A trace is not kept as event dicts (about 2.6 KB each in Python): each event becomes
one row in a few typed ``array.array`` columns, names are interned in one table and
stored as indices, and timestamps are integers in nanoseconds (converted once, at the
parse boundary). Memory grows with the number of events kept and distinct names, not
with the size of the JSON.

Three tables:

- ``HostEvents``: complete events ("X") on CPU threads: ``cpu_op``,
  ``user_annotation``, ``python_function``, ``cuda_runtime`` / ``cuda_driver``
  (ROCm's ``hip*`` calls use the same categories) and the 2021 ``Operator`` /
  ``Runtime``.
- ``DeviceEvents``: complete events on a GPU: ``kernel``, ``gpu_memcpy``,
  ``gpu_memset``, ``gpu_user_annotation`` and the 2021 ``Kernel`` / ``Memcpy`` /
  ``Memset``.
- ``MemoryEvents``: the allocator's ``[memory]`` instant events (``profile_memory``).

A runtime call (``cudaLaunchKernel``, ``cudaMemcpyAsync``, …) and the GPU activity it
started share a correlation id (``correlation`` columns); a CPU op and the runtime
calls and kernels it caused share an external id.

Timestamps are absolute (as in the file, times 1000). Traces written with epoch-based
microsecond floats with three decimals (``1712195495519689.047``) are decoded through
float64, whose resolution at that magnitude is 0.25 µs: such start times are exact to
±125 ns; durations are exact.

Standard library only (``array``); ``analysis/`` views the columns with numpy without
copying (``numpy.frombuffer``).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from enum import IntEnum

from gpudoctor.model.metrics import DeviceInfo

NO_VALUE = -1  # integer columns: "not in the event"


class HostKind(IntEnum):
    CPU_OP = 0  # cpu_op, Operator (2021)
    USER_ANNOTATION = 1  # user_annotation: ProfilerStep#N, record_function, DataLoader, Optimizer.step
    PYTHON_FUNCTION = 2  # python_function (with_stack=True)
    RUNTIME = 3  # cuda_runtime, Runtime (2021); hip* on ROCm
    DRIVER = 4  # cuda_driver (cuLaunchKernel …)
    OTHER = 5  # overhead and other known host categories kept for completeness


class DeviceKind(IntEnum):
    KERNEL = 0  # kernel, Kernel (2021)
    MEMCPY = 1  # gpu_memcpy, Memcpy (2021)
    MEMSET = 2  # gpu_memset, Memset (2021)
    ANNOTATION = 3  # gpu_user_annotation: a record_function range projected on the GPU


#: The range gpudoctor's collector puts around the closure of ``Optimizer.step(closure)`` while the
#: profiler records (Lightning's automatic optimization, LBFGS): the model's forward and backward,
#: which the account charges as such, not to the optimizer (``TraceView.closure_intervals``).
CLOSURE_RANGE = "gpudoctor.closure"
HOST_FLAG_SEQUENCE = 1  # the op carried an autograd "Sequence number"
HOST_FLAG_FWD_THREAD = 2  # the op carried "Fwd thread id" (it runs in the backward pass)


def _q() -> array:
    return array("q")


def _i() -> array:
    return array("i")


def _b() -> array:
    return array("b")


@dataclass(frozen=True, slots=True)
class HostEvents:
    """CPU-side complete events. All columns have the same length. Rows are in file order
    within each parsed batch, Python frames of a batch first: sort by ``ts_ns`` when order
    matters."""

    kind: array = field(default_factory=_b)  # HostKind
    name: array = field(default_factory=_i)  # index into Timeline.names
    ts_ns: array = field(default_factory=_q)
    dur_ns: array = field(default_factory=_q)
    thread: array = field(default_factory=_i)  # index into Timeline.threads
    correlation: array = field(default_factory=_q)  # runtime/driver calls; NO_VALUE otherwise
    external_id: array = field(default_factory=_q)  # "External id"; NO_VALUE when absent
    input_dims: array = field(default_factory=_i)  # index into Timeline.strings ("Input Dims" JSON); NO_VALUE
    input_types: array = field(default_factory=_i)  # index into Timeline.strings ("Input type" JSON); NO_VALUE
    flags: array = field(default_factory=_b)  # HOST_FLAG_* bits
    concrete_inputs: array = field(default_factory=_i)  # index into Timeline.strings ("Concrete Inputs" JSON); NO_VALUE

    def __len__(self) -> int:
        return len(self.ts_ns)


@dataclass(frozen=True, slots=True)
class DeviceEvents:
    """GPU-side complete events, in file order. All columns have the same length."""

    kind: array = field(default_factory=_b)  # DeviceKind
    name: array = field(default_factory=_i)  # index into Timeline.names
    ts_ns: array = field(default_factory=_q)
    dur_ns: array = field(default_factory=_q)
    device: array = field(default_factory=_i)  # GPU index
    stream: array = field(default_factory=_q)  # NO_VALUE when not recorded
    correlation: array = field(default_factory=_q)  # ties it to its runtime call; NO_VALUE
    external_id: array = field(default_factory=_q)  # the op that launched it; NO_VALUE
    bytes: array = field(default_factory=_q)  # memcpy/memset size; NO_VALUE

    def __len__(self) -> int:
        return len(self.ts_ns)


@dataclass(frozen=True, slots=True)
class MemoryEvents:
    """``[memory]`` instant events of the caching allocator (``profile_memory=True``)."""

    ts_ns: array = field(default_factory=_q)
    device: array = field(default_factory=_i)  # -1: CPU memory
    allocated_bytes: array = field(default_factory=_q)  # "Total Allocated" after the event
    reserved_bytes: array = field(default_factory=_q)  # "Total Reserved" after the event
    delta_bytes: array = field(default_factory=_q)  # "Bytes" (negative: a free)

    def __len__(self) -> int:
        return len(self.ts_ns)


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """What the file says about itself (header, tail) and what the parser saw."""

    schema: str = "kineto"  # "kineto" or "kineto-legacy" (2021 categories)
    ts_unit: str = "us"  # "us" (integer µs) or "ns" (fractional µs: nanosecond resolution)
    platform: str = "cpu"  # "cuda", "rocm" or "cpu" (no GPU activity and no GPU runtime)
    devices: tuple[DeviceInfo, ...] = ()  # from deviceProperties
    rank: int | None = None  # distributedInfo.rank
    world_size: int | None = None
    backend: str = ""  # distributedInfo.backend: "nccl", "gloo", …
    base_time_ns: int | None = None  # baseTimeNanoseconds: add to ts_ns for unix time (newer traces)
    record_shapes: bool = False  # "Input Dims"/"Input type" were seen (or the header says so)
    with_stack: bool = False  # python_function events were seen (or the header says so)
    profile_memory: bool = False  # [memory] events were seen (or the header says so)
    event_count: int = 0  # events in traceEvents, every phase
    unknown_categories: dict[str, int] = field(default_factory=dict)  # cat -> count (not kept)
    flow_count: int = 0  # ac2g / async_gpu flow endpoints
    fwdbwd_flow_count: int = 0  # forward -> backward links (the autograd graph was recorded)
    trace_name: str = ""
    parser: str = "chunked"  # "chunked" (typed msgspec decode) or "streaming" (fallback)
    # events that would have been used but were malformed, by reason ("ts not a number": 3); not kept
    dropped_events: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Timeline:
    """One trace file: interned tables plus the three event tables."""

    path: str
    names: tuple[str, ...] = ()  # event names; the name columns index this
    strings: tuple[str, ...] = ()  # "Input Dims" / "Input type" / "Concrete Inputs" values (compact JSON text)
    threads: tuple[str, ...] = ()  # "pid/tid" labels; HostEvents.thread indexes this
    host: HostEvents = field(default_factory=HostEvents)
    device: DeviceEvents = field(default_factory=DeviceEvents)
    memory: MemoryEvents = field(default_factory=MemoryEvents)
    info: TraceInfo = field(default_factory=TraceInfo)

    def name_of(self, index: int) -> str:
        return self.names[index] if 0 <= index < len(self.names) else ""

    def string_of(self, index: int) -> str:
        return self.strings[index] if 0 <= index < len(self.strings) else ""

    @property
    def has_gpu_activity(self) -> bool:
        """A kernel, memcpy or memset (not only GPU-side annotations)."""
        kinds = self.device.kind
        return len(kinds) - kinds.count(DeviceKind.ANNOTATION) > 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the columns (not counting the interned strings)."""
        total = 0
        for table in (self.host, self.device, self.memory):
            for col in table.__slots__:  # type: ignore[attr-defined]
                a = getattr(table, col)
                total += a.itemsize * len(a)
        return total


class TimelineBuilder:
    """Builds a ``Timeline`` one event at a time (tests, small traces, the streaming parser).

    The chunked parser appends whole columns instead (``extend_*``), but both end in
    ``build()``.
    """

    def __init__(self, path: str = "<built>") -> None:
        self.path = path
        self._names: dict[str, int] = {}
        self._strings: dict[str, int] = {}
        self._threads: dict[str, int] = {}
        self.host = HostEvents()
        self.device = DeviceEvents()
        self.memory = MemoryEvents()

    # interning -----------------------------------------------------------------
    def name_id(self, name: str) -> int:
        i = self._names.get(name)
        if i is None:
            i = self._names[name] = len(self._names)
        return i

    def string_id(self, s: str | None) -> int:
        if s is None:
            return NO_VALUE
        i = self._strings.get(s)
        if i is None:
            i = self._strings[s] = len(self._strings)
        return i

    def thread_id(self, label: str) -> int:
        i = self._threads.get(label)
        if i is None:
            i = self._threads[label] = len(self._threads)
        return i

    @property
    def name_table(self) -> dict[str, int]:
        return self._names

    @property
    def string_table(self) -> dict[str, int]:
        return self._strings

    @property
    def thread_table(self) -> dict[str, int]:
        return self._threads

    # one event -------------------------------------------------------------------
    def add_host(
        self,
        kind: HostKind | int,
        name: str,
        ts_ns: int,
        dur_ns: int,
        *,
        thread: str = "0/0",
        correlation: int = NO_VALUE,
        external_id: int = NO_VALUE,
        input_dims: str | None = None,
        input_types: str | None = None,
        flags: int = 0,
        concrete_inputs: str | None = None,
    ) -> int:
        h = self.host
        h.kind.append(int(kind))
        h.name.append(self.name_id(name))
        h.ts_ns.append(int(ts_ns))
        h.dur_ns.append(int(dur_ns))
        h.thread.append(self.thread_id(thread))
        h.correlation.append(int(correlation))
        h.external_id.append(int(external_id))
        h.input_dims.append(self.string_id(input_dims))
        h.input_types.append(self.string_id(input_types))
        h.flags.append(int(flags))
        h.concrete_inputs.append(self.string_id(concrete_inputs))
        return len(h.ts_ns) - 1

    def add_device(
        self,
        kind: DeviceKind | int,
        name: str,
        ts_ns: int,
        dur_ns: int,
        *,
        device: int = 0,
        stream: int = 7,
        correlation: int = NO_VALUE,
        external_id: int = NO_VALUE,
        nbytes: int = NO_VALUE,
    ) -> int:
        d = self.device
        d.kind.append(int(kind))
        d.name.append(self.name_id(name))
        d.ts_ns.append(int(ts_ns))
        d.dur_ns.append(int(dur_ns))
        d.device.append(int(device))
        d.stream.append(int(stream))
        d.correlation.append(int(correlation))
        d.external_id.append(int(external_id))
        d.bytes.append(int(nbytes))
        return len(d.ts_ns) - 1

    def add_memory(
        self, ts_ns: int, device: int, allocated_bytes: int, reserved_bytes: int, delta_bytes: int = 0
    ) -> None:
        m = self.memory
        m.ts_ns.append(int(ts_ns))
        m.device.append(int(device))
        m.allocated_bytes.append(int(allocated_bytes))
        m.reserved_bytes.append(int(reserved_bytes))
        m.delta_bytes.append(int(delta_bytes))

    def build(self, info: TraceInfo | None = None) -> Timeline:
        if info is None:
            has_gpu = len(self.device.kind) - self.device.kind.count(DeviceKind.ANNOTATION) > 0
            info = TraceInfo(
                platform="cuda" if has_gpu else "cpu",
                event_count=len(self.host) + len(self.device) + len(self.memory),
                record_shapes=any(v != NO_VALUE for v in self.host.input_types),
                with_stack=any(k == HostKind.PYTHON_FUNCTION for k in self.host.kind),
                profile_memory=len(self.memory) > 0,
            )
        return Timeline(
            path=self.path,
            names=tuple(self._names),
            strings=tuple(self._strings),
            threads=tuple(self._threads),
            host=self.host,
            device=self.device,
            memory=self.memory,
            info=info,
        )
