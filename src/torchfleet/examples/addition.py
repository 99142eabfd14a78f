"""A small transformer that learns multi-digit addition from examples generated in code.

Each example is ``a + b = c`` written as digit tokens: ``a`` and ``b`` zero-padded to ``digits``
digits, then the sum with its digits reversed (least significant first), which is the order in
which a carry is computed. The model is a decoder-only (causal) transformer built from
``nn.TransformerEncoderLayer``; it is trained only on the answer tokens.

    torchfleet fit                         # trains this with the defaults below (about 40 s on 2 CPU cores)
    torchfleet fit --model.digits=4 --data.digits=4 --trainer.max_epochs=5

The model and the data each take ``digits``; give both the same value (the model checks).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from torchfleet import DataModule, Module
from torchfleet.errors import ConfigurationError, check_int

log = logging.getLogger("torchfleet")

PLUS, EQUALS = 10, 11
VOCAB = 12  # digits 0-9, '+', '='


def _check_digits(digits: int) -> int:
    # 9 is where a question (a and b, 18 digits) still fits in an int64 key
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 9:
        raise ConfigurationError(f"digits={digits!r} is not valid: give an int from 1 to 9 (3 trains in about 40 s).")
    return digits


def sequence_length(digits: int) -> int:
    """Tokens in one example: a, '+', b, '=', and the (digits + 1)-digit sum."""
    return 2 * digits + 2 + digits + 1


def _digits(x: Tensor, count: int, reverse: bool = False) -> Tensor:
    d = torch.stack([(x // 10**i) % 10 for i in range(count)], dim=1)  # least significant first
    return d if reverse else d.flip(1)


def make_examples(n: int, digits: int, seed: int) -> Tensor:
    """``n`` random additions as a LongTensor of shape (n, sequence_length(digits))."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 10**digits, (n,), generator=g)
    b = torch.randint(0, 10**digits, (n,), generator=g)
    return torch.cat(
        [_digits(a, digits), torch.full((n, 1), PLUS), _digits(b, digits), torch.full((n, 1), EQUALS),
         _digits(a + b, digits + 1, reverse=True)],
        dim=1,
    )


def _question_key(tokens: Tensor, digits: int) -> Tensor:
    # the digits of a then b read as one integer: exact in int64 for up to 9 digits
    q = torch.cat([tokens[:, :digits], tokens[:, digits + 1 : 2 * digits + 1]], dim=1)
    weights = 10 ** torch.arange(q.shape[1] - 1, -1, -1, dtype=torch.int64)
    return (q * weights).sum(dim=1)


def decode(tokens: Tensor, digits: int) -> str:
    """One example back to text, e.g. "123+456=579"."""
    t = tokens.tolist()
    a = "".join(map(str, t[:digits]))
    b = "".join(map(str, t[digits + 1 : 2 * digits + 1]))
    c = "".join(map(str, reversed(t[2 * digits + 2 :]))).lstrip("0") or "0"
    return f"{a}+{b}={c}"


class AdditionData(DataModule):
    """Train and validation additions; the two sets share no (a, b) pair.

    Args:
        digits: digits of each number added (1-9); give the model the same value.
        num_train: training examples.
        num_val: validation examples (questions never seen in training).
        batch_size: training batch size (validation uses batches of 1000).
        seed: seed of the generated examples.
        num_workers: DataLoader worker processes.
    """

    def __init__(self, digits: int = 3, num_train: int = 128_000, num_val: int = 2_000, batch_size: int = 128,
                 seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        _check_digits(digits)
        for name, value, minimum in (("num_train", num_train, 1), ("num_val", num_val, 1),
                                     ("batch_size", batch_size, 1), ("seed", seed, 0), ("num_workers", num_workers, 0)):
            check_int(name, value, minimum, owner="AdditionData")
        self.digits, self.num_train, self.num_val = digits, num_train, num_val
        self.batch_size, self.seed, self.num_workers = batch_size, seed, num_workers

    def setup(self, stage: str) -> None:
        val = make_examples(self.num_val, self.digits, self.seed + 1)
        train = make_examples(self.num_train + self.num_val, self.digits, self.seed)
        # drop training examples whose question also appears in validation
        keep = ~torch.isin(_question_key(train, self.digits), _question_key(val, self.digits))
        if not keep.any():
            raise ConfigurationError(
                f"AdditionData(digits={self.digits}, num_val={self.num_val}) leaves no training example: the "
                f"validation set holds every one of the {10 ** (2 * self.digits)} questions. Use more digits or a smaller num_val."
            )
        self.train_set = TensorDataset(train[keep][: self.num_train])
        self.val_set = TensorDataset(val)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=1000, num_workers=self.num_workers)


