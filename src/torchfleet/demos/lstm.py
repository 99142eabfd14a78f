"""Lightning's demo LSTM language model (``SimpleLSTM``, ``LightningLSTM``) and its ``SequenceSampler``, with
Lightning's API and computation, trained on the generated ``WikiText2``."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Sampler

from torchfleet.demos.transformer import WikiText2
from torchfleet.module import Module


class SimpleLSTM(nn.Module):
    """Embedding, ``nlayers`` LSTM layers and a linear decoder; ``forward(input, hidden)`` returns
    ``(log-probabilities [batch * seq, vocab_size], hidden)``."""

    def __init__(self, vocab_size: int = 33278, ninp: int = 512, nhid: int = 512, nlayers: int = 4,
                 dropout: float = 0.2) -> None:
        super().__init__()
        # created and initialised in Lightning's order, so that a seed gives the same weights
        self.vocab_size = vocab_size
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, vocab_size)
        self.nlayers, self.nhid = nlayers, nhid
        self.init_weights()

    def init_weights(self) -> None:
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input: Tensor, hidden: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.vocab_size)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, batch_size: int) -> tuple[Tensor, Tensor]:
        """Zero hidden and cell states for ``batch_size`` sequences."""
        weight = next(self.parameters())
        shape = (self.nlayers, batch_size, self.nhid)
        return weight.new_zeros(shape), weight.new_zeros(shape)


class SequenceSampler(Sampler[list[int]]):
    """Batches of ``batch_size`` items, each continuing its row of the previous batch (for a carried hidden state):
    the dataset is cut into ``batch_size`` contiguous chunks read in parallel."""

    def __init__(self, dataset: Sized, batch_size: int) -> None:
        super().__init__()
        self.dataset, self.batch_size = dataset, batch_size
        self.chunk_size = len(dataset) // batch_size

    def __iter__(self) -> Iterator[list[int]]:
        usable = len(self.dataset) - len(self.dataset) % self.batch_size
        for i in range(self.chunk_size):
            yield list(range(i, usable, self.chunk_size))

    def __len__(self) -> int:
        return self.chunk_size


class LightningLSTM(Module):
    """Lightning's demo Module: SimpleLSTM with its hidden state carried across batches (reset each epoch)."""

    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = SimpleLSTM(vocab_size=vocab_size)
        self.hidden: tuple[Tensor, Tensor] | None = None

    def on_train_epoch_end(self) -> None:
        self.hidden = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        input, target = batch
        if self.hidden is None:
            self.hidden = self.model.init_hidden(input.size(0))
        self.hidden = (self.hidden[0].detach(), self.hidden[1].detach())
        output, self.hidden = self.model(input, self.hidden)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader:
        dataset = WikiText2()
        return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))

    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD(self.parameters(), lr=20.0)
