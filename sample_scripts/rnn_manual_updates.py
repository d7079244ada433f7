"""A word-level LSTM language model updated by hand, its batches re-tokenized from text every step.

Problem: the loop has the shape of PyTorch's ``word_language_model`` example: no
optimizer object (parameters updated by hand, ``p.data.add_(p.grad, alpha=-lr)``
after ``loss.backward()`` and gradient clipping), no DataLoader (each batch is a
``bptt``-token slice of the corpus, one column per stream). But the corpus is kept
as text: every step cuts its slice out of the raw lines and tokenizes it then
(Unicode normalisation, lower-casing, a regex word split, accents stripped as
BERT's basic tokenizer does, byte-pair encoding of each word as GPT-2's does),
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

WORDS = 2000  # words of the toy language; the model sees their subword pieces
WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")
SYLLABLES = [c + v for c in "bcdfghjklmnprstvz" for v in "aeiou"] + ["qu", "th", "sh", "ch"]


def make_words(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < WORDS:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def make_merges(words: list[str]) -> list[tuple[str, str]]:
    """BPE merge rules, in rank order: letters into syllables, then the commonest syllable pairs."""
    merges = [(s[0], s[1:]) for s in SYLLABLES]
    pairs: dict[tuple[str, str], int] = {}
    for w in words:
        syl = [w[i : i + 2] for i in range(0, len(w), 2)]
        for a, b in zip(syl, syl[1:], strict=False):
            pairs[(a, b)] = pairs.get((a, b), 0) + 1
    merges += sorted(pairs, key=lambda p: (-pairs[p], p))[:60]
    return merges


def make_lines(n_words: int, words: list[str], seed: int = 1) -> list[str]:
    """Sentences of a toy language: each word tends to follow from the one before."""
    rng = random.Random(seed)
    lines, line, prev = [], [], 1
    for _ in range(n_words):
        prev = (prev * 7 + rng.randint(1, 40)) % len(words)
        line.append(words[prev])
        if rng.random() < 0.08:
            lines.append(" ".join(line).capitalize() + ".")
            line = []
    if line:
        lines.append(" ".join(line).capitalize() + ".")
    return lines


class Tokenizer:
    """Normalise, split into words, then byte-pair-encode each word (merges applied by rank,
    as GPT-2's tokenizer does), in pure Python."""

    def __init__(self, merges: list[tuple[str, str]]) -> None:
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        pieces = sorted({c for pair in merges for c in pair} | {a + b for a, b in merges})
        self.ids = {p: i + 2 for i, p in enumerate(pieces)}  # 0: <eos>, 1: <unk>
        self.size = len(pieces) + 2

    def bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            pairs = list(zip(parts, parts[1:], strict=False))
            best = min(pairs, key=lambda pair: self.ranks.get(pair, 1 << 30))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return parts

    @staticmethod
    def strip_accents(word: str) -> str:
        """As BERT's basic tokenizer does: decompose, drop the combining marks."""
        return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")

    def __call__(self, line: str) -> list[int]:
        words = WORD_RE.findall(unicodedata.normalize("NFKC", line).lower())
        return [self.ids.get(p, 1) for w in words for p in self.bpe(self.strip_accents(w))] + [0]  # <eos> after each line


class TextStreams:
    """The corpus as text, cut into ``batch_size`` streams of lines; planted: each batch is
    tokenized when it is needed, from the next lines of every stream."""

    def __init__(self, lines: list[str], tokenizer: Tokenizer, batch_size: int) -> None:
        per = len(lines) // batch_size
        self.streams = [lines[i * per : (i + 1) * per] for i in range(batch_size)]
        self.tokenizer = tokenizer
        self.tokens_per_stream: int | None = None  # unknown until tokenized
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
            if len(ids) < bptt + 1:
                raise ValueError("the corpus ran out: give more --words or fewer --steps")
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
    def __init__(self, ntoken: int, ninp: int = 16, nhid: int = 16) -> None:
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
    p.add_argument("--words", type=int, default=150_000, help="corpus size in words (default 150000)")
    p.add_argument("--batch-size", type=int, default=64, help="streams (default 64)")
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--lr", type=float, default=5.0)
    p.add_argument("--steps", type=int, default=150, help="batches to train on (default 150)")
    p.add_argument("--quick", action="store_true", help="a few steps only (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.words, args.steps = 20_000, 6

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    words = make_words()
    tokenizer = Tokenizer(make_merges(words))
    lines = make_lines(args.words, words)
    corpus = (TokenStreams if args.fixed else TextStreams)(lines, tokenizer, args.batch_size)
    model = RNNModel(tokenizer.size).to(device)
    criterion = nn.CrossEntropyLoss()
    steps = args.steps if corpus.tokens_per_stream is None else min(args.steps, (corpus.tokens_per_stream - 1) // args.bptt)
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
        loss = criterion(output.view(-1, tokenizer.size), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for param in model.parameters():
            param.data.add_(param.grad, alpha=-args.lr)
        total += loss.item()
    print(f"{steps} batches, mean loss {total / max(steps, 1):.3f} (ppl {math.exp(total / max(steps, 1)):.1f}), "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
