"""CPU preprocessing in the training loop: every batch of raw text is tokenized in the training process.

Problem: a fastText-style text classifier (an ``EmbeddingBag`` over words and
hashed word n-grams, then an MLP) is fed raw strings by the DataLoader, and the
loop tokenizes each batch itself between ``next(batch)`` and the forward pass:
Unicode normalisation, lower-casing, a regex word split, vocabulary look-ups,
hashed bigrams and trigrams, truncation and padding. That is pure Python on
one core, about 0.4 ms per document and some four fifths of each step on a
2-core CPU, while torch's other intra-op threads (or the GPU) wait. The DataLoader
itself never waits: handing out strings is cheap.
Expected: GD203
Fix: take the work out of the loop body: tokenize in the Dataset, here once up
front since tokenization is deterministic (``TokenizedTexts``: one padded id
tensor, gathered a batch at a time), so each step only trains. For random,
per-epoch transforms the same move is ``Dataset.__getitem__`` with DataLoader
workers, or batched tensor ops on the device.

    python sample_scripts/cpu_preprocessing_in_loop.py            # planted
    python sample_scripts/cpu_preprocessing_in_loop.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import random
import re
import time
import unicodedata
import zlib

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

WORDS = 4000  # vocabulary, ids 2..WORDS+1 (0: padding, 1: unknown)
BUCKETS = 100_000  # hashed bigram and trigram buckets after the words
MAX_TOKENS = 256  # the first 128 word ids, then the first 128 hashed n-grams
TOPICS = 8
WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")


def make_vocabulary(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"] + ["qu", "th", "sh", "ch"]
    words: set[str] = set()
    while len(words) < WORDS:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def make_corpus(n: int, vocabulary: list[str], seed: int = 0) -> tuple[list[str], list[int]]:
    """Documents of 300-700 words; each topic favours its own slice of the vocabulary."""
    rng = random.Random(seed)
    texts, labels = [], []
    per_topic = len(vocabulary) // TOPICS
    for _ in range(n):
        topic = rng.randrange(TOPICS)
        own = vocabulary[topic * per_topic : (topic + 1) * per_topic]
        words = [rng.choice(own) if rng.random() < 0.4 else rng.choice(vocabulary) for _ in range(rng.randint(300, 700))]
        sentences = [" ".join(words[i : i + 12]).capitalize() for i in range(0, len(words), 12)]
        texts.append(". ".join(sentences) + ".")
        labels.append(topic)
    return texts, labels


class Tokenizer:
    """Word ids plus hashed bigrams and trigrams, truncated and padded to ``MAX_TOKENS``."""

    def __init__(self, vocabulary: list[str]) -> None:
        self.ids = {w: i + 2 for i, w in enumerate(vocabulary)}

    def __call__(self, text: str) -> list[int]:
        words = WORD_RE.findall(unicodedata.normalize("NFKC", text).lower())
        ids = [self.ids.get(w, 1) for w in words]
        bigrams = [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
        trigrams = [f"{a} {b}" for a, b in zip(bigrams, words[2:], strict=False)]
        hashed = [WORDS + 2 + zlib.crc32(g.encode()) % BUCKETS for g in bigrams + trigrams]
        tokens = ids[: MAX_TOKENS // 2] + hashed[: MAX_TOKENS // 2]
        return tokens + [0] * (MAX_TOKENS - len(tokens))

    def batch(self, texts: list[str]) -> torch.Tensor:
        return torch.tensor([self(t) for t in texts])


class RawTexts(Dataset):
    def __init__(self, texts: list[str], labels: list[int]) -> None:
        self.texts, self.labels = texts, labels

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> tuple[str, int]:
        return self.texts[i], self.labels[i]


class TokenizedTexts(Dataset):
    """The corpus tokenized once; ``__getitems__`` gathers a batch of id rows with one index op."""

    def __init__(self, texts: list[str], labels: list[int], tokenizer: Tokenizer) -> None:
        self.tokens = tokenizer.batch(texts)
        self.labels = torch.tensor(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[i], self.labels[i]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return self.tokens[idx], self.labels[idx]


def already_batched(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


class BagClassifier(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 512) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(WORDS + 2 + BUCKETS, dim, mode="mean", padding_idx=0, sparse=True)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, TOPICS))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(tokens))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a bag-of-n-grams text classifier.")
    p.add_argument("--fixed", action="store_true", help="tokenize once, in the Dataset (the fix)")
    p.add_argument("--samples", type=int, default=4096, help="documents (default 4096: 64 steps)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.samples, args.epochs, args.batch_size = 128, 1, 32

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vocabulary = make_vocabulary()
    texts, labels = make_corpus(args.samples, vocabulary)
    tokenizer = Tokenizer(vocabulary)
    if args.fixed:
        loader = DataLoader(TokenizedTexts(texts, labels, tokenizer), batch_size=args.batch_size, shuffle=True,
                            collate_fn=already_batched, pin_memory=device.type == "cuda")  # fmt: skip
    else:
        loader = DataLoader(RawTexts(texts, labels), batch_size=args.batch_size, shuffle=True)

    model = BagClassifier().to(device)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)  # takes the sparse embedding gradient
    torch.sparse.check_sparse_tensor_invariants.disable()  # opt out explicitly (silences a warning)
    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in range(args.epochs):
        running = torch.zeros((), device=device)
        for batch, targets in loader:
            tokens = batch if args.fixed else tokenizer.batch(batch)  # planted: tokenized here, every step
            tokens = tokens.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(tokens), targets)
            loss.backward()
            optimizer.step()
            running += loss.detach()
        print(f"epoch {epoch}: mean loss {running.item() / len(loader):.3f}")
    print(f"{args.epochs} epochs, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
