"""DataParallelStrategy ("dp"): refused where it cannot run, resolved without touching CUDA, hooks run per replica.

On a CPU-only machine the CUDA device count is patched (torch.cuda.device_count, the one
function the CUDA accelerator counts through) and the replica logic is driven directly:
DataParallel's cross-device copies need GPUs, everything around them does not. The tests at
the end train for real and run where 1 or 2 CUDA devices exist.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pytest
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import torchfleet.strategies
from torchfleet import Module, Trainer
from torchfleet.connector import resolve
from torchfleet.errors import ConfigurationError, MisconfiguredModuleError
from torchfleet.strategies.dp import (
    DataParallelStrategy,
    _HookParallel,
    _HookRedirect,
    _ReplicaResult,
    _scalars_as_vectors,
    combine_replica_outputs,
    mean_replica_loss,
)
from torchfleet.strategies.registry import StrategyRegistry
from torchfleet.trainer.logging import Results
from torchfleet.trainer.replica_logging import REPLICA_LOGGING, ReplicaLog, replay_replica_logs

NO_CUDA_HERE = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks DataParallel's fallback when torch sees no GPU"
)


@pytest.fixture
def cuda_count(monkeypatch):
    """Call with n: torch.cuda.device_count() answers n. Nothing is allocated and CUDA is not started."""

    def set_count(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    set_count(0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    return set_count


@pytest.fixture
def no_cuda_init(monkeypatch):
    """Fail the test if anything starts CUDA through torch.cuda's lazy initialisation."""

    def refuse() -> None:
        raise AssertionError("CUDA was initialised while resolving the strategy")

    monkeypatch.setattr(torch.cuda, "_lazy_init", refuse)


