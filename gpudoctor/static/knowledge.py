"""What the scanner knows about PyTorch's API, in tables (no torch import).

Every qualified name here is what an import-resolved expression looks like:
``from torch.utils.data import DataLoader as DL; DL(...)`` is
``torch.utils.data.DataLoader``. Names the static checks read too live in
``gpudoctor.rules.static_api.names``; what only one rule needs, in that rule's module.
"""

from __future__ import annotations

import re

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

JIT = frozenset({"torch.jit.script", "torch.jit.trace", "torch.jit.trace_module"})
CUDA_AVAILABLE = frozenset({"torch.cuda.is_available"})
#: Frameworks that place everything on the accelerator they find: CUDA in use.
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

#: Names that hold parsed command-line arguments (``args.workers``), besides ``parse_args()`` results.
NAMESPACE_NAMES = frozenset({"args", "opt", "opts", "flags", "FLAGS", "hparams", "hp", "cfg", "options", "cli_args"})
