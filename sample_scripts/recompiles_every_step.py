"""Recompiles every step: a compiled model fed sequences whose length changes with each batch.

Problem: a small token classifier (embedding, a two-layer MLP per token, mean
pooling) is compiled with ``torch.compile(model, dynamic=False)`` and trained on
sequences of random length, batched by similar length (as length-grouped
samplers do, to pad little) and padded to the batch's longest sequence. Every
batch therefore brings a new sequence length, ``dynamic=False`` makes Dynamo
specialize the graph on each one, and its guard ("size mismatch at index 1")
fails step after step: the model is recompiled in every step until Dynamo
reaches its recompile limit (8), gives up on the frame, and runs the model
eagerly for the rest of the run. Each recompilation stops the step for as long
as compiling takes. The backend is ``aot_eager`` (``--backend inductor`` for
Inductor): on the 2-core CPU machine the tests run on, each Inductor
recompilation of this model takes about 3.5 s, ``aot_eager``'s 0.3 s; the
recompilations are Dynamo's, whatever the backend.
Expected: GD105
Fix: let the length be dynamic: keep torch's default ``dynamic=None`` and mark
the sequence dimension with ``torch._dynamo.mark_dynamic(tokens, 1)``, so that
one graph serves every length.

    python sample_scripts/recompiles_every_step.py            # planted
    python sample_scripts/recompiles_every_step.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 1000
WIDTH = 128
CLASSES = 4
MIN_LEN, MAX_LEN = 16, 64


class Sequences(Dataset):
    """Token sequences of random length with a label each."""

    def __init__(self, n: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (n,), generator=gen)
        self.seqs = [torch.randint(1, VOCAB, (int(k),), generator=gen) for k in lengths]
        self.labels = torch.randint(0, CLASSES, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.seqs[i], self.labels[i]


def length_grouped_batches(dataset: Sequences, batch_size: int, seed: int = 0) -> list[list[int]]:
    """Batches of sequences of similar length (little padding), in random order."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset.seqs[i]))
    batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    perm = torch.randperm(len(batches), generator=torch.Generator().manual_seed(seed)).tolist()
    return [batches[k] for k in perm]


def pad_to_longest(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pads the batch to its longest sequence (token 0): the length changes from batch to batch."""
    tokens = nn.utils.rnn.pad_sequence([s for s, _ in batch], batch_first=True)
    return tokens, torch.stack([y for _, y in batch])


class TokenClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, WIDTH), nn.GELU())
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != 0).unsqueeze(-1).float()
        h = self.mlp(self.embed(tokens)) * mask
        return self.head(h.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a compiled token classifier on variable-length sequences.")
    p.add_argument("--fixed", action="store_true", help="a dynamic sequence dimension (the fix)")
    p.add_argument("--samples", type=int, default=4096, help="sequences to train on (default 4096)")
    p.add_argument("--backend", default="aot_eager", help="torch.compile backend (default aot_eager; inductor)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples = 96

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = Sequences(args.samples)
    loader = DataLoader(data, batch_sampler=length_grouped_batches(data, 32), collate_fn=pad_to_longest,
                        pin_memory=device.type == "cuda")
    model = TokenClassifier().to(device)
    if args.fixed:
        compiled = torch.compile(model, backend=args.backend)  # dynamic=None: lengths may vary
    else:
        compiled = torch.compile(model, backend=args.backend, dynamic=False)  # a graph per length
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for tokens, labels in loader:
        tokens = tokens.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if args.fixed:
            torch._dynamo.mark_dynamic(tokens, 1)  # one graph for every length
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(compiled(tokens), labels)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    elapsed = time.perf_counter() - start
    print(f"{len(loader)} steps: mean loss {running.item() / len(loader):.3f}, "
          f"{1e3 * elapsed / len(loader):.1f} ms per step")  # fmt: skip


if __name__ == "__main__":
    main()