class Tiny(Module):
    """y = w x + b, with a log in every step and a record of where each step ran."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.scale = 1.0  # a plain attribute: a replica can change its own copy
        self.seen: list[tuple[torch.device, int]] = []  # one list object, shared by the replicas

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append((x.device, x.shape[0]))
        loss = nn.functional.mse_loss(self(x), y) * self.scale
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(n: int = 32) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True) + 1), batch_size=8)


def quiet(**kw):
    base = dict(enable_progress_bar=False, enable_model_summary=False, logger=False, enable_checkpointing=False,
                num_sanity_val_steps=0)
    return {**base, **kw}


# ------------------------------------------------------------------ registration, refusals
def test_dp_is_registered_and_exported():
    assert StrategyRegistry.entry("dp").cls is DataParallelStrategy
    assert "dp" in StrategyRegistry.available_strategies()
    assert torchfleet.strategies.DataParallelStrategy is DataParallelStrategy
    assert "DataParallelStrategy" in torchfleet.strategies.__all__


def _assert_dp_cpu_message(text: str) -> None:
    flat = " ".join(text.split())
    assert "strategy='dp' needs CUDA devices" in flat
    assert "one process" in flat and "several CUDA devices" in flat
    assert "not available on the CPU or on MPS" in flat
    assert "strategy='ddp'" in flat and "gloo" in flat
    assert "\n" not in text  # one paragraph


@pytest.mark.parametrize(
    "kwargs",
    [dict(accelerator="cpu", devices=2), dict(accelerator="auto", devices=2), dict(accelerator="auto")],
    ids=["cpu", "auto-devices-2", "auto-auto"],
)
def test_dp_on_the_cpu_is_refused_by_resolve(cuda_count, kwargs):
    cuda_count(0)  # a CPU machine, whatever this one has
    with pytest.raises(ConfigurationError) as err:
        resolve(strategy="dp", **kwargs)
    _assert_dp_cpu_message(str(err.value))
    assert "'cpu'" in str(err.value)


def test_dp_on_the_cpu_is_refused_by_the_trainer_before_anything_runs(cuda_count):
    with pytest.raises(ConfigurationError, match="strategy='dp' needs CUDA devices"):
        Trainer(strategy="dp", accelerator="cpu", devices=2)


def test_dp_on_mps_is_refused(cuda_count, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ConfigurationError) as err:
        resolve(accelerator="mps", devices=1, strategy="dp")
    _assert_dp_cpu_message(str(err.value))
    assert "'mps:0'" in str(err.value)


def test_several_nodes_are_refused(cuda_count, no_cuda_init):
    cuda_count(2)
    with pytest.raises(ConfigurationError, match=r"one process on one machine.*num_nodes=2.*strategy='ddp'"):
        resolve(accelerator="cuda", devices=2, strategy="dp", num_nodes=2)


def test_constructor_refuses_non_cuda_and_repeated_devices():
    with pytest.raises(ConfigurationError, match="not available on the CPU"):
        DataParallelStrategy(parallel_devices=["cpu", "cpu"])
    with pytest.raises(ConfigurationError, match="not available on the CPU"):
        DataParallelStrategy(parallel_devices=[])
    with pytest.raises(ConfigurationError, match="list cuda:1 twice"):
        DataParallelStrategy(parallel_devices=[1, "cuda:1"])


# ------------------------------------------------------------------ resolution and topology
@pytest.mark.parametrize(("devices", "ids"), [(2, [0, 1]), ("1, 0", [1, 0]), (1, [0]), ("auto", [0, 1, 2])])
def test_resolve_builds_dp_without_initialising_cuda(cuda_count, no_cuda_init, devices, ids):
    cuda_count(3)
    s = resolve(accelerator="cuda", devices=devices, strategy="dp")
    assert isinstance(s, DataParallelStrategy)
    assert s.device_ids == ids
    assert s.root_device == torch.device("cuda", ids[0])
    assert s.parallel_devices == [torch.device("cuda", i) for i in ids]
    assert s.accelerator.name == "cuda"
    assert s.precision.name == "32-true"
    # one process: no ranks, no process group
    assert (s.world_size, s.global_rank, s.local_rank, s.node_rank, s.num_nodes, s.num_processes) == (1, 0, 0, 0, 1, 1)
    assert s.is_global_zero and s.launcher is None
    assert not torch.cuda.is_initialized()


def test_devices_given_to_the_constructor_win(cuda_count, no_cuda_init):
    cuda_count(4)
    s = resolve(accelerator="cuda", devices=4, strategy=DataParallelStrategy(parallel_devices=[2, "cuda:3"]))
    assert s.device_ids == [2, 3] and s.root_device == torch.device("cuda", 2)
    assert DataParallelStrategy(parallel_devices=["cuda"]).root_device == torch.device("cuda", 0)


def test_root_device_before_configure_says_what_is_missing():
    with pytest.raises(RuntimeError, match="no devices yet"):
        DataParallelStrategy().root_device
    assert DataParallelStrategy().device_ids == []


def test_collectives_are_identities_in_one_process():
    s = DataParallelStrategy(parallel_devices=[0, 1])
    t = torch.tensor([1.0, 2.0])
    for op in ("mean", "sum", "max", "min"):
        assert s.reduce(t, reduce_op=op) is t
    assert torch.equal(s.all_gather(t), t[None])
    assert s.broadcast({"a": 1}) == {"a": 1}
    assert s.reduce_boolean_decision(False) is False and s.reduce_boolean_decision(True) is True
    with pytest.raises(ConfigurationError, match="Unknown reduce operation"):
        s.reduce(t, reduce_op="avg-ish")


# ------------------------------------------------------------------ wrapping (CPU fallback of DataParallel)
@NO_CUDA_HERE
def test_setup_module_wraps_in_dataparallel_and_unwrap_returns_the_module():
    s = DataParallelStrategy(parallel_devices=[0, 1])
    model = Tiny()
    wrapped = s.setup_module(model)
    assert type(wrapped) is nn.DataParallel
    assert wrapped.module is model and s.unwrap(wrapped) is model
    assert s.unwrap(model) is model
    # checkpoints hold the user's keys, not the wrapper's "module." prefix
    assert set(s.module_state_dict(wrapped)) == {"layer.weight", "layer.bias"}
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    s.load_module_state_dict(wrapped, state)
    assert torch.count_nonzero(model.layer.weight) == 0


@NO_CUDA_HERE
def test_step_function_runs_the_hook_when_torch_sees_no_gpu():
    s = DataParallelStrategy(parallel_devices=[0, 1])
    model = Tiny()
    wrapped = s.setup_module(model)
    batch = next(iter(data()))
    out = s.step_function(wrapped, "training_step")(batch, 0)
    assert torch.allclose(out, nn.functional.mse_loss(model(batch[0]), batch[1]))
    assert out.requires_grad
    pred = s.step_function(wrapped, "predict_step")(batch, 0)
    assert pred.shape == (8, 1)


@NO_CUDA_HERE
def test_hook_parallel_runs_the_hook_through_dataparallel_forward():
    model = Tiny()
    runner = _HookParallel(model, "training_step", nn.DataParallel(model))
    assert isinstance(runner, nn.DataParallel) and isinstance(runner.module, _HookRedirect)
    assert runner.module.module is model  # the user's module, not a copy
    batch = next(iter(data()))
    out = runner(batch, 0)
    assert torch.allclose(out, nn.functional.mse_loss(model(batch[0]), batch[1]))
    assert model.seen == [(torch.device("cpu"), 8)]


def test_manual_optimization_is_refused_for_training_step_only():
    s = DataParallelStrategy(parallel_devices=[0])
    model = Tiny()
    model.automatic_optimization = False
    with pytest.raises(ConfigurationError, match=r"automatic_optimization=False.*strategy='ddp'"):
        s.step_function(model, "training_step")
    assert s.step_function(model, "validation_step").__self__ is model


# ------------------------------------------------------------------ replicas: each runs its own copy
def _replica_of(redirect: _HookRedirect, scale: float) -> _HookRedirect:
    """A replica as torch.nn.parallel.replicate builds one (attribute dicts copied), minus the device copy."""
    user = redirect.module._replicate_for_data_parallel()  # children shared here; on GPUs they are copies too
    replica = redirect._replicate_for_data_parallel()
    replica._modules["module"] = user
    user.scale = scale
    return replica


def test_redirect_replica_calls_the_hook_on_its_own_copy_and_records_its_logs():
    model = Tiny()
    results = Results("train")
    model.loop_door.results = results
    model.loop_door.current_fx = "training_step"
    redirect = _HookRedirect(model, "training_step", REPLICA_LOGGING)
    replicas = [_replica_of(redirect, 1.0), _replica_of(redirect, 10.0)]
    batch = next(iter(data()))
    expected = nn.functional.mse_loss(model(batch[0]), batch[1])

    outs: dict[int, _ReplicaResult] = {}
    threads = [threading.Thread(target=lambda i=i, r=r: outs.__setitem__(i, r(batch, 0))) for i, r in
               enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert torch.allclose(outs[0].output, expected) and torch.allclose(outs[1].output, expected * 10)
    for i, scale in enumerate((1.0, 10.0)):
        (call,) = outs[i].collected.calls
        assert call["name"] == "train_loss" and call["fx"] == "training_step"
        assert torch.allclose(call["value"], expected * scale)
    # the shared Results was not written from the threads, and the original still holds it
    assert results.values == {} and model.loop_door.results is results
    assert model.scale == 1.0 and len(model.seen) == 2  # the shared list saw both replicas


def test_redirect_on_the_original_module_calls_the_hook_directly():
    model = Tiny()
    results = Results("train")
    model.loop_door.results, model.loop_door.current_fx = results, "training_step"
    batch = next(iter(data()))
    out = _HookRedirect(model, "training_step", REPLICA_LOGGING)(batch, 0)
    assert isinstance(out, Tensor) and out.dim() == 0
    assert torch.allclose(results.values["train_loss"].latest, out.detach())


def test_replica_without_results_records_nothing():
    model = Tiny()  # outside a Trainer: the door's results is None, self.log is a no-op
    replica = _replica_of(_HookRedirect(model, "training_step", REPLICA_LOGGING), 2.0)
    out = replica(next(iter(data())), 0)
    assert out.collected is None and out.output.dim() == 0


def test_replica_without_hooks_collects_nothing():
    model = Tiny()
    model.loop_door.results, model.loop_door.current_fx = Results("train"), "training_step"
    out = _replica_of(_HookRedirect(model, "training_step"), 2.0)(next(iter(data())), 0)
    assert out.collected is None and out.output.dim() == 0


# ------------------------------------------------------------------ combining the replicas' outputs
def cat_gather(outputs: list):
    """What DataParallel's gather does across devices, done on the CPU: concatenate along dim 0."""
    first = outputs[0]
    if isinstance(first, Tensor):
        return torch.cat(outputs)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)((k, cat_gather([o[k] for o in outputs])) for k in first)
    return type(first)(map(cat_gather, zip(*outputs)))


