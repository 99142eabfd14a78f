"""Lightning's demo models and datasets under its module names, with its APIs (no downloads: the data are
generated). ``from torchfleet.demos import BoringModel, Transformer, WikiText2, LightningTransformer``;
``torchfleet.demos.boring_classes`` (RandomDataset, ManualOptimBoringModel, ...), ``.transformer``, ``.lstm`` and
``.mnist_datamodule`` as in ``lightning.pytorch.demos``.
"""

from torchfleet.demos.boring_classes import (
    BoringDataModule,
    BoringModel,
    DemoModel,
    ManualOptimBoringModel,
    RandomDataset,
    RandomIterableDataset,
)
from torchfleet.demos.lstm import LightningLSTM, SequenceSampler, SimpleLSTM
from torchfleet.demos.mnist_datamodule import MNIST, MNISTClassifier, MNISTDataModule, SyntheticMNIST
from torchfleet.demos.transformer import LightningTransformer, Transformer, WikiText2

__all__ = ["LightningLSTM", "SequenceSampler", "SimpleLSTM", "LightningTransformer", "Transformer", "WikiText2",
           "BoringModel", "BoringDataModule", "DemoModel", "ManualOptimBoringModel", "RandomDataset",
           "RandomIterableDataset", "MNIST", "MNISTDataModule", "SyntheticMNIST", "MNISTClassifier"]
