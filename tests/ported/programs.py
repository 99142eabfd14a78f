"""Programs written the way public Lightning programs are; only their import lines name torchfleet.

Each mirrors the features one kind of public program leans on (our own code, not a copy): a GAN
(manual optimisation, two optimizers, toggle_optimizer, two manual_backward calls in one step), an
autoencoder with a DataModule (positional datamodule, training_step without batch_idx, test after fit),
a transformer with a warm-up stepped in an ``optimizer_step`` override (the UvA tutorial's pattern), a
classifier in the lightning-hydra-template style (torchmetrics objects logged with self.log,
save_hyperparameters(logger=False), BatchNorm with sync_batchnorm), and two Fabric loops in the style of
Fabric's examples (an image classifier with rank_zero_first and loggers; a PPO agent whose loss goes
through ``get_action_and_value``, marked as a forward method). programs_extra.py holds three more.

The text below the imports is the Lightning program's: tests/ported/lightning_imports.py turns the import
lines back to run it under Lightning, and tests/ported/test_ported_programs.py compares the two. Every
program is seeded; these split their data across ranks in order with the same global batch at every world size.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from torchfleet import DataModule as LightningDataModule
from torchfleet import Fleet as Fabric
from torchfleet import Module as LightningModule
from torchfleet import Trainer, seed_everything

GLOBAL_BATCH = 16
N_SAMPLES = 64


def per_rank_batch(world_size: int) -> int:
    return GLOBAL_BATCH // world_size


def _data(n: int, d: int, seed: int, classes: int | None = None) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    if classes is None:
        return TensorDataset(x)
    y = (x[:, :classes] * torch.arange(1, classes + 1)).argmax(1)
    return TensorDataset(x, y)


# ---------------------------------------------------------------------------- GAN (manual optimisation)
class Generator(nn.Module):
    def __init__(self, latent: int = 6, out: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(latent, 16), nn.LeakyReLU(0.2), nn.Linear(16, out), nn.Tanh())

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, inp: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(inp, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)


class GAN(LightningModule):
    def __init__(self, latent: int = 6, lr: float = 2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent)
        self.discriminator = Discriminator()
        # noise from each sample itself: the same sample gets the same noise on any rank
        self.register_buffer("to_latent", torch.randn(8, latent, generator=torch.Generator().manual_seed(3)))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        (real,) = batch
        z = torch.sin(real @ self.to_latent)
        opt_g, opt_d = self.optimizers()

        self.toggle_optimizer(opt_g)
        fake = self(z)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(fake), torch.ones(len(real), 1))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.toggle_optimizer(opt_d)
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(real), torch.ones(len(real), 1))
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), torch.zeros(len(real), 1))
        d_loss = (real_loss + fake_loss) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        lr = self.hparams.lr
        return [torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(0.5, 0.999)),
                torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))], []


def gan_program(trainer_kw: dict[str, Any], world_size: int) -> dict[str, Any]:
    seed_everything(0)
    model = GAN()
    trainer = Trainer(max_epochs=2, **trainer_kw)
    trainer.fit(model, DataLoader(_data(N_SAMPLES, 8, 1), batch_size=per_rank_batch(world_size)))
    return {"model": model, "trainer": trainer, "metrics": ["g_loss", "d_loss"]}


# ---------------------------------------------------------------------------- autoencoder + DataModule
class PointsData(LightningDataModule):
    def __init__(self, batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage):
        self.train_set = _data(N_SAMPLES, 12, 2)
        self.val_set = _data(32, 12, 3)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


class AutoEncoder(LightningModule):
    def __init__(self, hidden: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, hidden))
        self.decoder = nn.Sequential(nn.Linear(hidden, 8), nn.ReLU(), nn.Linear(8, 12))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch):  # no batch_idx, as many public examples write it
        (x,) = batch
        loss = F.mse_loss(self(x), x)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_loss", F.mse_loss(self(x), x), sync_dist=True)

    def test_step(self, batch, batch_idx):
        (x,) = batch
        self.log("test_loss", F.mse_loss(self(x), x), sync_dist=True)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5),
                                                   "interval": "epoch"}}


def autoencoder_program(trainer_kw: dict[str, Any], world_size: int) -> dict[str, Any]:
    seed_everything(0)
    model = AutoEncoder()
    data = PointsData(batch_size=per_rank_batch(world_size))
    trainer = Trainer(max_epochs=2, **trainer_kw)
    trainer.fit(model, data)  # the DataModule positional
    val_loss = float(trainer.callback_metrics["val_loss"])  # each stage starts with empty callback_metrics
    tested = trainer.test(model, datamodule=data, verbose=False)  # the same module after fit
    return {"model": model, "trainer": trainer, "metrics": [], "val_loss": val_loss,
            "test_loss": tested[0]["test_loss"],
            "datamodule_hparams": dict(data.hparams)}


# ---------------------------------------------------------------------------- transformer with warm-up
class CosineWarmup(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer, warmup: int, max_iters: int):
        self.warmup, self.max_iters = warmup, max_iters
        super().__init__(optimizer)

    def get_lr(self):
        factor = 0.5 * (1 + math.cos(math.pi * self.last_epoch / self.max_iters))
        if self.last_epoch <= self.warmup:
            factor *= self.last_epoch / self.warmup
        return [base * factor for base in self.base_lrs]


class ReverseTransformer(LightningModule):
    """Reverses a sequence of tokens; the learning rate warms up in optimizer_step (not a scheduler config)."""

    def __init__(self, vocab: int = 10, dim: int = 16, warmup: int = 3, max_iters: int = 40):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        loss = F.cross_entropy(self(tokens).flatten(0, 1), target.flatten())
        self.log("train_loss", loss, sync_dist=True)  # the mean over ranks: the global batch's loss
        return loss

    def configure_optimizers(self):
        # SGD, not the tutorial's Adam: attention's key bias gets a gradient of rounding noise only (softmax
        # ignores it), which Adam would scale up to full steps that differ between one process and two
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        self.lr_scheduler = CosineWarmup(opt, self.hparams.warmup, self.hparams.max_iters)
        return opt

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        self.lr_scheduler.step()  # every step, after the update


def reverse_data(n: int = N_SAMPLES, length: int = 6, vocab: int = 10) -> TensorDataset:
    tokens = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(4))
    return TensorDataset(tokens, tokens.flip(1))


def transformer_program(trainer_kw: dict[str, Any], world_size: int) -> dict[str, Any]:
    seed_everything(0)
    model = ReverseTransformer()
    trainer = Trainer(max_epochs=2, **trainer_kw)
    trainer.fit(model, DataLoader(reverse_data(), batch_size=per_rank_batch(world_size)))
    return {"model": model, "trainer": trainer, "metrics": ["train_loss"],
            "lr": model.lr_scheduler.get_last_lr()[0], "scheduler_steps": model.lr_scheduler.last_epoch}


# ---------------------------------------------------------------------------- hydra-template style classifier
class DenseNet(nn.Module):
    def __init__(self, inp: int = 10, hidden: int = 16, classes: int = 3):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(inp, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.model(x)


class Classifier(LightningModule):
    def __init__(self, net: nn.Module, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net
        from torchmetrics import MaxMetric, MeanMetric
        from torchmetrics.classification import Accuracy

        self.train_acc = Accuracy(task="multiclass", num_classes=3)
        self.val_acc = Accuracy(task="multiclass", num_classes=3)
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x):
        return self.net(x)

    def model_step(self, batch):
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y), logits.argmax(1), y

    def training_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True)

    def on_validation_epoch_end(self):
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def classifier_program(trainer_kw: dict[str, Any], world_size: int) -> dict[str, Any]:
    seed_everything(0)
    model = Classifier(DenseNet())
    trainer = Trainer(max_epochs=2, sync_batchnorm=True, **trainer_kw)
    bs = per_rank_batch(world_size)
    trainer.fit(model, DataLoader(_data(N_SAMPLES, 10, 5, classes=3), batch_size=bs),
                DataLoader(_data(32, 10, 6, classes=3), batch_size=bs))
    return {"model": model, "trainer": trainer, "metrics": ["train/loss", "train/acc", "val/loss", "val/acc",
                                                            "val/acc_best"],
            "hparams": dict(model.hparams)}


TRAINER_PROGRAMS = {
    "gan": gan_program,
    "autoencoder": autoencoder_program,
    "transformer": transformer_program,
    "classifier": classifier_program,
}


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights on every rank (sharded ones gathered: every rank must call this)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
            for k, v in model.state_dict().items()}


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """What a run is compared on: full weights (gathered), the named metrics, the extra values."""
    model, trainer = result.pop("model"), result.pop("trainer")
    names = result.pop("metrics")
    metrics = trainer.callback_metrics
    out = {"weights": full_weights(model),
           "metrics": {n: float(metrics[n]) for n in names}, "global_step": trainer.global_step}
    out.update(result)
    return out


# ---------------------------------------------------------------------------- Fleet loops (Fabric style)
class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def image_classifier_fleet(fabric: Fabric, root: str) -> dict[str, Any]:
    """Fabric's image-classifier shape: data made under rank_zero_first, test accuracy all-reduced, logs, a save."""
    fabric.seed_everything(0)
    data_file = os.path.join(root, "images.pt")
    with fabric.rank_zero_first():
        if not os.path.exists(data_file):  # the "download": only rank 0 writes it, the others read it after
            g = torch.Generator().manual_seed(7)
            images = torch.randn(N_SAMPLES, 1, 8, 8, generator=g)
            torch.save({"x": images, "y": (images.mean((1, 2, 3)) > 0).long() + (images[:, 0, 0, 0] > 1).long()},
                       data_file)
        data = torch.load(data_file)
    dataset = TensorDataset(data["x"], data["y"])
    model = SmallConvNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=0.5)
    model, optimizer = fabric.setup(model, optimizer)
    train_loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=per_rank_batch(fabric.world_size)))
    for epoch in range(2):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            fabric.backward(loss)
            optimizer.step()
        fabric.log("train_loss", loss.detach(), step=epoch)
    model.eval()
    correct = torch.tensor(0)
    with torch.no_grad():
        for x, y in train_loader:
            correct += (model(x).argmax(1) == y).sum()
    correct = fabric.all_reduce(correct, reduce_op="sum")
    fabric.save(os.path.join(root, "classifier.ckpt"), {"model": model})
    return {"weights": full_weights(model), "accuracy": float(correct) / len(dataset)}