def test_mean_replica_loss_reduces_the_per_device_vector():
    per_device = torch.tensor([1.0, 3.0], requires_grad=True)
    loss = mean_replica_loss(per_device)
    assert loss.dim() == 0 and loss.item() == 2.0
    loss.backward()
    assert torch.equal(per_device.grad, torch.tensor([0.5, 0.5]))

    acc = torch.tensor([0.5, 1.0])
    out = mean_replica_loss(OrderedDict(loss=torch.tensor([2.0, 4.0]), acc=acc))
    assert type(out) is OrderedDict and out["loss"].item() == 3.0 and out["acc"] is acc
    assert mean_replica_loss(None) is None
    assert mean_replica_loss({"no_loss": 1}) == {"no_loss": 1}


def test_scalars_become_one_element_vectors_everywhere():
    Pair = __import__("collections").namedtuple("Pair", "a b")
    out = _scalars_as_vectors({"s": torch.tensor(1.0), "v": torch.ones(3), "t": (torch.tensor(2.0), "x"),
                               "p": Pair(torch.tensor(3.0), None)})
    assert out["s"].shape == (1,) and out["v"].shape == (3,)
    assert out["t"][0].shape == (1,) and out["t"][1] == "x"
    assert isinstance(out["p"], Pair) and out["p"].a.shape == (1,) and out["p"].b is None


