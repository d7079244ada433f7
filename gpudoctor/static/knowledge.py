"""What ``gpudoctor check`` knows about PyTorch's API, in tables (no torch import).

Every qualified name here is what an import-resolved expression looks like:
``from torch.utils.data import DataLoader as DL; DL(...)`` is
``torch.utils.data.DataLoader``.
"""

from __future__ import annotations

import re
from functools import cache

DATALOADERS = frozenset(
    {
        "torch.utils.data.DataLoader",
        "torch.utils.data.dataloader.DataLoader",
        "torchdata.stateful_dataloader.StatefulDataLoader",
    }
)

#: ``DataLoader.__init__``'s positional parameters, in order (torch 2.x; the rest are keyword-only).
DATALOADER_POSITIONAL = (
    "dataset",
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
)

#: Datasets already held in memory as tensors: indexing them is cheap, workers give little.
IN_MEMORY_DATASETS = frozenset({"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"})

DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
        "torch.nn.parallel.data_parallel",
        "torch.nn.parallel.data_parallel.data_parallel",
    }
)
DDP = frozenset(
    {
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_shard",
    }
)

EMPTY_CACHE = frozenset({"torch.cuda.empty_cache", "torch.cuda.memory.empty_cache"})

#: autocast spellings: qualified name -> the current spelling when it is deprecated, else "".
AUTOCAST = {
    "torch.autocast": "",
    "torch.amp.autocast": "",
    "torch.amp.autocast_mode.autocast": "",
    "torch.cuda.amp.autocast": 'torch.autocast("cuda", ...)',
    "torch.cuda.amp.autocast_mode.autocast": 'torch.autocast("cuda", ...)',
    "torch.cpu.amp.autocast": 'torch.autocast("cpu", ...)',
    "torch.cpu.amp.autocast_mode.autocast": 'torch.autocast("cpu", ...)',
}
GRAD_SCALER = {
    "torch.amp.GradScaler": "",
    "torch.amp.grad_scaler.GradScaler": "",
    "torch.GradScaler": "",
    "torch.cuda.amp.GradScaler": 'torch.amp.GradScaler("cuda")',
    "torch.cuda.amp.grad_scaler.GradScaler": 'torch.amp.GradScaler("cuda")',
}

CONV_LAYERS = frozenset(
    f"torch.nn.{kind}{d}d"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for d in (1, 2, 3)
) | frozenset(
    f"torch.nn.modules.conv.{kind}{d}d" for kind in ("Conv", "ConvTranspose") for d in (1, 2, 3)
)  # functional convolutions are left out: they also serve CPU augmentation in Datasets

#: torchvision / timm model families that are convolutional networks.
CNN_FAMILIES = re.compile(
    r"^(resnet|resnext|wide_resnet|vgg|densenet|mobilenet|efficientnet|convnext|regnet|alexnet|googlenet|"
    r"inception|shufflenet|squeezenet|mnasnet|fcn_|deeplabv3|lraspp|fasterrcnn|maskrcnn|keypointrcnn|"
    r"retinanet|ssd|ssdlite|fcos|r3d|r2plus1d|mc3|s3d|unet|csp|darknet|dla|dpn|ghostnet|hrnet|nfnet|"
    r"rexnet|selecsls|res2net|resnest|seresnet|senet|tresnet|xception|cspresnet)",
    re.IGNORECASE,
)

