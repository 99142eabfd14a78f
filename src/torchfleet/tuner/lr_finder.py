"""The learning rate finder as Lightning's ``tuner.lr_finder`` names it (the search lives with its callback)."""

from __future__ import annotations

from torchfleet.trainer.callbacks.lr_finder import LRFinder, find_lr, lr_attribute

_LRFinder = LRFinder  # Lightning's name for the result

__all__ = ["LRFinder", "_LRFinder", "find_lr", "lr_attribute"]