def test_training_step_scalar_losses_come_back_as_their_mean():
    a = torch.tensor(1.0, requires_grad=True)
    b = torch.tensor(3.0, requires_grad=True)
    out = combine_replica_outputs([_ReplicaResult(a * 1, None), _ReplicaResult(b * 1, None)], "training_step",
                                  None, cat_gather)
    assert out.dim() == 0 and out.item() == 2.0
    out.backward()
    assert a.grad.item() == 0.5 and b.grad.item() == 0.5


def test_training_step_dict_loss_is_averaged_other_entries_stay_per_replica():
    outs = [_ReplicaResult({"loss": torch.tensor(2.0), "acc": torch.tensor(0.25)}, None),
            _ReplicaResult({"loss": torch.tensor([4.0]), "acc": torch.tensor(0.75)}, None)]
    out = combine_replica_outputs(outs, "training_step", None, cat_gather)
    assert out["loss"].dim() == 0 and out["loss"].item() == 3.0
    assert torch.equal(out["acc"], torch.tensor([0.25, 0.75]))


def test_losses_that_are_not_single_numbers_and_other_hooks_are_only_gathered():
    bad = [_ReplicaResult(torch.ones(2), None), _ReplicaResult(torch.ones(2), None)]
    assert combine_replica_outputs(bad, "training_step", None, cat_gather).shape == (4,)
    val = [_ReplicaResult(torch.tensor(1.0), None), _ReplicaResult(torch.tensor(3.0), None)]
    assert torch.equal(combine_replica_outputs(val, "validation_step", None, cat_gather),
                       torch.tensor([1.0, 3.0]))
    none = [_ReplicaResult(None, None), _ReplicaResult(None, None)]
    assert combine_replica_outputs(none, "training_step", None, cat_gather) is None


def test_combine_logs_what_the_replicas_logged_once():
    model = Tiny()
    results = model.loop_door.results = Results("train")
    logs = []
    for value in (1.0, 3.0):
        log = ReplicaLog()
        log.log("training_step", "train_loss", torch.tensor(value), True, True, None, None, "mean", False, None)
        logs.append(log)
    outs = [_ReplicaResult(torch.tensor(v), log) for v, log in zip((1.0, 3.0), logs)]
    outs.append(_ReplicaResult(torch.tensor(2.0), None))  # a replica that collected nothing is left out
    combine_replica_outputs(outs, "training_step",
                            lambda collected: REPLICA_LOGGING.merge(model, collected, torch.device("cpu")), cat_gather)
    entry = results.values["train_loss"]
    assert entry.latest.item() == 2.0 and entry.prog_bar and entry.on_step and not entry.on_epoch


