"""A small causal Transformer language model and a generated text corpus (no download).

``WikiText2`` has the interface of Lightning's demo dataset (``block_size``, ``vocab_size``, items
``(input, target)`` shifted by one token) over a synthetic corpus: sentences from a tiny grammar, so
there is structure to learn and the loss falls well below ``log(vocab_size)``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from torchfleet.module import Module

_SUBJECTS = ["the cat", "a dog", "the model", "my friend", "the old ship", "a small bird"]
_VERBS = ["sees", "likes", "follows", "trains", "finds", "carries"]
_OBJECTS = ["the ball", "a tree", "the data", "some bread", "the river", "a red box"]


class SyntheticText(Dataset):
    """``num_sentences`` generated sentences as one token stream, cut into ``block_size`` windows.

    Items are ``(tokens[i:i+block_size], tokens[i+1:i+block_size+1])``; ``vocabulary`` maps words to ids.
    """

    def __init__(self, block_size: int = 32, num_sentences: int = 2000, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        words: list[str] = []
        for _ in range(num_sentences):
            parts = [_SUBJECTS[int(torch.randint(len(_SUBJECTS), (1,), generator=g))],
                     _VERBS[int(torch.randint(len(_VERBS), (1,), generator=g))],
                     _OBJECTS[int(torch.randint(len(_OBJECTS), (1,), generator=g))]]
            words += " ".join(parts).split() + ["<eos>"]
        self.vocabulary = {w: i for i, w in enumerate(sorted(set(words)))}
        self.data = torch.tensor([self.vocabulary[w] for w in words])
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = self.data[start:start + self.block_size + 1]
        return chunk[:-1], chunk[1:]


class WikiText2(SyntheticText):
    """Lightning's demo name and arguments (``data_dir``, ``block_size``, ``download``) over the generated corpus:
    nothing is downloaded and ``data_dir`` is not read."""

    def __init__(self, data_dir: str | os.PathLike = "data", block_size: int = 35, download: bool = True) -> None:
        super().__init__(block_size=block_size)


class _PositionalEncoding(nn.Module):
    def __init__(self, dim: int, max_len: int = 512) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        freq = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        table = torch.zeros(max_len, dim)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq[: dim // 2])
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.size(1)]


class Transformer(nn.Module):
    """A decoder-only Transformer: token embedding, sine positions, ``nlayers`` causal self-attention layers.

    ``forward(tokens [batch, seq])`` returns logits ``[batch, seq, vocab_size]``.
    """

    def __init__(self, vocab_size: int = 33278, ninp: int = 64, nhead: int = 2, nhid: int = 128, nlayers: int = 2,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.pos = _PositionalEncoding(ninp)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.size(1)
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        hidden = self.encoder(self.pos(self.embedding(tokens) * math.sqrt(self.ninp)), mask=mask, is_causal=True)
        return self.decoder(hidden)


class LanguageModel(Module):
    """Next-token prediction with ``Transformer`` (cross-entropy over the vocabulary), Adam."""

    def __init__(self, vocab_size: int = 33278, lr: float = 1e-3, **transformer_kwargs: Any) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = Transformer(vocab_size=vocab_size, **transformer_kwargs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)

    def loss(self, batch: Any) -> torch.Tensor:
        tokens, target = batch
        logits = self(tokens)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