class Agent(nn.Module):
    """An actor-critic whose loss is computed through get_action_and_value, not forward."""

    def __init__(self, obs: int = 4, actions: int = 2):
        super().__init__()
        self.critic = nn.Sequential(nn.Linear(obs, 16), nn.Tanh(), nn.Linear(16, 1))
        self.actor = nn.Sequential(nn.Linear(obs, 16), nn.Tanh(), nn.Linear(16, actions))

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        dist = torch.distributions.Categorical(logits=logits)
        if action is None:
            action = logits.argmax(1)
        return action, dist.log_prob(action), dist.entropy(), self.critic(x)

    def forward(self, x):
        return self.get_action_and_value(x)


def ppo_fleet(fabric: Fabric, root: str) -> dict[str, Any]:
    """Fabric PPO's update shape: a clipped surrogate loss through a method that is not forward."""
    fabric.seed_everything(0)
    g = torch.Generator().manual_seed(8)
    obs = torch.randn(N_SAMPLES, 4, generator=g)
    actions = torch.randint(0, 2, (N_SAMPLES,), generator=g)
    old_logprob = torch.full((N_SAMPLES,), math.log(0.5))
    advantages = torch.randn(N_SAMPLES, generator=g)
    returns = torch.randn(N_SAMPLES, generator=g)
    agent = Agent()
    optimizer = torch.optim.Adam(agent.parameters(), lr=1e-2)
    agent, optimizer = fabric.setup(agent, optimizer)
    agent.mark_forward_method("get_action_and_value")
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(obs, actions, old_logprob, advantages, returns),
                                                batch_size=per_rank_batch(fabric.world_size)))
    for _ in range(2):
        for b_obs, b_act, b_old, b_adv, b_ret in loader:
            _, logprob, entropy, value = agent.get_action_and_value(b_obs, b_act)
            ratio = (logprob - b_old).exp()
            pg_loss = torch.max(-b_adv * ratio, -b_adv * ratio.clamp(0.8, 1.2)).mean()
            loss = pg_loss + 0.5 * F.mse_loss(value.squeeze(1), b_ret) - 0.01 * entropy.mean()
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
    return {"weights": full_weights(agent)}


FLEET_PROGRAMS = {"image_classifier": image_classifier_fleet, "ppo": ppo_fleet}
