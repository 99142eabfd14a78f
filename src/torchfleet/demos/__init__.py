"""Small models and datasets for examples, tests and bug reports (no downloads): Lightning's demo names.

``from torchfleet.demos import BoringModel, RandomDataset, MNISTDataModule, Transformer, WikiText2``.
"""

from torchfleet.demos.boring import (
    BoringDataModule,
    BoringModel,
    ManualOptimBoringModel,
    RandomDataset,
    RandomIterableDataset,
)
from torchfleet.demos.mnist import MNISTClassifier, MNISTDataModule, SyntheticMNIST
from torchfleet.demos.transformer import LanguageModel, SyntheticText, Transformer, WikiText2

__all__ = ["BoringModel", "ManualOptimBoringModel", "BoringDataModule", "RandomDataset", "RandomIterableDataset",
           "SyntheticMNIST", "MNISTDataModule", "MNISTClassifier", "SyntheticText", "WikiText2", "Transformer",
           "LanguageModel"]
