"""NVML (through ``pynvml``, from the nvidia-ml-py distribution), in the parent process.

Everything NVML can refuse is turned into a reason a user can read: no library (no
NVIDIA driver), no permission, driver not loaded, no GPU. A metric a device does not
support is left out of its samples from then on, without failing the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpudoctor.model import Device, GpuSample

# NVML return codes (nvml.h), kept here so the reasons do not depend on pynvml's class names.
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15

# Clock event ("throttle") reason bits (nvml.h nvmlClocksEventReason*).
_THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in _THROTTLE_BITS if mask & bit)


def reason_for(err: BaseException) -> str:
    """A one-line reason for an NVML failure."""
    code = getattr(err, "value", None)
    if code == _LIBRARY_NOT_FOUND:
        return "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this machine"
    if code == _NO_PERMISSION:
        return "NVML: permission denied (the user may not query the GPU here; check the container's device access)"
    if code == _DRIVER_NOT_LOADED:
        return "NVML: the NVIDIA driver is not loaded"
    if code == _FUNCTION_NOT_FOUND:
        return "NVML: the driver is too old for this query"
    if code == _GPU_IS_LOST:
        return "NVML: the GPU fell off the bus"
    return f"NVML: {err}"


@dataclass
class _DeviceState:
    index: int
    handle: Any
    unsupported: set[str] = field(default_factory=set)


class Nvml:
    """An initialised NVML session; :meth:`open` returns (session or None, reason)."""

    def __init__(self, nv: Any, devices: list[_DeviceState]) -> None:
        self.nv = nv
        self._devices = devices
        self.pcie_indices: set[int] | None = None  # devices whose PCIe counters are read; None: all

    @classmethod
    def open(cls, nv: Any | None = None) -> tuple[Nvml | None, str]:
        if nv is None:
            try:
                import pynvml as nv  # noqa: PLC0415 - optional at run time
            except ImportError:
                return None, "nvidia-ml-py (pynvml) is not installed"
        try:
            nv.nvmlInit()
        except Exception as err:  # NVMLError and its subclasses, OSError from a broken library
            return None, reason_for(err)
        try:
            count = nv.nvmlDeviceGetCount()
            devices = [_DeviceState(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        except Exception as err:
            cls._shutdown(nv)
            return None, reason_for(err)
        if not devices:
            cls._shutdown(nv)
            return None, "NVML found no GPU on this machine"
        session = cls(nv, devices)
        if len(devices) > 2:
            # PCIe counters take ~20 ms per device and direction: read them only on
            # devices the run uses, once known (see mark_used).
            session.pcie_indices = set()
        return session, ""

    @staticmethod
    def _shutdown(nv: Any) -> None:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass

    def close(self) -> None:
        self._shutdown(self.nv)

    def _str(self, v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    def versions(self) -> dict[str, str]:
        out = {}
        for key, fn in (("driver", "nvmlSystemGetDriverVersion"), ("nvml", "nvmlSystemGetNVMLVersion")):
            try:
                out[key] = self._str(getattr(self.nv, fn)())
            except Exception:
                pass
        try:
            v = int(self.nv.nvmlSystemGetCudaDriverVersion())
            out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:
            pass
        return out

    def devices(self) -> tuple[Device, ...]:
        out = []
        for d in self._devices:
            name = ""
            total = None
            cc = None
            try:
                name = self._str(self.nv.nvmlDeviceGetName(d.handle))
            except Exception:
                pass
            try:
                total = int(self.nv.nvmlDeviceGetMemoryInfo(d.handle).total)
            except Exception:
                pass
            try:
                major, minor = self.nv.nvmlDeviceGetCudaComputeCapability(d.handle)
                cc = f"{major}.{minor}"
            except Exception:
                pass
            out.append(Device(index=d.index, name=name, total_memory_bytes=total, compute_capability=cc))
        return tuple(out)

    def mark_used(self, pids: set[int]) -> None:
        """Note which devices run ``pids`` (NVML's process lists), to read PCIe counters there."""
        if self.pcie_indices is None:
            return
        for d in self._devices:
            try:
                procs = self.nv.nvmlDeviceGetComputeRunningProcesses(d.handle)
            except Exception:
                continue
            if any(getattr(p, "pid", None) in pids for p in procs):
                self.pcie_indices.add(d.index)

    def _get(self, d: _DeviceState, key: str, fn, *args):  # noqa: ANN001 - tiny helper
        if key in d.unsupported:
            return None
        try:
            return fn(d.handle, *args)
        except Exception as err:
            # not supported on this device (or this driver): stop asking
            if getattr(err, "value", None) != _GPU_IS_LOST:
                d.unsupported.add(key)
            return None

    def sample(self, t_ns: int) -> list[GpuSample]:
        nv = self.nv
        out = []
        for d in self._devices:
            util = self._get(d, "util", nv.nvmlDeviceGetUtilizationRates)
            mem = self._get(d, "mem", nv.nvmlDeviceGetMemoryInfo)
            sm = self._get(d, "sm_clock", nv.nvmlDeviceGetClockInfo, getattr(nv, "NVML_CLOCK_SM", 1))
            mclk = self._get(d, "mem_clock", nv.nvmlDeviceGetClockInfo, getattr(nv, "NVML_CLOCK_MEM", 2))
            power = self._get(d, "power", nv.nvmlDeviceGetPowerUsage)
            temp = self._get(d, "temp", nv.nvmlDeviceGetTemperature, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            thr_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
            thr = self._get(d, "throttle", thr_fn)
            app_sm = self._get(d, "app_clock", getattr(nv, "nvmlDeviceGetApplicationsClock", None), getattr(nv, "NVML_CLOCK_SM", 1))
            max_sm = self._get(d, "max_clock", getattr(nv, "nvmlDeviceGetMaxClockInfo", None), getattr(nv, "NVML_CLOCK_SM", 1))
            limit = self._get(d, "power_limit", getattr(nv, "nvmlDeviceGetEnforcedPowerLimit", None))
            tx = rx = None
            if self.pcie_indices is None or d.index in self.pcie_indices:
                tx = self._get(d, "pcie", nv.nvmlDeviceGetPcieThroughput, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
                rx = self._get(d, "pcie", nv.nvmlDeviceGetPcieThroughput, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
            out.append(
                GpuSample(
                    t_ns=t_ns,
                    index=d.index,
                    util_pct=float(util.gpu) if util is not None else None,
                    mem_util_pct=float(util.memory) if util is not None else None,
                    mem_used_bytes=int(mem.used) if mem is not None else None,
                    mem_total_bytes=int(mem.total) if mem is not None else None,
                    sm_clock_mhz=int(sm) if sm is not None else None,
                    mem_clock_mhz=int(mclk) if mclk is not None else None,
                    power_w=power / 1000.0 if power is not None else None,
                    temp_c=float(temp) if temp is not None else None,
                    throttle_reasons=throttle_names(int(thr)) if thr is not None else (),
                    pcie_tx_kbps=float(tx) if tx is not None else None,
                    pcie_rx_kbps=float(rx) if rx is not None else None,
                    app_sm_clock_mhz=int(app_sm) if app_sm else None,
                    max_sm_clock_mhz=int(max_sm) if max_sm else None,
                    power_limit_w=limit / 1000.0 if limit else None,
                    throttle_read=thr is not None,
                )
            )
        return out
