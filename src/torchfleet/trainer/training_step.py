"""One training batch under automatic optimisation: training_step, backward and the optimizer step.

Two ways, chosen once per fit. A strategy that overrides none of Lightning's step hooks (``CLOSURE_HOOKS``)
gets the step inline: forward, backward, then ``strategy.optimizer_step(optimizer)`` (what torch's
optimizers do with a closure, without building one per step). One that overrides any of them gets it as
Lightning's Trainer runs it: ``strategy.optimizer_step(optimizer, closure)``, the closure running
``strategy.training_step``, ``post_training_step`` and ``strategy.backward`` (whose default runs
``pre_backward``, the backward hooks and ``post_backward``), then ``on_before_optimizer_step`` and clipping, so
such a strategy may call the closure itself, or several times (LBFGS-style, as hivemind's and colossalai's do).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from torchfleet.errors import MisconfiguredModuleError
from torchfleet.strategies.trainer_contract import CLOSURE_HOOKS
from torchfleet.trainer.hooks import step_capacity

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer


def _needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` must get the closure: it re-evaluates the loss (LBFGS) or is not torch's.

    torch's other optimizers call a closure once, before the update, which would only return the loss
    already computed; skipping it saves the closure's enable_grad bookkeeping on every step.
    """
    cls = type(optimizer)
    return cls.__module__.split(".")[:2] != ["torch", "optim"] or isinstance(optimizer, torch.optim.LBFGS)


class _ReplayClosure:
    """Returns the already computed loss on the first call; recomputes forward+backward on later calls (LBFGS)."""

    __slots__ = ("loss", "recompute", "used")

    def __init__(self, loss: Any, recompute: Any) -> None:
        self.loss, self.recompute, self.used = loss, recompute, False

    def __call__(self) -> Any:
        if not self.used:
            self.used = True
            return self.loss
        return self.recompute()


class Closure:
    """What ``Strategy.optimizer_step(optimizer, closure)`` gets: each call runs training_step and backward of the
    batch (and then ``on_before_optimizer_step`` and clipping) and returns the loss, detached (None when
    ``training_step`` returned None). ``result`` is the last call's; ``used`` whether it was called at all."""

    __slots__ = ("run", "result", "used")

    def __init__(self, run: Callable[[], Tensor | None]) -> None:
        self.run, self.result, self.used = run, None, False

    def __call__(self) -> Tensor | None:
        self.used = True
        self.result = self.run()
        return self.result


