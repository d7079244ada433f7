"""What a GPU can do at most: the one table of dense peak throughput and memory bandwidth.

Every figure is the vendor's datasheet or whitepaper figure for **dense** math (the sparsity
figures halved where a datasheet gives only those), per device as PyTorch sees it (one GCD of an
MI250/MI250X, which shows as two devices). ``half`` is the BF16/FP16 Tensor Core (AMD: matrix core)
peak with FP32 accumulation, the mode PyTorch's matmuls and convolutions use: on GeForce cards it is
half the FP16-accumulate figure their whitepapers headline. ``fp32`` is the non-Tensor-Core FP32
peak on NVIDIA, the FP32 *matrix* peak on AMD Instinct (what FP32 GEMMs reach there). ``tf32`` and
``fp8`` are None where the part has no such Tensor Cores.

A device is matched by the name its trace's ``deviceProperties`` (or the run's manifest) gives,
most specific pattern first; ROCm traces that call an MI250/MI210 GCD "AMD Radeon Graphics" are
matched by compute capability 9.0 (gfx90a) and 64 GB of memory. Anything else is unknown, and the
roofline says so rather than guess.

``rules/speedups.py`` reads the same table (the reference part of each architecture) for the
Tensor Core speed-up models of GD401/GD402: one table of GPU peaks for the whole project.

Sources (dense TFLOPS: FP32 / TF32 / BF16-FP16 / FP8; memory GB/s):

- V100 SXM2 15.7 / - / 125 / -; 900. V100 PCIe 14 / - / 112 / -; 900. V100S PCIe 16.4 / - / 130 / -;
  1134 (NVIDIA Tesla V100 and V100S datasheets).
- T4 8.1 / - / 65 / -; 320 (NVIDIA T4 datasheet).
- A100 SXM4 and PCIe 19.5 / 156 / 312 / -; 1555 (40 GB), 2039 (SXM4 80 GB), 1935 (PCIe 80 GB)
  (NVIDIA A100 datasheet). The A100-PG509-200 of Meta's traces is an A100 SXM4 40 GB board.
- A10 31.2 / 62.5 / 125 / -; 600 (NVIDIA A10 datasheet).
- H100 SXM 67 / 494.7 / 989.4 / 1978.9; 3350. H100 PCIe 51 / 378 / 756 / 1513; 2000.
  H100 NVL 60 / 417.5 / 835.5 / 1670.5; 3900 (NVIDIA H100 datasheet; sparsity figures halved).
- H800 SXM as H100 SXM (3350 GB/s); H800 PCIe as H100 PCIe (NVIDIA H800 datasheet: the H800
  differs in NVLink and FP64, not in these).
- H200 SXM 67 / 494.7 / 989.4 / 1978.9; 4800. H200 NVL 60 / 417.5 / 835.5 / 1670.5; 4800
  (NVIDIA H200 datasheet).
- B200 80 / 1100 / 2250 / 4500; 8000 (NVIDIA HGX/DGX B200 datasheets, per GPU, sparsity halved).
- L4 30.3 / 60 / 121 / 242.5; 300 (NVIDIA L4 datasheet, sparsity halved).
- GeForce RTX 2080 Ti 13.4 / - / 53.8 / -; 616 (NVIDIA Turing whitepaper, reference clocks:
  FP16 Tensor with FP32 accumulate).
- GeForce RTX 3090 35.6 / 35.6 / 71 / -; 936 (NVIDIA Ampere GA102 whitepaper, FP32 accumulate).
- GeForce RTX 4090 82.6 / 82.6 / 165.2 / 330.3; 1008 (NVIDIA Ada Lovelace whitepaper, FP32 accumulate).
- AMD Instinct MI250X, per GCD: 47.9 / - / 191.5 / -; 1638.4. MI250 and MI210 (one GCD, 104 CUs):
  45.3 / - / 181 / -; 1638.4 (AMD Instinct MI250X / MI250 / MI210 datasheets: package figures
  halved for the MI250s' two GCDs).
- AMD Instinct MI300X 163.4 / 653.7 / 1307.4 / 2614.9; 5300 (AMD Instinct MI300X datasheet).
"""

from __future__ import annotations

import re

from gpudoctor.model.metrics import DevicePeak

__all__ = ["ARCH_REFERENCE", "GPU_PEAKS", "match_device", "peak_tflops", "reference_peak"]

_NV = "NVIDIA {} datasheet"


def _p(name: str, fp32: float, tf32: float | None, half: float, fp8: float | None, gbps: float,
       source: str) -> DevicePeak:
    return DevicePeak(name=name, fp32_tflops=fp32, tf32_tflops=tf32, half_tflops=half, fp8_tflops=fp8,
                      memory_gbps=gbps, source=source)


