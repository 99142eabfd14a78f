"""Lightning's demo language model (``Transformer``, ``LightningTransformer``) and its ``WikiText2`` dataset.

The model has Lightning's API and computation: ``Transformer(vocab_size, ninp, nhead, nhid, nlayers, dropout)``,
``forward(inputs, target, mask=None)`` returns log-probabilities flattened to ``[batch * seq, vocab_size]`` for
``nll_loss``, with the same submodules (``pos_encoder``, ``embedding``, ``transformer``, ``decoder``), so the same
seed gives the same weights and results as Lightning, and checkpoints load both ways.

``WikiText2`` keeps Lightning's constructor, attributes and items, over a generated corpus instead of the
download: sentences from a tiny grammar, as many tokens as WikiText-2's training text (2,088,628), so the same
splits work. ``data_dir`` is not read and nothing is downloaded.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from torchfleet.module import Module

_SUBJECTS = ["the cat", "a dog", "the model", "my friend", "the old ship", "a small bird"]
_VERBS = ["sees", "likes", "follows", "trains", "finds", "carries"]
_OBJECTS = ["the ball", "a tree", "the data", "some bread", "the river", "a red box"]
#: tokens in WikiText-2's training text (with one <eos> a line), which Lightning's WikiText2 reads
WIKITEXT2_TOKENS = 2_088_628


def _causal_mask(size: int) -> Tensor:
    """``size x size``: 0 where a position may attend (itself and before), -inf after."""
    return torch.zeros(size, size).masked_fill(torch.ones(size, size).triu(1).bool(), float("-inf"))


class PositionalEncoding(nn.Module):
    """Sine/cosine position encodings, then dropout (Lightning's demo encoding, computed on first use).

    As in Lightning's demo, every position gets the encoding of position ``seq_len`` (one row, indexed rather
    than sliced): kept, so that results equal Lightning's.
    """

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim, self.max_len = dim, max_len
        # not a buffer and not a parameter: neither belongs in a checkpoint, and DDP needs every parameter used
        self.pe: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.pe is None:
            self.pe = self._table(x.device)
        return self.dropout(x + self.pe[:, x.size(1)])

    def _table(self, device: torch.device) -> Tensor:
        position = torch.arange(0, self.max_len, dtype=torch.float, device=device).unsqueeze(1)
        freq = torch.exp(torch.arange(0, self.dim, 2, device=device).float() * (-math.log(10000.0) / self.dim))
        table = torch.zeros(self.max_len, self.dim, device=device)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq)
        return table.unsqueeze(0)


class Transformer(nn.Module):
    """Lightning's demo encoder-decoder language model (``nn.Transformer``); ``forward(inputs, target)`` returns
    log-probabilities ``[batch * seq, vocab_size]`` (the decoder reads ``target`` under a causal mask)."""

    def __init__(self, vocab_size: int = 33278, ninp: int = 200, nhead: int = 2, nhid: int = 200, nlayers: int = 2,
                 dropout: float = 0.2) -> None:
        super().__init__()
        # created in Lightning's order, so that a seed gives the same initial weights
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid, dropout=dropout,
                                          batch_first=True)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp, self.vocab_size = ninp, vocab_size
        self.src_mask: Tensor | None = None

    def generate_square_subsequent_mask(self, size: int) -> Tensor:
        """A causal mask: position i attends to positions <= i."""
        return _causal_mask(size)

    def forward(self, inputs: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        seq = inputs.size(1)
        if self.src_mask is None or self.src_mask.size(0) != seq:
            self.src_mask = self.generate_square_subsequent_mask(seq).to(inputs.device)  # kept as Lightning's
        if mask is None:
            mask = self.generate_square_subsequent_mask(seq).to(inputs.device)
        scale = math.sqrt(self.ninp)
        src = self.pos_encoder(self.embedding(inputs) * scale)
        tgt = self.pos_encoder(self.embedding(target) * scale)
        logits = self.decoder(self.transformer(src, tgt, tgt_mask=mask))
        return F.log_softmax(logits, dim=-1).view(-1, self.vocab_size)


class Dictionary:
    """Words and their ids, in order of first appearance (``word2idx``, ``idx2word``)."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        if word not in self.word2idx:
            self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


def _generated_corpus(num_tokens: int, seed: int) -> tuple[Tensor, Dictionary]:
    """``num_tokens`` ids of sentences "<subject> <verb> <object> <eos>" drawn with ``seed``, and their dictionary."""
    dictionary = Dictionary()
    phrases = [[[dictionary.add_word(w) for w in p.split()] for p in group] for group in (_SUBJECTS, _VERBS, _OBJECTS)]
    eos = dictionary.add_word("<eos>")
    width = max(len(p) for group in phrases for p in group)
    tables = [torch.tensor([p + [-1] * (width - len(p)) for p in group]) for group in phrases]
    per_sentence = 2 + 1 + 2 + 1  # the shortest sentence: more than enough sentences are drawn
    count = num_tokens // per_sentence + 1
    g = torch.Generator().manual_seed(seed)
    parts = [table[torch.randint(len(table), (count,), generator=g)] for table in tables]
    sentences = torch.cat(parts + [torch.full((count, 1), eos)], dim=1).flatten()
    return sentences[sentences >= 0][:num_tokens].clone(), dictionary


class WikiText2(Dataset):
    """Lightning's WikiText2 (``block_size`` windows, items ``(inputs, target)`` shifted by one token) over the
    generated corpus; ``data_dir`` and ``download`` are accepted and nothing is read or downloaded."""

    def __init__(self, data_dir: Path = Path("./data"), block_size: int = 35, download: bool = True) -> None:
        super().__init__()
        self.path = Path(data_dir) / "wikitext-2.txt"  # where Lightning's would be: never read here
        self.data, self.dictionary = _generated_corpus(WIKITEXT2_TOKENS, seed=0)
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.dictionary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.block_size
        return self.data[start:start + self.block_size], self.data[start + 1:start + self.block_size + 1]

    @staticmethod
    def download(destination: Path) -> None:
        """Nothing to fetch: the corpus is generated."""


class LightningTransformer(Module):
    """Lightning's demo Module: ``Transformer`` trained with ``nll_loss`` and SGD(lr=0.1) on WikiText2."""

    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs: Tensor, target: Tensor) -> Tensor:
        return self.model(inputs, target)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, target = batch
        return F.nll_loss(self(inputs, target), target.view(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(WikiText2())
