"""Gradient accumulation over a DataLoader whose collate_fn tokenizes and pads in the training process.

Problem: a small Transformer text classifier trains with gradient accumulation
(four micro-batches per ``optimizer.step()``, an effective batch of 256) from raw
sentences. The DataLoader's ``collate_fn`` does the text work for each
micro-batch: a regex word split, vocabulary look-ups, padding to the longest
sentence and an attention mask, after reading each sentence from storage (0.3 ms
of latency per sentence, simulated with ``time.sleep``, as a network file system
or object store costs). With ``num_workers=0`` all of it runs in the training
process, inside ``DataLoader.__next__``: the loop waits for data for about a fifth
of every optimizer step, four collates per step.
Expected: GD201
Fix: collate in worker processes: ``num_workers`` = cores - 1 (at most 4; 1 on a
2-core machine), ``persistent_workers=True``, ``prefetch_factor=4``, so the next
micro-batches are ready while the model trains on this one.

    python sample_scripts/grad_accumulation_slow_collate.py            # planted
    python sample_scripts/grad_accumulation_slow_collate.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 3000
CLASSES = 4
WORD_RE = re.compile(r"[a-z]+")


def make_vocabulary(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"]
    words: set[str] = set()
    while len(words) < VOCAB - 2:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))))
    return ["<pad>", "<unk>", *sorted(words)]


class Sentences(Dataset):
    """Raw sentences of 20-60 words with a label; each read costs storage latency."""

    def __init__(self, n: int, vocabulary: list[str], read_latency_s: float, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.items = []
        for _ in range(n):
            label = rng.randrange(CLASSES)
            own = vocabulary[2 + label * 500 : 2 + (label + 1) * 500]
            words = [rng.choice(own) if rng.random() < 0.3 else rng.choice(vocabulary[2:]) for _ in range(rng.randint(20, 60))]
            self.items.append((" ".join(words).capitalize() + ".", label))
        self.read_latency_s = read_latency_s

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[str, int]:
        time.sleep(self.read_latency_s)  # the storage read
        return self.items[i]


class Collate:
    """Tokenize, pad and mask a micro-batch of sentences (a picklable callable, for workers)."""

    def __init__(self, vocabulary: list[str]) -> None:
        self.ids = {w: i for i, w in enumerate(vocabulary)}

    def __call__(self, items: list[tuple[str, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [[self.ids.get(w, 1) for w in WORD_RE.findall(text.lower())] for text, _ in items]
        longest = max(len(r) for r in rows)
        tokens = torch.tensor([r + [0] * (longest - len(r)) for r in rows])
        mask = torch.tensor([[1.0] * len(r) + [0.0] * (longest - len(r)) for r in rows])
        labels = torch.tensor([label for _, label in items])
        return tokens, mask, labels


class Classifier(nn.Module):
    """A small Transformer encoder over the tokens, mean-pooled under the mask."""

    def __init__(self, dim: int = 128, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=0)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens), src_key_padding_mask=mask == 0)
        pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return self.head(pooled)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a text classifier with gradient accumulation.")
    p.add_argument("--fixed", action="store_true", help="collate in worker processes (the fix)")
    p.add_argument("--samples", type=int, default=4096, help="sentences (default 4096: 16 optimizer steps)")
    p.add_argument("--micro-batch", type=int, default=64)
    p.add_argument("--accumulate", type=int, default=4, help="micro-batches per optimizer step (default 4)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples = 512

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vocabulary = make_vocabulary()
    dataset = Sentences(args.samples, vocabulary, read_latency_s=0.0003)
    collate = Collate(vocabulary)
    if args.fixed:
        loader = DataLoader(
            dataset, batch_size=args.micro_batch, shuffle=True, collate_fn=collate,
            num_workers=min(4, max(1, (os.cpu_count() or 2) - 1)), persistent_workers=True, prefetch_factor=4,
            pin_memory=device.type == "cuda",
        )  # fmt: skip
    else:
        loader = DataLoader(dataset, batch_size=args.micro_batch, shuffle=True, collate_fn=collate)

    model = Classifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    running, steps = 0.0, 0
    optimizer.zero_grad(set_to_none=True)
    for i, (tokens, mask, labels) in enumerate(loader):
        tokens, mask = tokens.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        loss = criterion(model(tokens, mask), labels) / args.accumulate
        loss.backward()  # gradients add up over the micro-batches
        running += loss.item()
        if (i + 1) % args.accumulate == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps += 1
    print(f"{steps} optimizer steps of {args.accumulate} micro-batches, mean loss {running / max(steps, 1):.3f}, "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
