"""What the scanner knows about PyTorch's API, in tables (no torch import).

Every qualified name here is what an import-resolved expression looks like:
``from torch.utils.data import DataLoader as DL; DL(...)`` is
``torch.utils.data.DataLoader``. Names the static checks read too live in
``gpudoctor.rules.static_api.names``; what only one rule needs, in that rule's module.
"""

from __future__ import annotations

import re

from gpudoctor.rules.static_api.names import HF_TRAINER, LIGHTNING
from gpudoctor.rules.static_api.names import (
    NO_GRAD_CONTEXTS as NO_GRAD_CONTEXTS,  # the scanner's K.NO_GRAD_CONTEXTS
)

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

SET_GRAD_ENABLED = frozenset(
    {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.autograd.grad_mode.set_grad_enabled"}
)

JIT = frozenset({"torch.jit.script", "torch.jit.trace", "torch.jit.trace_module"})
CUDA_AVAILABLE = frozenset({"torch.cuda.is_available"})
#: Frameworks that place everything on the accelerator they find: CUDA in use (unless ``cpu=True``).
ACCELERATORS = frozenset({"accelerate.Accelerator"})

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

#: ``torch.cuda`` functions that ask about CUDA without using it (documented as safe without a GPU):
#: calling them does not make a script a CUDA script.
CUDA_QUERIES = frozenset(
    {"torch.cuda.is_available", "torch.cuda.device_count", "torch.cuda.is_bf16_supported",
     "torch.cuda.get_device_name", "torch.cuda.get_device_capability", "torch.cuda.get_device_properties",
     "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.is_initialized"}
)
#: ``torch.accelerator`` (torch ≥ 2.6): judged on a CUDA machine, the accelerator is CUDA.
ACCELERATOR_AVAILABLE = frozenset({"torch.accelerator.is_available"})
ACCELERATOR_DEVICE = frozenset({"torch.accelerator.current_accelerator"})

# --------------------------------------------------------------------------- frameworks
# Read from the source alone (nothing imported): which classes a framework drives, and the step
# methods it runs. A step method runs inside the framework's own loop, which the scanner stands in
# for with a loop around the method's body (``Loop.framework``).

#: Base classes (import-resolved) whose subclasses' step methods a framework runs.
FRAMEWORK_MODULES: dict[str, str] = {
    "lightning.LightningModule": LIGHTNING,
    "lightning.pytorch.LightningModule": LIGHTNING,
    "lightning.pytorch.core.LightningModule": LIGHTNING,
    "pytorch_lightning.LightningModule": LIGHTNING,
    "pytorch_lightning.core.LightningModule": LIGHTNING,
    "transformers.Trainer": HF_TRAINER,
    "transformers.Seq2SeqTrainer": HF_TRAINER,
    "trl.SFTTrainer": HF_TRAINER,
}
#: Per framework: (the training step methods, in order of preference: the first one a class defines is
#: the step; evaluation step methods, which the framework runs with autograd off).
FRAMEWORK_METHODS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    LIGHTNING: (("training_step",), frozenset({"validation_step", "test_step", "predict_step"})),
    HF_TRAINER: (("training_step", "compute_loss"), frozenset({"prediction_step"})),
}

#: Names that hold parsed command-line arguments (``args.workers``), besides ``parse_args()`` results.
NAMESPACE_NAMES = frozenset({"args", "opt", "opts", "flags", "FLAGS", "hparams", "hp", "cfg", "options", "cli_args"})
