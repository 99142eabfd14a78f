"""A hand-written Fleet loop that saves mid-run, then resumes in a fresh model: shared by the sharded scripts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


def train_save_resume(fleet: Any, setup: Callable[[], tuple[Any, Any]], loader: Any, epochs: int, save_at: int,
                      ckpt: str, weights: Callable[[Any], dict]) -> dict:
    """Train ``epochs`` saving after step ``save_at``; then ``setup()`` anew, ``fleet.load`` and finish.

    ``setup()`` returns ``fleet.setup(model, optimizer)``; ``weights(model)`` the full weights. Returns
    the uninterrupted run's weights, the resumed run's, what ``load`` gave back and the resumed model.
    """

    def train(model, opt, start: int, save: bool) -> None:
        step = 0
        for epoch in range(epochs):
            loader.set_epoch(epoch)  # the epoch to read (a plain pass counts on from the last)
            for x, y in loader:
                step += 1
                if step <= start:
                    continue
                opt.zero_grad()
                fleet.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                if save and step == save_at:
                    fleet.save(ckpt, {"model": model, "optimizer": opt, "step": step})

    model, opt = setup()
    train(model, opt, 0, save=True)
    straight = weights(model)
    model, opt = setup()
    extra = fleet.load(ckpt, {"model": model, "optimizer": opt})
    train(model, opt, extra["step"], save=False)
    return {"weights": straight, "resumed_weights": weights(model), "extra": extra, "model": model}