#: (pattern over the lower-case device name, peaks), most specific first.
GPU_PEAKS: tuple[tuple[re.Pattern[str], DevicePeak], ...] = tuple(
    (re.compile(rx), peak)
    for rx, peak in (
        (r"v100s", _p("Tesla V100S PCIe", 16.4, None, 130.0, None, 1134.0, _NV.format("V100S"))),
        (r"v100.*pcie", _p("Tesla V100 PCIe", 14.0, None, 112.0, None, 900.0, _NV.format("Tesla V100"))),
        (r"v100", _p("Tesla V100 SXM2", 15.7, None, 125.0, None, 900.0, _NV.format("Tesla V100"))),
        (r"\bt4\b", _p("Tesla T4", 8.1, None, 65.0, None, 320.0, _NV.format("T4"))),
        (r"a100.*(80\s*gb.*pcie|pcie.*80\s*gb)", _p("A100 PCIe 80GB", 19.5, 156.0, 312.0, None, 1935.0,
                                                     _NV.format("A100"))),
        (r"a100.*80\s*gb", _p("A100 SXM4 80GB", 19.5, 156.0, 312.0, None, 2039.0, _NV.format("A100"))),
        (r"a100", _p("A100 40GB", 19.5, 156.0, 312.0, None, 1555.0, _NV.format("A100"))),
        (r"\ba10\b", _p("A10", 31.2, 62.5, 125.0, None, 600.0, _NV.format("A10"))),
        (r"\bh100.*pcie", _p("H100 PCIe", 51.0, 378.0, 756.0, 1513.0, 2000.0, _NV.format("H100"))),
        (r"\bh100.*nvl", _p("H100 NVL", 60.0, 417.5, 835.5, 1670.5, 3900.0, _NV.format("H100"))),
        (r"\bh100", _p("H100 SXM", 67.0, 494.7, 989.4, 1978.9, 3350.0, _NV.format("H100"))),
        (r"\bh800.*pcie", _p("H800 PCIe", 51.0, 378.0, 756.0, 1513.0, 2000.0, _NV.format("H800"))),
        (r"\bh800", _p("H800 SXM", 67.0, 494.7, 989.4, 1978.9, 3350.0, _NV.format("H800"))),
        (r"\bh200.*nvl", _p("H200 NVL", 60.0, 417.5, 835.5, 1670.5, 4800.0, _NV.format("H200"))),
        (r"\bh200", _p("H200 SXM", 67.0, 494.7, 989.4, 1978.9, 4800.0, _NV.format("H200"))),
        (r"\bb200\b", _p("B200", 80.0, 1100.0, 2250.0, 4500.0, 8000.0, "NVIDIA HGX/DGX B200 datasheet")),
        (r"\bl4\b", _p("L4", 30.3, 60.0, 121.0, 242.5, 300.0, _NV.format("L4"))),
        (r"2080\s*ti", _p("GeForce RTX 2080 Ti", 13.4, None, 53.8, None, 616.0, "NVIDIA Turing whitepaper")),
        (r"3090(?!\s*ti)", _p("GeForce RTX 3090", 35.6, 35.6, 71.0, None, 936.0, "NVIDIA Ampere GA102 whitepaper")),
        (r"4090(?!\s*d)", _p("GeForce RTX 4090", 82.6, 82.6, 165.2, 330.3, 1008.0, "NVIDIA Ada Lovelace whitepaper")),
        (r"mi250x", _p("Instinct MI250X (one GCD)", 47.9, None, 191.5, None, 1638.4, "AMD Instinct MI250X datasheet")),
        (r"mi250|mi210", _p("Instinct MI250/MI210 (one GCD)", 45.3, None, 181.0, None, 1638.4,
                            "AMD Instinct MI250 / MI210 datasheets")),
        (r"mi300x", _p("Instinct MI300X", 163.4, 653.7, 1307.4, 2614.9, 5300.0, "AMD Instinct MI300X datasheet")),
    )
)

_BY_NAME = {peak.name: peak for _, peak in GPU_PEAKS}

#: The reference part of each architecture (compute capability; "amd" for ROCm, which reports none
#: NVIDIA would): the figures ``rules/speedups.py`` models Tensor Core speed-ups with.
ARCH_REFERENCE: dict[str, DevicePeak] = {
    "7.0": _BY_NAME["Tesla V100 SXM2"],
    "7.5": _BY_NAME["Tesla T4"],
    "8.0": _BY_NAME["A100 SXM4 80GB"],
    "8.6": _BY_NAME["A10"],
    "9.0": _BY_NAME["H100 SXM"],
    "10.0": _BY_NAME["B200"],
    "amd": _BY_NAME["Instinct MI300X"],
}

_GIB = 1 << 30


def _is_amd(name: str) -> bool:
    return any(w in name for w in ("amd", "instinct", "radeon"))


def match_device(name: str, compute_capability: str | None = None,
                 total_memory_bytes: int | None = None) -> DevicePeak | None:
    """The table's entry for a device, by its name (None: not in the table). A ROCm device named
    only "AMD Radeon Graphics" with compute capability 9.0 (gfx90a) and 64 GB is one GCD of an
    MI250 (or an MI210, the same figures)."""
    n = " ".join(name.lower().split())
    if n:
        for rx, peak in GPU_PEAKS:
            if rx.search(n):
                return peak
    if (_is_amd(n) and compute_capability in ("9.0", "9.0.0")
            and total_memory_bytes is not None and 60 * _GIB <= total_memory_bytes <= 68 * _GIB):
        return _BY_NAME["Instinct MI250/MI210 (one GCD)"]
    return None


def peak_tflops(peak: DevicePeak | None, dtype: str) -> float | None:
    """The dense peak for math in ``dtype`` ("fp32", "tf32", "bf16", "fp16", "fp8"); None where the
    device has no such units (or is unknown, or the dtype has no Tensor Core peak: fp64, integers)."""
    if peak is None:
        return None
    return {
        "fp32": peak.fp32_tflops,
        "tf32": peak.tf32_tflops,
        "bf16": peak.half_tflops,
        "fp16": peak.half_tflops,
        "fp8": peak.fp8_tflops,
    }.get(dtype)


def reference_peak(arch: str) -> DevicePeak | None:
    """The reference part of an architecture key of ``ARCH_REFERENCE``."""
    return ARCH_REFERENCE.get(arch)
