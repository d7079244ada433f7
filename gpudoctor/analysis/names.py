"""What an event's name says: syncs, launches, copies, DataLoader, optimizer, Tensor Cores …

Each classifier maps the interned name table to a boolean numpy array indexed by name
id, so a column of name ids is classified with one fancy-indexing operation. CUDA and
ROCm/HIP spellings are both covered.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

# --- host runtime / driver calls -------------------------------------------------------------

# Calls that block the host until the GPU (or a stream/event) is done.
SYNC_CALLS = frozenset(
    {
        "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
        "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
    }
)
# Copies/sets that are synchronous with respect to the host.
SYNC_COPY_CALLS = frozenset(
    {
        "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyPeer", "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol", "cudaMemset", "cudaMemset2D",
        "cuMemcpy", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuMemcpyDtoD_v2", "cuMemcpyHtoD", "cuMemcpyDtoH",
        "hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2D", "hipMemcpyPeer", "hipMemset",
        "hipMemcpyHtoD", "hipMemcpyDtoH", "hipMemcpyDtoD",
    }
)
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice",
        "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch",
        "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
        "hipLaunchCooperativeKernel", "hipGraphLaunch", "hipExtLaunchMultiKernelMultiDevice",
    }
)
ASYNC_COPY_CALLS = frozenset(
    {
        "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync", "cudaMemcpyPeerAsync", "cudaMemsetAsync",
        "cudaMemset2DAsync", "cuMemcpyAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemsetD8Async",
        "cuMemsetD32Async", "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpy2DAsync", "hipMemcpyPeerAsync",
        "hipMemcpyHtoDAsync", "hipMemcpyDtoHAsync", "hipMemcpyDtoDAsync", "hipMemsetD32Async", "hipMemsetD8Async",
    }
)
# Launches of a whole CUDA / HIP graph: every kernel of the graph shares the launch's correlation id.
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
MALLOC_CALLS = frozenset({"cudaMalloc", "cudaMallocAsync", "cuMemAlloc", "cuMemAlloc_v2", "hipMalloc", "hipMallocAsync", "hipExtMallocWithFlags"})
FREE_CALLS = frozenset({"cudaFree", "cudaFreeAsync", "cuMemFree", "cuMemFree_v2", "hipFree", "hipFreeAsync"})

# --- host ops and annotations ----------------------------------------------------------------

_PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__")
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")
_BACKWARD_NODE = re.compile(r"^autograd::engine::evaluate_function: ")
_BACKWARD = re.compile(r"^autograd::engine::evaluate_function: |Backward\d*$|^torch::autograd::AccumulateGrad$")
_CONV_OP = re.compile(r"^aten::(conv\d?d|convolution|_convolution|conv_transpose\d?d)$")
_FP32_ELIGIBLE_OP = re.compile(
    r"^aten::(_?conv\w*|cudnn_convolution\w*|miopen_convolution\w*|(add|b|baddb|addb)?mm|matmul|linear|einsum|"
    r"_?scaled_dot_product\w*|_scaled_mm|_addmm_activation)$"
)
_CONV_FAMILY_OP = re.compile(r"conv")
_LOSS_OP = re.compile(
    r"^aten::(mse_loss|l1_loss|smooth_l1_loss|huber_loss|nll_loss\w*|cross_entropy_loss|binary_cross_entropy\w*|"
    r"kl_div|ctc_loss|margin_ranking_loss|hinge_embedding_loss|soft_margin_loss|multilabel_margin_loss\w*|"
    r"multi_margin_loss|cosine_embedding_loss|triplet_margin_loss|poisson_nll_loss|gaussian_nll_loss)$"
)
# Ops that make the host wait for the device (their sync call is what blocks).
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::equal", "aten::is_nonzero",
                      "aten::tolist", "aten::unique", "aten::_unique2", "aten::masked_select", "aten::repeat_interleave"})
_HOST_COLLECTIVE = re.compile(r"^(nccl|gloo|rccl|mpi|ucc|xccl):")
# What torch.compile leaves in a trace: the frame Dynamo compiled ("Torch-Compiled Region: 0/1", frame
# 0, its second compilation), AOTAutograd's autograd function around the forward and backward graphs
# ("CompiledFunction", "CompiledFunctionBackward"), and Inductor's call of a compiled graph
# ("## Call CompiledFxGraph <hash> ##", a user annotation)
_COMPILED_REGION = re.compile(r"^Torch-Compiled Region")
_COMPILED_FUNCTION = re.compile(r"^CompiledFunction(Backward)?$")
_COMPILED_GRAPH_CALL = re.compile(r"^## Call CompiledFxGraph ")

# --- device kernels --------------------------------------------------------------------------

# Kernel names that run on Tensor Cores (NVIDIA HMMA/IMMA/GMMA instructions, cuBLAS/cuDNN/
# CUTLASS tensor-op kernels, flash attention; AMD matrix-core "MFMA"/"MI…" Tensile kernels).
_TENSOR_CORE = re.compile(
    r"(884|1688|16816|16832|h\d{3,5}gemm|s\d{3,5}gemm|i\d{3,5}gemm|hmma|imma|gmma|wgmma|tensorop|tensor_op|"
    r"xmma|_tc_|tc_kernel|sm\d{2}_.*gemm|nvjet|cutlass.*(f16|bf16|tf32|e4m3|e5m2|s8)|flash|fmha|"
    r"ampere_(fp16|bf16|h|tf32)|turing_(fp16|h)|volta_(fp16|h)|hopper_|mfma|_MI\d+x\d+x\d+|bf16gemm|f16gemm)",
    re.IGNORECASE,
)
# cuBLAS/CUTLASS single-precision SIMT kernels: their names may carry "xmma" or an "sm80_…gemm" prefix
# too ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize256x64x8_stage3_warpsize2x2x1_ffma", a real H200
# trace's FP32 GEMM), but "ffma" (fused multiply-add on the FP32 units) or "simt" says they run on
# the regular units; unless the name also names a Tensor Core instruction or a half/TF32 type
_SIMT_KERNEL = re.compile(r"ffma|simt", re.IGNORECASE)
_TENSOR_CORE_TYPE = re.compile(r"hmma|imma|gmma|tf32|1688|16816|16832|tensorop|tensor_op|bf16|f16|e4m3|e5m2",
                               re.IGNORECASE)
_TF32 = re.compile(r"tf32", re.IGNORECASE)
# Inductor's generated kernels: Triton on a GPU (triton_poi_ pointwise, triton_red_ reduction, triton_per_
# persistent reduction, triton_tem_ templates such as its own matmuls; "triton__0d1d…" in PyTorch 2.0),
# C++ on a CPU (cpp_fused_…)
_TRITON_KERNEL = re.compile(r"^triton_")
_INDUCTOR_CPP_KERNEL = re.compile(r"^cpp_fused_")
_CONV_KERNEL = re.compile(r"(conv|implicit_?gemm|wgrad|dgrad|fprop|winograd|im2col|miopen)", re.IGNORECASE)
_COMM_KERNEL = re.compile(r"^(nccl|rccl)|ncclDevKernel|ncclKernel|cross_device_reduce|all_?reduce_kernel", re.IGNORECASE)
_OPTIMIZER_KERNEL = re.compile(r"(multi_tensor_apply|fused_adam|FusedAdam|adam|sgd|lamb|foreach)", re.IGNORECASE)

_MEMCPY = re.compile(r"^Memcpy\s+(\w+)\s*\(\s*(\w+)\s*->\s*(\w+)\s*\)")
_MEMSET = re.compile(r"^Memset\s*\(\s*(\w+)\s*\)")


def classify(names: tuple[str, ...], pred: Callable[[str], bool]) -> np.ndarray:
    return np.fromiter((bool(pred(n)) for n in names), dtype=bool, count=len(names))


def in_set(names: tuple[str, ...], s: frozenset[str]) -> np.ndarray:
    return classify(names, s.__contains__)


def matches(names: tuple[str, ...], rx: re.Pattern[str]) -> np.ndarray:
    return classify(names, lambda n: rx.search(n) is not None)


_MULTI_PROCESS_ITER = "_MultiProcessingDataLoaderIter"
_SINGLE_PROCESS_ITER = "_SingleProcessDataLoaderIter"


def dataloader_iter_kind(view) -> str:
    """Which DataLoader iterator the trace shows: ``enumerate(DataLoader)#_MultiProcessingDataLoaderIter
    .__next__`` proves worker processes, ``_SingleProcessDataLoaderIter`` proves there are none
    ("multi-process" wins when a run has both); "" when the trace has no DataLoader events."""
    ids = np.unique(view.h_name[view.is_dataloader]) if len(view.h_name) else np.zeros(0, np.int64)
    found = [view.tl.names[int(i)] for i in ids]
    if any(_MULTI_PROCESS_ITER in n for n in found):
        return "multi-process"
    if any(_SINGLE_PROCESS_ITER in n for n in found):
        return "single-process"
    return ""


def profiler_step_number(name: str) -> int | None:
    m = _PROFILER_STEP.match(name)
    return int(m.group(1)) if m else None


def memcpy_kind(name: str) -> tuple[str, str]:
    """``("HtoD", "pageable")`` for "Memcpy HtoD (Pageable -> Device)"; the memory kind is
    the host side of a host↔device copy, "device" for device↔device."""
    m = _MEMCPY.match(name)
    if not m:
        if name.startswith("Memset"):
            return memset_kind(name)
        return "unknown", "unknown"
    direction, src, dst = m.group(1), m.group(2).lower(), m.group(3).lower()
    side = src if direction.startswith("H") else dst if direction.endswith("H") else "device"
    kind = {"pageable": "pageable", "pinned": "pinned", "device": "device", "array": "device"}.get(side, "unknown")
    return direction, kind


def memset_kind(name: str) -> tuple[str, str]:
    m = _MEMSET.match(name)
    side = m.group(1).lower() if m else "unknown"
    return "memset", {"device": "device", "pinned": "pinned", "pageable": "pageable"}.get(side, "unknown")


def is_user_frame(frame: str) -> bool:
    """A python_function name from the user's code, not PyTorch or the standard library."""
    if not frame or frame.startswith("<") or frame.startswith("nn.Module") or frame.startswith("torch/"):
        return False
    path = frame.split("(", 1)[0]
    lowered = path.lower()
    return not any(
        part in lowered
        for part in ("site-packages/", "dist-packages/", "/torch/", "lib/python3", "/threading.py",
                     "/multiprocessing/", "/contextlib.py", "/functools.py")
    )


