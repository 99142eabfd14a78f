"""Lightning's combined strategy names (launch x find_unused_parameters) work under torchfleet.

A ported program passes ``strategy="ddp_spawn_find_unused_parameters_false"`` and the like; each name must
build the DDPStrategy Lightning's registry builds, and the option must reach the DistributedDataParallel
wrapper in real processes: the ``_true`` names let a model with a parameter its loss never uses train, the
``_false`` names keep the search off even under manual optimisation (where torchfleet, as Lightning, would
otherwise turn it on).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet as tf
from torchfleet.launchers.base import ProcessFailedError
from torchfleet.strategies import DDPStrategy, StrategyRegistry

#: Lightning 2.6.6's registry, written down from `lightning.pytorch.strategies.StrategyRegistry`
LIGHTNING_DDP_NAMES = {
    "ddp": ("popen", None),
    "ddp_find_unused_parameters_false": ("popen", False),
    "ddp_find_unused_parameters_true": ("popen", True),
    "ddp_spawn": ("spawn", None),
    "ddp_spawn_find_unused_parameters_false": ("spawn", False),
    "ddp_spawn_find_unused_parameters_true": ("spawn", True),
    "ddp_fork": ("fork", None),
    "ddp_fork_find_unused_parameters_false": ("fork", False),
    "ddp_fork_find_unused_parameters_true": ("fork", True),
    "ddp_notebook": ("fork", None),
    "ddp_notebook_find_unused_parameters_false": ("fork", False),
    "ddp_notebook_find_unused_parameters_true": ("fork", True),
}


@pytest.mark.parametrize("name", sorted(LIGHTNING_DDP_NAMES))
def test_every_lightning_ddp_name_builds_lightnings_strategy(name):
    start_method, unused = LIGHTNING_DDP_NAMES[name]
    trainer = tf.Trainer(strategy=name.upper() if "false" in name else name, accelerator="cpu", devices=2,
                         logger=False)
    strategy = trainer.strategy
    assert type(strategy) is DDPStrategy
    assert strategy.start_method == start_method
    assert strategy._ddp_kwargs == ({} if unused is None else {"find_unused_parameters": unused})
    params = {"start_method": start_method, **({} if unused is None else {"find_unused_parameters": unused})}
    assert StrategyRegistry[name]["init_params"] == params


def test_every_lightning_deepspeed_and_fsdp_name_is_registered():
    # Lightning 2.6.6's other names torchfleet honours on CPU (xla/tpu names are deliberately absent)
    for name in ("fsdp", "fsdp_cpu_offload", "deepspeed", "deepspeed_stage_1", "deepspeed_stage_2",
                 "deepspeed_stage_2_offload", "deepspeed_stage_3", "deepspeed_stage_3_offload",
                 "deepspeed_stage_3_offload_nvme", "single_device"):
        assert name in StrategyRegistry


class HalfUsed(tf.Module):
    """Its second layer's parameters get no gradient: DDP must search for them or fail on the next step."""

    def __init__(self, manual: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(4, 1)
        self.unused = nn.Linear(4, 1)
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.used(batch[0]), batch[1])
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(strategy: str, manual: bool) -> tuple[tf.Module, tf.Trainer]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    model = HalfUsed(manual)
    trainer = tf.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_steps=3, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=2))
    return model, trainer


@pytest.mark.distributed
@pytest.mark.forks
def test_find_unused_parameters_true_alias_trains_a_partly_used_model():
    before = HalfUsed(manual=False).used.weight.detach().clone()
    model, trainer = _fit("ddp_fork_find_unused_parameters_true", manual=False)
    assert trainer.global_step == 3
    assert not torch.equal(model.used.weight.detach(), before)


@pytest.mark.distributed
@pytest.mark.forks
def test_find_unused_parameters_false_alias_keeps_the_search_off_under_manual_optimisation():
    # plain ddp_notebook turns the search on for manual optimisation and trains ...
    _, trainer = _fit("ddp_notebook", manual=True)
    assert trainer.global_step == 3
    # ... the _false name keeps it off, as asked, and DDP reports the unused parameters on the next step
    with pytest.raises(ProcessFailedError, match="find_unused_parameters"):
        _fit("ddp_notebook_find_unused_parameters_false", manual=True)
