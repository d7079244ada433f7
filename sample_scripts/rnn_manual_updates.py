"""A word-level LSTM language model updated by hand, its batches re-tokenized from text every step.

Problem: the loop has the shape of PyTorch's ``word_language_model`` example: no
optimizer object (parameters updated by hand, ``p.data.add_(p.grad, alpha=-lr)``
after ``loss.backward()`` and gradient clipping), no DataLoader (each batch is a
``bptt``-token slice of the corpus, one column per stream). But the corpus is kept
as text: every step cuts its slice out of the raw lines and tokenizes it then
(Unicode normalisation, lower-casing, a regex word split, vocabulary look-ups),
pure Python on one core for most of each step on a 2-core CPU, while
torch's other intra-op threads wait. The model itself is small and fast.
Expected: GD203
Fix: tokenize the corpus once, up front, into one id tensor (what the example's
``data.Corpus`` does) and slice batches out of it: each step then only trains.

    python sample_scripts/rnn_manual_updates.py            # planted
    python sample_scripts/rnn_manual_updates.py --fixed    # the fix
"""

from __future__ import annotations

import argparse
import math
import random
import re
import time
import unicodedata

import torch
from torch import nn

VOCAB = 2000
WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")


def make_vocabulary(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"] + ["qu", "th", "sh", "ch"]
    words: set[str] = set()
    while len(words) < VOCAB - 1:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))))
    return ["<eos>", *sorted(words)]


def make_lines(n_words: int, vocabulary: list[str], seed: int = 1) -> list[str]:
    """Sentences of a toy language: each word tends to follow from the one before."""
    rng = random.Random(seed)
    lines, words, prev = [], [], 1
    for _ in range(n_words):
        prev = (prev * 7 + rng.randint(1, 40)) % (len(vocabulary) - 1) + 1
        words.append(vocabulary[prev])
        if rng.random() < 0.08:
            lines.append(" ".join(words).capitalize() + ".")
            words = []
    if words:
        lines.append(" ".join(words).capitalize() + ".")
    return lines


class Tokenizer:
    def __init__(self, vocabulary: list[str]) -> None:
        self.ids = {w: i for i, w in enumerate(vocabulary)}

    def __call__(self, line: str) -> list[int]:
        words = WORD_RE.findall(unicodedata.normalize("NFKC", line).lower())
        return [self.ids.get(w, 0) for w in words] + [0]  # <eos> after each line


class TextStreams:
    """The corpus as text, cut into ``batch_size`` streams of lines; planted: each batch is
    tokenized when it is needed, from the next lines of every stream."""

    def __init__(self, lines: list[str], tokenizer: Tokenizer, batch_size: int) -> None:
        per = len(lines) // batch_size
        self.streams = [lines[i * per : (i + 1) * per] for i in range(batch_size)]
        self.tokenizer = tokenizer
        self.tokens_per_stream = min(sum(len(line.split()) + 1 for line in s) for s in self.streams)
        self.cursors = [0] * batch_size  # next line of each stream to tokenize
        self.pending: list[list[int]] = [[] for _ in range(batch_size)]  # tokenized, not used yet

    def batch(self, start: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next bptt tokens of every stream (and the ones after them as targets)."""
        columns = []
        for k, stream in enumerate(self.streams):
            ids = self.pending[k]
            while len(ids) < bptt + 1 and self.cursors[k] < len(stream):
                ids.extend(self.tokenizer(stream[self.cursors[k]]))  # tokenized here, every step
                self.cursors[k] += 1
            columns.append(ids[: bptt + 1])
            self.pending[k] = ids[bptt:]
        block = torch.tensor(columns).t()
        return block[:-1], block[1:]


class TokenStreams:
    """The fix: the corpus tokenized once into a (tokens, batch_size) tensor; batches are slices."""

    def __init__(self, lines: list[str], tokenizer: Tokenizer, batch_size: int) -> None:
        per = len(lines) // batch_size
        streams = [[i for line in lines[k * per : (k + 1) * per] for i in tokenizer(line)] for k in range(batch_size)]
        self.tokens_per_stream = min(len(s) for s in streams)
        self.data = torch.tensor([s[: self.tokens_per_stream] for s in streams]).t().contiguous()

    def batch(self, start: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[start : start + bptt], self.data[start + 1 : start + 1 + bptt]


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int = 64, nhid: int = 64) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor] | None):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(out), hidden


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Train a word-level LSTM language model by hand.")
    p.add_argument("--fixed", action="store_true", help="tokenize the corpus once, up front (the fix)")
    p.add_argument("--words", type=int, default=60_000, help="corpus size in words (default 60000)")
    p.add_argument("--batch-size", type=int, default=16, help="streams (default 16)")
    p.add_argument("--bptt", type=int, default=20)
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--steps", type=int, default=80, help="batches to train on (default 80)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.words, args.steps = 6000, 8

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vocabulary = make_vocabulary()
    tokenizer = Tokenizer(vocabulary)
    lines = make_lines(args.words, vocabulary)
    corpus = (TokenStreams if args.fixed else TextStreams)(lines, tokenizer, args.batch_size)
    model = RNNModel(len(vocabulary)).to(device)
    criterion = nn.CrossEntropyLoss()
    steps = min(args.steps, (corpus.tokens_per_stream - 1) // args.bptt)
    hidden = None
    total = 0.0
    start = time.perf_counter()
    for i in range(steps):
        data, targets = corpus.batch(i * args.bptt, args.bptt)
        data, targets = data.to(device), targets.to(device)
        if hidden is not None:
            hidden = tuple(h.detach() for h in hidden)  # truncated backpropagation through time
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output.view(-1, len(vocabulary)), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for param in model.parameters():
            param.data.add_(param.grad, alpha=-args.lr)
        total += loss.item()
    print(f"{steps} batches, mean loss {total / max(steps, 1):.3f} (ppl {math.exp(total / max(steps, 1)):.1f}), "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