class AdditionTransformer(Module):
    """A causal transformer over digit tokens that predicts the digits of the sum.

    Args:
        digits: digits of each number added (1-9); give the data the same value.
        d_model: width of the token embeddings and of each layer.
        nhead: attention heads per layer (must divide d_model).
        num_layers: transformer layers.
        dim_feedforward: hidden width of each layer's feed-forward block.
        lr: peak learning rate of the one-cycle schedule (AdamW).
        weight_decay: AdamW's weight decay.
        warmup_fraction: share of the steps spent warming the learning rate up.
    """

    def __init__(self, digits: int = 3, d_model: int = 64, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 256, lr: float = 3e-3, weight_decay: float = 0.01,
                 warmup_fraction: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.digits = _check_digits(digits)
        for name, value in (("d_model", d_model), ("nhead", nhead), ("num_layers", num_layers),
                            ("dim_feedforward", dim_feedforward)):
            check_int(name, value, 1, owner="AdditionTransformer")
        if d_model % nhead:
            raise ConfigurationError(f"AdditionTransformer(d_model={d_model}, nhead={nhead}) is not valid: each attention "
                                     "head takes an equal share of d_model, so nhead must divide d_model (e.g. "
                                     f"nhead={max(h for h in range(1, nhead + 1) if d_model % h == 0)}).")
        self.length = sequence_length(digits)
        self.answer_start = 2 * digits + 2
        self.embed = nn.Embedding(VOCAB, d_model)
        self.position = nn.Parameter(torch.randn(self.length, d_model) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)
        self.register_buffer("causal_mask", nn.Transformer.generate_square_subsequent_mask(self.length), persistent=False)

    def forward(self, tokens: Tensor) -> Tensor:
        """Next-token logits for every position of ``tokens`` (batch, time)."""
        t = tokens.shape[1]
        h = self.embed(tokens) + self.position[:t]
        mask = self.causal_mask[:t, :t]
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))

    def _answer_logits(self, tokens: Tensor) -> Tensor:
        if tokens.shape[1] != self.length:
            # without this, data of another digit count would train silently on misaligned answers
            raise ConfigurationError(
                f"AdditionTransformer(digits={self.digits}) expects examples of {self.length} tokens, but the batch "
                f"has {tokens.shape[1]}: the data were made for another number of digits. Give the model and "
                "the data the same value (on the command line: --model.digits=N --data.digits=N)."
            )
        # position i predicts token i + 1: the answer's predictions start one before it
        return self(tokens[:, :-1])[:, self.answer_start - 1 :]

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        (tokens,) = batch
        logits = self._answer_logits(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, self.answer_start :].reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (tokens,) = batch
        logits = self._answer_logits(tokens)
        target = tokens[:, self.answer_start :]
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
        # Greedy decoding is exact iff every teacher-forced argmax is right: until its first wrong
        # digit a greedy decode sees the true prefix. So one forward pass gives exact-match accuracy.
        exact = (logits.argmax(-1) == target).all(dim=1).float().mean()
        self.log("val_loss", loss, prog_bar=True, sync_dist=True)
        self.log("val_acc", exact, prog_bar=True, sync_dist=True)

    @torch.no_grad()
    def generate(self, questions: Tensor) -> Tensor:
        """Greedy-decode the answers to ``questions`` (the first 2*digits+2 tokens of examples)."""
        tokens = questions
        for _ in range(self.digits + 1):
            nxt = self(tokens)[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens

    def _one_cycle(self, opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.OneCycleLR:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=max(1, steps),
                                                   pct_start=self.hparams.warmup_fraction)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        total = self.trainer.estimated_stepping_batches
        if math.isinf(total):
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self._one_cycle(opt, int(total)), "interval": "step"}}

    def on_train_start(self) -> None:
        # A resumed run gets the schedule of the run it resumes, planned for that run's steps. When this fit
        # runs longer (a larger max_epochs), OneCycleLR would fail past its last step ("Tried to step N times"):
        # start a new cycle over the steps still to run (a warm restart from the trained weights).
        trainer = self.trainer
        total = trainer.estimated_stepping_batches
        configs = trainer.lr_scheduler_configs
        if math.isinf(total) or not configs or not isinstance(configs[0].scheduler, torch.optim.lr_scheduler.OneCycleLR):
            return
        sched = configs[0].scheduler
        remaining = int(total) - trainer.global_step
        if sched.last_epoch + remaining <= sched.total_steps:
            return
        configs[0].scheduler = self._one_cycle(sched.optimizer, remaining)
        log.info("The resumed OneCycleLR schedule ends at step %d, but this fit runs to step %d: a new one-cycle "
                 "schedule covers the remaining %d steps.", trainer.global_step + sched.total_steps - sched.last_epoch,
                 int(total), remaining)


def default_trainer_kwargs() -> dict[str, Any]:
    """Trainer settings the example is tuned for: 3000 steps, 40-55 s on a 2-core CPU, 100% exact match."""
    return {"max_epochs": 3, "log_every_n_steps": 20}
