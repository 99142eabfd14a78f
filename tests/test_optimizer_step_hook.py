"""An overridden ``Module.optimizer_step`` (Lightning's hook) takes the optimizer step over in automatic optimisation.

The reference for each run is a hand-written torch loop with the same data, warm-up and clipping.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchfleet as tf
from tests.helpers import loader, quiet
from torchfleet.errors import MisconfiguredModuleError

WARMUP = 4
BASE_LR = 0.1
CLIP = 0.5


def warmup(step: int) -> float:
    # 0 at the first step: a model whose schedule is never stepped does not train at all
    return min(1.0, step / WARMUP)


class WarmupModel(tf.Module):
    """As the UvA-DL transformer tutorial: a scheduler kept on the model, stepped in optimizer_step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        self.calls: list[tuple] = []
        self.closure_losses: list[float] = []
        self.step_losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.step_losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=BASE_LR, momentum=0.9)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
        return opt

    def optimizer_step(self, *args, **kwargs):
        epoch, batch_idx, optimizer, closure = args
        self.calls.append((epoch, batch_idx, isinstance(optimizer, torch.optim.SGD), self.trainer.global_step))

        def recording_closure():
            loss = closure()
            self.closure_losses.append(float(loss))
            return loss

        super().optimizer_step(epoch, batch_idx, optimizer, recording_closure)
        self.lr_scheduler.step()


def raw_loop(epochs: int, accumulate: int = 1) -> tuple[dict, int]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(net.parameters(), lr=BASE_LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    steps = 0
    for _ in range(epochs):
        batches = list(loader())
        for i, (x, y) in enumerate(batches):
            loss = nn.functional.mse_loss(net(x), y) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0 or i + 1 == len(batches):
                torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
                opt.step()
                opt.zero_grad()
                sched.step()
                steps += 1
    return {f"net.{k}": v for k, v in net.state_dict().items()}, steps


@pytest.mark.parametrize("accumulate", [1, 3])
def test_optimizer_step_override_runs_the_warmup_like_a_raw_loop(accumulate):
    model = WarmupModel()
    trainer = tf.Trainer(**quiet(max_epochs=2, gradient_clip_val=CLIP, accumulate_grad_batches=accumulate))
    trainer.fit(model, loader())
    want, steps = raw_loop(2, accumulate)
    for k, v in want.items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=1e-6)
    assert trainer.global_step == steps
    # one call per optimizer step, at the last batch of each accumulation window, with a handle that is an SGD
    per_epoch = [i for i in range(8) if (i + 1) % accumulate == 0 or i == 7]
    assert [c[:2] for c in model.calls] == [(e, i) for e in range(2) for i in per_epoch]
    assert all(c[2] for c in model.calls)
    assert [c[3] for c in model.calls] == list(range(steps))  # global_step counts the steps taken before it
    # the closure returns the loss training_step computed for that batch (no second forward)
    window_last = [model.step_losses[e * 8 + i] for e in range(2) for i in per_epoch]
    assert model.closure_losses == pytest.approx(window_last)
    assert len(model.step_losses) == 16


def test_optimizer_step_override_that_never_steps_is_an_error():
    class Skipper(WarmupModel):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            self.calls.append(batch_idx)  # forgot optimizer.step(closure=optimizer_closure)

    model = Skipper()
    trainer = tf.Trainer(**quiet(max_epochs=1))
    with pytest.raises(MisconfiguredModuleError, match=r"without running optimizer_closure.*optimizer\.step\(closure="):
        trainer.fit(model, loader())
    assert model.calls == [0]


def test_optimizer_step_override_without_the_closure_is_an_error():
    # Lightning refuses it too: stepping without the closure is how a skipped training step looks there
    class NoClosure(WarmupModel):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            optimizer.step()

    with pytest.raises(MisconfiguredModuleError, match="without running optimizer_closure"):
        tf.Trainer(**quiet(max_epochs=1)).fit(NoClosure(), loader())


def test_optimizer_step_override_with_lbfgs_recomputes_through_the_closure():
    class LBFGSModel(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(8, 1)
            self.hook_calls = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            self.hook_calls += 1
            assert isinstance(optimizer, torch.optim.LBFGS)
            optimizer.step(closure=optimizer_closure)

    model = LBFGSModel()
    tf.Trainer(**quiet(max_epochs=1)).fit(model, loader())
    torch.manual_seed(0)
    net = nn.Linear(8, 1)
    opt = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=4)
    for x, y in loader():
        def closure(x=x, y=y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    assert model.hook_calls == 8
    for k, v in net.state_dict().items():
        torch.testing.assert_close(model.state_dict()[f"net.{k}"], v, rtol=0, atol=1e-6)


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_the_handle_steps_through_the_precision_like_the_trainers_own_step(precision):
    """Through the hook, gradient scaling (16-mixed), clipping and accumulation are those of the plain step."""
    from torchfleet.precision import _fp16_on_cpu_works

    if precision == "16-mixed" and not _fp16_on_cpu_works("mixed"):
        pytest.skip("this torch build has no float16 autocast on the CPU")

    class Plain(WarmupModel):
        optimizer_step = tf.Module.optimizer_step  # not overridden: the Trainer's own step

    class Calls(WarmupModel):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            self.calls.append(batch_idx)
            optimizer.step(closure=optimizer_closure)
            self.lr_scheduler.step()

    results = []
    for cls in (Plain, Calls):
        model = cls()
        kw = dict(max_epochs=2, precision=precision, gradient_clip_val=CLIP, accumulate_grad_batches=2)
        trainer = tf.Trainer(**quiet(**kw))
        if cls is Plain:  # the same warm-up, stepped by the Trainer
            model.configure_optimizers = lambda m=model: _with_step_scheduler(m)
        trainer.fit(model, loader())
        results.append((model.state_dict(), trainer.global_step, list(model.calls)))
    (plain, plain_steps, plain_calls), (hooked, hooked_steps, hooked_calls) = results
    assert plain_calls == [] and hooked_calls == [1, 3, 5, 7] * 2
    assert plain_steps == hooked_steps == 8
    for k in plain:
        torch.testing.assert_close(hooked[k], plain[k], rtol=0, atol=0)


def _with_step_scheduler(model):
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