class NameClasses:
    """Boolean tables over a trace's interned names, built once per trace."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.sync_call = in_set(names, SYNC_CALLS)
        self.sync_copy_call = in_set(names, SYNC_COPY_CALLS)
        self.launch_call = in_set(names, LAUNCH_CALLS)
        self.graph_launch_call = in_set(names, GRAPH_LAUNCH_CALLS)
        self.async_copy_call = in_set(names, ASYNC_COPY_CALLS)
        self.malloc_call = in_set(names, MALLOC_CALLS)
        self.free_call = in_set(names, FREE_CALLS)
        self.dataloader = matches(names, _DATALOADER)
        self.optimizer_step = matches(names, _OPTIMIZER_STEP)
        self.profiler_step = matches(names, _PROFILER_STEP)
        self.backward = matches(names, _BACKWARD)
        self.backward_node = matches(names, _BACKWARD_NODE)  # the autograd engine running one node
        self.conv_op = matches(names, _CONV_OP)
        self.fp32_eligible_op = matches(names, _FP32_ELIGIBLE_OP)
        self.conv_family_op = matches(names, _CONV_FAMILY_OP)  # of those, the convolutions (backward ones too)
        self.loss_op = matches(names, _LOSS_OP)
        self.sync_op = in_set(names, SYNC_OPS)
        self.host_collective = matches(names, _HOST_COLLECTIVE)
        self.compiled_region = matches(names, _COMPILED_REGION)
        self.compiled_function = matches(names, _COMPILED_FUNCTION)
        self.compiled_graph_call = matches(names, _COMPILED_GRAPH_CALL)
        self.triton_kernel = matches(names, _TRITON_KERNEL)
        self.inductor_cpp_kernel = matches(names, _INDUCTOR_CPP_KERNEL)
        self.tensor_core = matches(names, _TENSOR_CORE) & ~(
            matches(names, _SIMT_KERNEL) & ~matches(names, _TENSOR_CORE_TYPE))
        self.tf32 = matches(names, _TF32)
        self.conv_kernel = matches(names, _CONV_KERNEL)
        self.comm_kernel = matches(names, _COMM_KERNEL)
        self.optimizer_kernel = matches(names, _OPTIMIZER_KERNEL)
        self.pageable_copy = classify(names, lambda n: n.startswith("Memcpy") and memcpy_kind(n)[1] == "pageable")

    @property
    def blocking_call(self) -> np.ndarray:
        return self.sync_call | self.sync_copy_call