class AutomaticStep:
    """The training step of one batch, for the fit loop (``run``); what it needs is resolved once per fit."""

    def __init__(self, trainer: LoopTrainer, model: Any, after_step: Callable[[Any, int], None]) -> None:
        self.trainer, self.model, self.strategy = trainer, model, trainer.strategy
        self._after_step = after_step
        hooks = trainer._hooks

        def present(name: str) -> bool:
            return bool(hooks.cb(name)) or hooks.mod(name) is not None

        self._has_before_backward = present("on_before_backward")
        self._has_after_backward = present("on_after_backward")
        self._has_before_step = present("on_before_optimizer_step")
        self._custom_clipping = hooks.mod("configure_gradient_clipping")
        overrides = trainer._strategy_overrides
        #: Lightning's path: training_step and backward run inside strategy.optimizer_step's closure
        self.through_closure = bool(overrides & set(CLOSURE_HOOKS))
        self._block = "block_backward_sync" in overrides
        self.read_accumulate()
        takes = step_capacity(model, "training_step")
        self._takes = 2 if takes is None else min(takes, 2)  # training_step(self, batch) is allowed, as in Lightning
        self._closure = _ReplayClosure(None, None)
        self._closure_needed = bool(trainer.optimizers) and _needs_closure(trainer.optimizers[0])
        self._forward_context = self.strategy.forward_context
        #: the strategy's step ran forward and backward (pipeline schedules) and returned the loss
        self._step_backpropagates = self.strategy.step_backpropagates
        # an overridden Module.optimizer_step takes the step over; only then does a step cost more
        self._step_override = hooks.mod("optimizer_step") if model.automatic_optimization else None
        if self._step_override is not None:
            from torchfleet.trainer.manual import HookOptimizer

            self._hook_optimizers = {id(o): HookOptimizer(o, self._hooked_step) for o in trainer.optimizers}

    def read_accumulate(self) -> int:
        """The batches per optimizer step, read from the Trainer once per epoch (after on_train_epoch_start, where
        GradientAccumulationScheduler sets it; Lightning reads it several times a batch); 1 where the strategy
        accumulates itself."""
        self.accumulate = 1 if self.strategy.handles_gradient_accumulation else self.trainer.accumulate_grad_batches
        return self.accumulate

    def run(self, step_fn: Any, batch: Any, batch_idx: int, boundary: bool, window_has_grads: bool,
            opt: Any) -> tuple[Tensor | None, bool]:
        """Train on ``batch``; steps ``opt`` at an accumulation ``boundary`` when the window brought gradients.

        Returns the batch's loss (detached; None when training_step returned None) and whether the window still
        holds gradients that are to be stepped.
        """
        if self.through_closure:
            return self._run_through_closure(batch, batch_idx, boundary, window_has_grads, opt)
        loss = self._forward_backward(step_fn, batch, batch_idx, boundary)
        window_has_grads = window_has_grads or loss is not None
        if boundary:
            if window_has_grads:
                if opt is not None:
                    if self._step_override is not None:
                        self._module_step(opt, _ReplayClosure(loss, self._recompute(opt, step_fn, batch, batch_idx)),
                                          batch_idx)
                    else:
                        self._optimizer_step(opt, loss, step_fn, batch, batch_idx)
                else:  # as Lightning: no optimizer, yet the step counts (max_steps ends the fit)
                    self.trainer.state.global_step += 1
            window_has_grads = False
        return loss, window_has_grads

    # ------------------------------------------------------------------ inline (no strategy step hook overridden)
    def _forward_backward(self, step_fn: Any, batch: Any, batch_idx: int, boundary: bool,
                          accumulate: int | None = None) -> Tensor | None:
        if not boundary:
            # forward belongs inside too: DDP decides in its forward whether the backward all-reduces
            with self.strategy.no_backward_sync(self.trainer.state.wrapped):
                return self._forward_backward_once(step_fn, batch, batch_idx, accumulate)
        return self._forward_backward_once(step_fn, batch, batch_idx, accumulate)

    def _forward_backward_once(self, step_fn: Any, batch: Any, batch_idx: int, accumulate: int | None) -> Tensor | None:
        trainer = self.trainer
        with self._forward_context():
            output = step_fn(batch, batch_idx)
        if self._step_backpropagates:
            return output
        loss = extract_loss(output)
        if loss is None:
            return None
        accumulate = self.accumulate if accumulate is None else accumulate
        scaled = loss / accumulate if accumulate > 1 else loss
        hooks = trainer._hooks
        if self._has_before_backward:
            hooks.call("on_before_backward", trainer, scaled)
        self.strategy.run_backward(scaled, trainer.state.wrapped)
        if self._has_after_backward:
            hooks.call("on_after_backward", trainer)
        return loss.detach()

    def _optimizer_step(self, opt: Any, loss: Tensor | None, step_fn: Any, batch: Any, batch_idx: int) -> None:
        self._before_step(opt)
        if self._closure_needed:
            closure = self._closure
            closure.loss, closure.recompute, closure.used = loss, self._recompute(opt, step_fn, batch, batch_idx), False
            self.strategy.optimizer_step(opt, closure)
        else:
            self.strategy.optimizer_step(opt)
        self.trainer.state.global_step += 1
        self._after_step(opt, batch_idx)

    def _recompute(self, opt: Any, step_fn: Any, batch: Any, batch_idx: int) -> Any:
        """The closure's later calls (LBFGS): forward and backward of the window's last batch again."""
        def recompute() -> Any:
            opt.zero_grad(set_to_none=True)
            return self._forward_backward(step_fn, batch, batch_idx, True, accumulate=1)

        return recompute

    def _before_step(self, opt: Any) -> None:
        trainer = self.trainer
        if self._has_before_step:
            trainer._hooks.call("on_before_optimizer_step", trainer, opt)
        clip = self._custom_clipping
        if clip is not None:
            clip(opt, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        elif trainer.gradient_clip_val or trainer._precision_clips:
            self.model.clip_gradients(opt, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)

    # ------------------------------------------------------------------ Lightning's order (a step hook overridden)
    def _run_through_closure(self, batch: Any, batch_idx: int, boundary: bool, window_has_grads: bool,
                             opt: Any) -> tuple[Tensor | None, bool]:
        strategy = self.strategy
        if not boundary:
            sync = strategy.block_backward_sync() if self._block else strategy.no_backward_sync(self.trainer.state.wrapped)
            with sync:
                loss = self._training_step_and_backward(batch, batch_idx, opt)
            return loss, window_has_grads or loss is not None
        if opt is None:
            loss = self._training_step_and_backward(batch, batch_idx, opt)
            if window_has_grads or loss is not None:
                self.trainer.state.global_step += 1
            return loss, False

        def run() -> Tensor | None:
            loss = self._training_step_and_backward(batch, batch_idx, opt)
            if window_has_grads or loss is not None:
                self._before_step(opt)
            return loss

        closure = Closure(run)
        if self._step_override is not None:
            self._module_step(opt, closure, batch_idx)
            return closure.result, False
        strategy.optimizer_step(opt, closure)
        if window_has_grads or closure.result is not None:
            self.trainer.state.global_step += 1
            self._after_step(opt, batch_idx)
        return closure.result, False

    def _training_step_and_backward(self, batch: Any, batch_idx: int, opt: Any) -> Tensor | None:
        strategy = self.strategy
        output = strategy.training_step(batch, batch_idx) if self._takes == 2 else strategy.training_step(
            *(batch, batch_idx)[: self._takes])
        strategy.post_training_step()
        if self._step_backpropagates:
            return output
        loss = extract_loss(output)
        if loss is None:
            return None
        accumulate = self.accumulate
        strategy.backward(loss / accumulate if accumulate > 1 else loss, opt)
        return loss.detach()

    # ------------------------------------------------------------------ the Module's own optimizer_step
    def _module_step(self, opt: Any, closure: _ReplayClosure | Closure, batch_idx: int) -> None:
        """The Module's ``optimizer_step`` steps, through a handle whose ``step`` is ``_hooked_step``."""
        trainer = self.trainer
        handle = self._hook_optimizers[id(opt)]
        trainer._hooks.call_module(trainer, "optimizer_step", self._step_override, trainer.state.current_epoch,
                                   batch_idx, handle, closure)
        if not closure.used:
            raise MisconfiguredModuleError(
                f"{type(self.model).__name__}.optimizer_step(epoch, batch_idx, optimizer, optimizer_closure) returned "
                f"without running optimizer_closure (epoch {trainer.state.current_epoch}, batch {batch_idx}), so the "
                "optimizer never stepped and the model would silently stop training. Call "
                "optimizer.step(closure=optimizer_closure) in it (or super().optimizer_step(epoch, batch_idx, "
                "optimizer, optimizer_closure)); to skip a batch, return None from training_step instead."
            )
        self._after_step(opt, batch_idx)

    def _hooked_step(self, opt: Any, closure: Any, kwargs: dict[str, Any]) -> Any:
        """``optimizer.step(closure=...)`` inside an overridden ``optimizer_step``: what ``_optimizer_step`` does."""
        if not self.through_closure:  # the closure replays what already ran: the step's preparations come now
            self._before_step(opt)
        out = self.strategy.optimizer_step(opt, closure, **kwargs)
        self.trainer.state.global_step += 1
        return out


def extract_loss(output: Any) -> Tensor | None:
    """The loss tensor of what training_step returned (None to skip the batch); refuses anything else, saying why."""
    if type(output) is Tensor and output.requires_grad and output.dim() == 0:
        return output  # the common case, checked first
    if output is None:
        return None
    if isinstance(output, Tensor):
        loss = output
    elif isinstance(output, Mapping) and "loss" in output:
        loss = output["loss"]
        if not isinstance(loss, Tensor):
            raise MisconfiguredModuleError(
                f"training_step returned a dict whose 'loss' is a {type(loss).__name__}, not a tensor. Return the "
                "loss tensor the optimizer should minimise (with its graph), e.g. {'loss': loss}."
            )
    else:
        what = f"a dict without 'loss' (keys: {', '.join(map(repr, output))})" if isinstance(output, Mapping) else (
            f"a {type(output).__name__}"
        )
        raise MisconfiguredModuleError(
            f"training_step returned {what}. It must return the loss tensor, a dict with a 'loss' tensor, or None "
            "to skip the batch."
        )
    if loss.numel() != 1:
        raise MisconfiguredModuleError(
            f"training_step returned a loss of shape {tuple(loss.shape)}; the loss must be a single number. Reduce "
            "it first, e.g. loss.mean()."
        )
    if not loss.requires_grad:
        raise MisconfiguredModuleError(
            "training_step returned a loss that does not require grad, so there is nothing to backpropagate. Was it "
            "computed under torch.no_grad(), detached, or converted with .item()? Return the tensor itself."
        )
    return loss