NO_GRAD_CONTEXTS = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.no_grad",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
    }
)
SET_GRAD_ENABLED = frozenset(
    {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.autograd.grad_mode.set_grad_enabled"}
)

CUDNN_BENCHMARK = "torch.backends.cudnn.benchmark"
CUDNN_DETERMINISTIC = "torch.backends.cudnn.deterministic"
DETERMINISTIC_ALGORITHMS = "torch.use_deterministic_algorithms"
TF32_FLAGS = frozenset({"torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"})
MATMUL_PRECISION = "torch.set_float32_matmul_precision"
COMPILE = frozenset({"torch.compile"})
JIT = frozenset({"torch.jit.script", "torch.jit.trace", "torch.jit.trace_module"})
CUDA_AVAILABLE = frozenset({"torch.cuda.is_available"})

#: Optimizers of ``torch.optim`` and the torch release that first has each implementation.
#: ``foreach``: the multi-tensor implementation, the default on CUDA since torch 2.0 when the user
#: passes neither flag. ``fused``: one fused kernel set for all parameters (CUDA), opt-in.
#: Adam gained ``fused`` in 1.13 and AdamW in 2.0, SGD in 2.3 (PyTorch release notes). Adagrad's
#: ``fused`` started CPU-only (2.5), so it is not recommended for GPU training here.
#: LBFGS and SparseAdam have neither implementation.
OPTIMIZERS: dict[str, tuple[str | None, str | None]] = {
    # class: (foreach since, fused since)
    "Adam": ("2.0", "2.0"),
    "AdamW": ("2.0", "2.0"),
    "SGD": ("2.0", "2.3"),
    "Adagrad": ("2.0", None),
    "Adadelta": ("2.0", None),
    "Adamax": ("2.0", None),
    "ASGD": ("2.0", None),
    "NAdam": ("2.0", None),
    "RAdam": ("2.0", None),
    "RMSprop": ("2.0", None),
    "Rprop": ("2.0", None),
    "LBFGS": (None, None),
    "SparseAdam": (None, None),
}


def optimizer_class(qualname: str | None) -> str | None:
    """``torch.optim.AdamW`` / ``torch.optim.adamw.AdamW`` -> ``AdamW``; None for anything else."""
    if not qualname or not qualname.startswith("torch.optim."):
        return None
    last = qualname.rsplit(".", 1)[-1]
    return last if last in OPTIMIZERS else None


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+]", text)[:3]:
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


@cache
def installed_torch_version() -> str | None:
    """The installed torch's version from package metadata: torch itself is never imported."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def optimizer_support(cls: str, torch_version: str | None) -> tuple[bool, bool]:
    """(has foreach, has fused) for an optimizer class in the given torch (None: current torch)."""
    foreach_since, fused_since = OPTIMIZERS.get(cls, (None, None))
    have = _version_tuple(torch_version) if torch_version else None

    def ok(since: str | None) -> bool:
        if since is None:
            return False
        return have is None or have >= _version_tuple(since)

    return ok(foreach_since), ok(fused_since)


#: A name (last dotted part) that holds a model or a loss module: calling it returns device tensors.
MODEL_NAME = re.compile(
    r"^(model|models|net|network|module|encoder|decoder|backbone|head|classifier|generator|"
    r"discriminator|criterion|criterium|loss_fn|lossfn|loss_func|loss_function|loss_module|"
    r"\w*_model|model_\w+|\w*net|\w*_net|\w*_encoder|\w*_decoder|\w*_head|\w*_criterion|criterion_\w+)$",
    re.IGNORECASE,
)

#: The receiver of ``.step()`` that is an optimizer (an LR scheduler's ``.step()`` is not a step marker).
OPTIMIZER_NAME = re.compile(r"^(\w*optim\w*|opt|\w*_opt|opt_\w+|\w*optimizer\w*)$", re.IGNORECASE)
SCALER_NAME = re.compile(r"scaler", re.IGNORECASE)

#: A name that holds a device (argument of ``.to(...)``).
DEVICE_NAME = re.compile(r"(device|dev$|^dev|gpu|cuda|rank)", re.IGNORECASE)

#: Method calls whose result is a Python value, not a tensor.
VALUE_METHODS = frozenset(
    {"item", "tolist", "size", "dim", "numel", "nelement", "element_size", "data_ptr", "is_contiguous",
     "get_device", "stride", "storage_offset", "__len__", "keys", "items", "values"}
)
#: Attributes of a tensor that are metadata (reading them does not touch its data).
META_ATTRS = frozenset(
    {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout", "is_leaf", "names"}
)
#: Parameters / buffers of a module: iterating them yields device tensors, not batches.
PARAM_ITERATORS = frozenset(
    {"parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children",
     "named_children", "state_dict"}
)

#: Names of methods run by a framework once per training step.
FRAMEWORK_STEP_METHODS = frozenset({"training_step"})

#: Functions whose loops over batches are evaluation even without a ``.eval()`` call in them
#: (``test`` is left out: ``test_*`` functions are unit tests).
EVAL_FUNCTION = re.compile(
    r"(^|_)(eval|evaluate|evaluation|valid|validate|validation|infer|inference|predict)(_|$)", re.IGNORECASE
)
