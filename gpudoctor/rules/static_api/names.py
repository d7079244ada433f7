"""PyTorch's API as both the scanner and the static checks name it (no torch import).

Every qualified name is what an import-resolved expression looks like:
``from torch.nn.parallel import DistributedDataParallel as DDP; DDP(...)`` is
``torch.nn.parallel.DistributedDataParallel``. What only one rule needs lives in
that rule's module; what only the scanner needs, in ``gpudoctor.static.knowledge``.
"""

from __future__ import annotations

import re
from functools import cache

#: Context managers (and decorators) that turn autograd off.
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
COMPILE = frozenset({"torch.compile"})

# Frameworks that run the training loop themselves: their names in messages (``Loop.framework``)
# and the calls that configure them.
LIGHTNING = "Lightning"
HF_TRAINER = "the Hugging Face Trainer"
LIGHTNING_TRAINERS = frozenset({"lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer"})
HF_TRAINING_ARGS = frozenset(
    {"transformers.TrainingArguments", "transformers.Seq2SeqTrainingArguments", "trl.SFTConfig"}
)
HF_TRAINERS = frozenset({"transformers.Trainer", "transformers.Seq2SeqTrainer", "trl.SFTTrainer"})
ACCELERATE = frozenset({"accelerate.Accelerator"})

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


#: A name (last dotted part) that holds a model or a loss module: calling it returns device tensors.
MODEL_NAME = re.compile(
    r"^(model|models|net|network|module|encoder|decoder|backbone|head|classifier|generator|"
    r"discriminator|criterion|criterium|loss_fn|lossfn|loss_func|loss_function|loss_module|"
    r"\w*_model|model_\w+|\w*net|\w*_net|\w*_encoder|\w*_decoder|\w*_head|\w*_criterion|criterion_\w+)$",
    re.IGNORECASE,
)
