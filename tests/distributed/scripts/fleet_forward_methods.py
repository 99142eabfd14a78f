"""Fleet under ddp or fsdp with the loss computed by a method other than forward; rank 0 writes what the tests check.

Usage: python fleet_forward_methods.py STRATEGY OUT

The model trains through ``model.loss_step(x, y)`` marked with ``mark_forward_method``, then through
``training_step`` (routed by default). Then the
calls that must be refused (an unmarked method, a submodule called directly) and the ones that must
keep working (forward, attributes, a helper that runs no layer, a submodule without gradients under
ddp) are tried, and every outcome is recorded. A control model trained through ``model.module``
(bypassing the strategy) shows that the ranks' weights do differ when nothing synchronises them.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.distributed.scripts.ddp_train import make_data
from tests.distributed.scripts.fleet_train import EPOCHS, plain_net


class TwoWays(nn.Module):
    """``forward`` gives predictions; the loss comes from ``loss_step`` (marked) or ``unmarked_loss``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = plain_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.loss_step(*batch)  # a step method: routed without being marked, as under Fabric

    def unmarked_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x), y)

    def scale(self) -> float:
        return 2.0  # runs no layer: allowed unmarked


def outcome(fn) -> str | None:
    """None when ``fn()`` ran, else the error's type and message."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test reads which error it was
        return f"{type(exc).__name__}: {exc}"
    return None


def without_grad(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return layer(x)


def full(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).clone()


def main(strategy: str, out: str) -> None:
    import torchfleet as tf

    torch.set_num_threads(1)
    fleet = tf.Fleet(strategy=strategy, accelerator="cpu", devices=2)
    fleet.launch()
    model = TwoWays()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = fleet.setup(model, opt)
    model.mark_forward_method("loss_step")
    loader = fleet.setup_dataloaders(DataLoader(make_data(), batch_size=8))
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            # epoch 0 through the marked method, epoch 1 through training_step (marked by default)
            loss = model.loss_step(x, y) if epoch == 0 else model.training_step((x, y), 0)
            fleet.backward(loss)
            opt.step()
    weights = {k: full(v) for k, v in model.state_dict().items()}
    flat = torch.cat([w.flatten() for w in weights.values()])
    x, y = next(iter(loader))
    result = {
        "weights": weights,
        "per_rank": [t.tolist() for t in fleet.all_gather(flat)],
        "unmarked": outcome(lambda: model.unmarked_loss(x, y)),
        "submodule": outcome(lambda: model.net(x)),
        "submodule_no_grad": outcome(lambda: without_grad(model.net, x)),
        "forward_after": outcome(lambda: model(x).sum().backward()),
        "helper": model.scale(),
        "attribute": list(model.net[0].weight.shape),
        "parameters": len(list(model.parameters())),
    }
    if strategy == "ddp":
        # the control: the same loop bypassing DDP through .module leaves each rank with its own weights
        control = TwoWays()
        copt = torch.optim.SGD(control.parameters(), lr=0.05)
        control, copt = fleet.setup(control, copt)
        x, y = next(iter(loader))
        copt.zero_grad()
        fleet.backward(control.module.loss_step(x, y), model=control)
        copt.step()
        cflat = torch.cat([p.detach().flatten() for p in control.parameters()])
        result["control_per_rank"] = [t.tolist() for t in fleet.all_gather(cflat)]
    fleet.barrier()
    if fleet.is_global_zero:
        torch.save(result, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