def _logged(*calls):
    """One ReplicaLog per (value, reduce_fx, batch_size), logged from validation_step (epoch aggregates)."""
    logs = []
    for value, fx, size in calls:
        log = ReplicaLog()
        log.log("validation_step", "m", value, False, True, None, None, fx, False, size)
        logs.append(log)
    return logs


@pytest.mark.parametrize(
    ("calls", "epoch_value", "weight"),
    [
        ([(torch.tensor(1.0), "mean", 3), (torch.tensor(5.0), "mean", 1)], 2.0, 4),  # weighted by chunk sizes
        ([(1.0, "mean", None), (4, "mean", None)], 2.5, 8),  # plain mean, weight from the batch (8 rows)
        ([(torch.tensor(2), "sum", None), (torch.tensor(5), "sum", None)], 7.0, 0),
        ([(torch.tensor([2.0]), "max", None), (torch.tensor(5.0), torch.max, None)], 5.0, 0),
        ([(torch.tensor(2.0), "min", None), (torch.tensor(5.0), "min", None)], 2.0, 0),
    ],
    ids=["weighted-mean", "mean", "sum", "max", "min"],
)
def test_replicas_logs_combine_with_their_reduce_fx(calls, epoch_value, weight):
    results = Results("validate")
    results.new_batch(torch.zeros(8, 4))
    replay_replica_logs(_logged(*calls), results, torch.device("cpu"))
    entry = results.values["m"]
    assert entry.on_epoch and not entry.on_step
    assert entry.epoch_value().item() == pytest.approx(epoch_value)
    if calls[0][1] == "mean":
        assert entry.weight == weight


def test_replica_logs_that_results_refuses_raise_its_error():
    with pytest.raises(MisconfiguredModuleError, match="shape"):
        replay_replica_logs(_logged((torch.ones(3), "mean", None), (1.0, "mean", None)), Results("validate"),
                            torch.device("cpu"))
    with pytest.raises(ConfigurationError, match="reduce_fx"):
        replay_replica_logs(_logged((1.0, "median", None)), Results("validate"), torch.device("cpu"))


# ------------------------------------------------------------------ real training on GPUs
def _fit(devices: int) -> tuple[Tiny, Trainer, dict[str, Tensor]]:
    torch.manual_seed(0)
    model = Tiny()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = Trainer(strategy="dp", devices=devices, max_steps=3, **quiet(accelerator="cuda"))
    trainer.fit(model, data())
    return model, trainer, before


def _assert_trained(model: Tiny, trainer: Trainer, before: dict[str, Tensor]) -> None:
    assert isinstance(trainer.strategy, DataParallelStrategy)
    assert trainer.global_step == 3
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k].cpu()) for k in before), "the weights did not change"
    assert torch.isfinite(trainer.callback_metrics["train_loss"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices: checks dp trains across them")
def test_dp_trains_across_two_cuda_devices():
    model, trainer, before = _fit(devices=2)
    _assert_trained(model, trainer, before)
    assert isinstance(trainer.state.wrapped, nn.DataParallel) and trainer.state.wrapped.device_ids == [0, 1]
    # every batch of 8 was split: 4 rows on cuda:0 and 4 on cuda:1, in each of the 3 steps
    assert sorted(model.seen, key=str) == sorted([(torch.device("cuda", 0), 4), (torch.device("cuda", 1), 4)] * 3,
                                                 key=str)

    metrics = trainer.validate(model, data(16), verbose=False)
    assert torch.isfinite(torch.tensor(metrics[0]["val_loss"]))
    predictions = trainer.predict(model, data(16))
    assert [p.shape for p in predictions] == [(8, 1), (8, 1)]
    assert all(p.device == torch.device("cuda", 0) for p in predictions)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: checks dp trains on one")
def test_dp_trains_on_one_cuda_device():
    model, trainer, before = _fit(devices=1)
    _assert_trained(model, trainer, before)
    assert set(model.seen) == {(torch.device("cuda", 0), 8)}
