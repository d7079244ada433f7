"""The corpus of pytorch/examples' word_language_model (data.py), made up in memory instead of read."""

import torch


class Dictionary:
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus:
    def __init__(self, path):
        self.dictionary = Dictionary()
        for i in range(100):
            self.dictionary.add_word(f"w{i}")
        self.train = torch.randint(0, 100, (2000,))
        self.valid = torch.randint(0, 100, (400,))
        self.test = torch.randint(0, 100, (400,))
