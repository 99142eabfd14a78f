"""A classifier over a swappable backbone, trained from the command line in the style of Lightning's
LightningCLI examples: the model class chosen with ``--model`` (``subclass_mode_model=True``), the data module's
sizes linked into the model's arguments, a ModelCheckpoint configured under ``--checkpoint``, and the optimizer
and scheduler picked on the command line (``--optimizer=SGD --lr_scheduler=StepLR``).

Ported from a Lightning program by its imports alone (tests/ported/test_ported_cli.py turns them back).

    python cli_classifier.py fit --model=LitClassifier --model.init_args.backbone.hidden_dim=32 \
        --optimizer=SGD --optimizer.lr=0.1
"""


import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from torchfleet import DataModule as LightningDataModule
from torchfleet import Module as LightningModule
from torchfleet.callbacks import ModelCheckpoint
from torchfleet.cli import LightningCLI


class Backbone(nn.Module):
    def __init__(self, in_features: int = 20, hidden_dim: int = 16, out_features: int = 4):
        super().__init__()
        self.l1 = nn.Linear(in_features, hidden_dim)
        self.l2 = nn.Linear(hidden_dim, out_features)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


class LitClassifier(LightningModule):
    def __init__(self, backbone: Backbone | None = None, num_classes: int = 4, in_features: int = 20,
                 learning_rate: float = 1e-3):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone if backbone is not None else Backbone(in_features, out_features=num_classes)

    def forward(self, x):
        return self.backbone(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=None):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)


class WideClassifier(LitClassifier):
    """The same task through a wider default backbone (picked with --model=WideClassifier)."""

    def __init__(self, num_classes: int = 4, in_features: int = 20, learning_rate: float = 1e-3, width: int = 48):
        super().__init__(Backbone(in_features, width, num_classes), num_classes, in_features, learning_rate)


class ClassificationData(LightningDataModule):
    def __init__(self, batch_size: int = 16, num_classes: int = 4, in_features: int = 20):
        super().__init__()
        self.save_hyperparameters()
        g = torch.Generator().manual_seed(3)
        x = torch.randn(192, in_features, generator=g)
        y = (x[:, :num_classes] + 0.3 * x[:, num_classes:2 * num_classes]).argmax(1)
        self.train_set, self.val_set = TensorDataset(x[:128], y[:128]), TensorDataset(x[128:], y[128:])
        self.num_classes, self.in_features = num_classes, in_features

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def predict_dataloader(self):
        return DataLoader(TensorDataset(self.val_set.tensors[0]), batch_size=self.hparams.batch_size)


class ClassifierCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        # the data decide the model's input and output sizes: one value, given once
        parser.link_arguments("data.num_classes", "model.init_args.num_classes")
        parser.link_arguments("data.in_features", "model.init_args.in_features")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val_loss", "checkpoint.save_last": True,
                             "checkpoint.filename": "best-{epoch}"})


def cli_main(**kwargs):
    return ClassifierCLI(LitClassifier, ClassificationData, subclass_mode_model=True, seed_everything_default=1234,
                         save_config_kwargs={"overwrite": True}, **kwargs)


if __name__ == "__main__":
    cli_main()
