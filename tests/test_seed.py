"""seed_everything, reset_seed, isolate_rng and worker_init_function (with real DataLoader worker processes)."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfleet
from tests.helpers import LogRecords, Regressor, quiet
from tests.lightning_reference import needs_lightning, start_in_lightning
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.seed import SEED_ENV, WORKERS_ENV


@pytest.fixture(autouse=True)
def _clean_seed_env(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    monkeypatch.delenv(WORKERS_ENV, raising=False)


@pytest.fixture
def records():
    with LogRecords() as messages:
        yield messages


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def test_no_seed_means_zero_unless_the_environment_says(monkeypatch, records):
    with pytest.warns(UserWarning, match="No seed found: seed_everything.. set the seed to 0"):
        assert torchfleet.seed_everything() == 0
    first = _draws()
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    assert first == _draws()
    assert "Seed set to 0" in records
    monkeypatch.setenv(SEED_ENV, "123")
    assert torchfleet.seed_everything(verbose=False) == 123
    assert "Seed set to 123" not in records


def test_no_seed_warns_once_and_only_when_verbose(recwarn):
    torchfleet.seed_everything(verbose=False)  # quiet: neither the log line nor the warning
    assert not [w for w in recwarn if "No seed found" in str(w.message)]
    del os.environ[SEED_ENV]
    with pytest.warns(UserWarning, match="No seed found"):
        torchfleet.seed_everything()
    recwarn.clear()
    torchfleet.seed_everything()  # the environment now holds the seed: nothing to warn about
    assert not [w for w in recwarn if "No seed found" in str(w.message)]


def test_bad_seeds_are_refused(monkeypatch):
    with pytest.raises(ConfigurationError, match=r"seed=-1 is not in bounds"):
        torchfleet.seed_everything(-1)
    with pytest.raises(ConfigurationError, match=r"seed=4294967296 is not in bounds"):
        torchfleet.seed_everything(2**32)
    with pytest.raises(ConfigurationError, match=r"seed=10000000000.0 is not in bounds"):
        torchfleet.seed_everything(10e9)
    with pytest.raises(ConfigurationError, match=r"seed=3.5 is not an int"):
        torchfleet.seed_everything(3.5)
    with pytest.raises(ConfigurationError, match=r"seed='7' is not an int"):
        torchfleet.seed_everything("7")
    monkeypatch.setenv(SEED_ENV, "abc")
    with pytest.raises(ConfigurationError, match=r"TF_GLOBAL_SEED='abc' is not a seed"):
        torchfleet.seed_everything()


def test_a_whole_float_seed_is_that_int():
    assert torchfleet.seed_everything(1e3, verbose=False) == 1000
    assert os.environ[SEED_ENV] == "1000"
    first = torch.rand(3)
    torchfleet.seed_everything(1000, verbose=False)
    assert torch.equal(first, torch.rand(3))


def test_reset_seed_repeats_the_seeded_stream():
    torchfleet.reset_seed()  # never seeded: nothing happens, nothing raises
    torchfleet.seed_everything(7, workers=True, verbose=False)
    first = _draws()
    _draws()
    torchfleet.reset_seed()
    assert _draws() == first
    import os

    assert os.environ[WORKERS_ENV] == "1"


def test_isolate_rng_restores_every_generator_even_on_error():
    torchfleet.seed_everything(3, verbose=False)
    with torchfleet.isolate_rng():
        inside = _draws()
    after = _draws()
    assert after == inside  # the block's draws did not advance the streams
    with pytest.raises(RuntimeError), torchfleet.isolate_rng():
        _draws()
        raise RuntimeError("boom")
    assert _draws() != after
    torchfleet.seed_everything(3, verbose=False)
    _draws()
    expected = _draws()
    torchfleet.seed_everything(3, verbose=False)
    _draws()
    with pytest.raises(RuntimeError), torchfleet.isolate_rng():
        _draws()
        raise RuntimeError("boom")
    assert _draws() == expected


class _Draws(Dataset):
    """Each item: the worker's id and one draw from each of torch, Python and NumPy in that worker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return torch.tensor([float(info.id), torch.rand(1).item(), random.random(), float(np.random.rand())],
                            dtype=torch.float64)


def _collect(worker_init_fn, seed=11):
    torch.manual_seed(seed)
    loader = DataLoader(_Draws(), batch_size=1, num_workers=2, worker_init_fn=worker_init_fn)
    return torch.cat(list(loader))


def test_worker_init_function_gives_distinct_reproducible_worker_seeds():
    rows = _collect(torchfleet.worker_init_function)
    again = _collect(torchfleet.worker_init_function)
    assert torch.equal(rows, again)
    by_worker = {int(w): rows[rows[:, 0] == w, 1:] for w in (0, 1)}
    for column in range(3):  # torch, Python, NumPy: each differs between the two workers
        assert not torch.equal(by_worker[0][:, column], by_worker[1][:, column])
    # torch's own worker seeding depends on the base seed and worker id only, so two ranks seeded alike
    # draw the same augmentations; the function makes the rank part of the seed
    import functools

    rank1 = _collect(functools.partial(torchfleet.worker_init_function, rank=1))
    plain = _collect(None)
    assert torch.equal(rows[:, 0], rank1[:, 0])
    for column in (1, 2, 3):
        assert not torch.equal(rank1[:, column], rows[:, column])
        assert not torch.equal(plain[:, column], rows[:, column])


def test_lightning_worker_init_name_gives_each_worker_and_rank_its_own_streams():
    from torchfleet.seed import pl_worker_init_function

    streams = set()
    for worker_id in range(6):
        for rank in range(6):
            torchfleet.seed_everything(2**32 - 1, verbose=False)  # the largest seed: base - worker_id stays valid
            pl_worker_init_function(worker_id, rank)
            streams.add((tuple(torch.randint(0, 10**6, (8,)).tolist()), random.random(), float(np.random.rand())))
    assert len(streams) == 36
    assert len({s[0] for s in streams}) == len({s[1] for s in streams}) == len({s[2] for s in streams}) == 36


class _FromDraws(Regressor):
    def __init__(self):
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch.clone())
        return self(batch[:, 1:2].float().expand(-1, 8).contiguous()).sum() * 0


def _fit_draws(workers: bool):
    torchfleet.seed_everything(5, workers=workers, verbose=False)
    model = _FromDraws()
    loader = DataLoader(_Draws(), batch_size=2, num_workers=2)
    Trainer(max_epochs=1, **quiet()).fit(model, loader)
    return torch.cat(model.seen), loader


def test_a_users_worker_init_fn_is_kept():
    torchfleet.seed_everything(5, workers=True, verbose=False)

    def mine(worker_id):
        np.random.seed(100 + worker_id)

    loader = DataLoader(_Draws(), batch_size=2, num_workers=2, worker_init_fn=mine)
    Trainer(max_epochs=1, **quiet()).fit(_FromDraws(), loader)
    assert loader.worker_init_fn is mine


def _fleet_draws(workers: bool):
    from torchfleet import Fleet

    torchfleet.seed_everything(5, workers=workers, verbose=False)
    fleet = Fleet(accelerator="cpu", devices=1)
    loader = DataLoader(_Draws(), batch_size=2, num_workers=2)
    return torch.cat(list(fleet.setup_dataloaders(loader))), loader


@pytest.mark.parametrize("draws", [_fit_draws, _fleet_draws], ids=["trainer", "fleet_setup_dataloaders"])
def test_the_worker_init_function_is_added_when_asked(draws):
    rows, loader = draws(workers=True)
    assert loader.worker_init_fn.func is torchfleet.worker_init_function
    assert loader.worker_init_fn.keywords == {"rank": 0}
    again, _ = draws(workers=True)
    assert torch.equal(rows, again)
    plain_rows, plain_loader = draws(workers=False)
    assert plain_loader.worker_init_fn is None
    # same seed, same base seed for the workers: only the function makes the draws differ
    assert torch.equal(rows[:, 0], plain_rows[:, 0])
    assert not torch.equal(rows[:, 1:], plain_rows[:, 1:])


def _stderr_of(*codes: str) -> list[str]:
    """What each program wrote to stderr, each in a fresh interpreter; they run at once (each imports torch)."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for code in codes]
    errs = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        errs.append(err)
    return errs


def test_seed_lines_reach_the_programs_handlers_as_lightnings_do():
    # a program that configured logging (root at WARNING, as basicConfig leaves it) sees torchfleet's info lines
    seeded = "import logging; logging.basicConfig(); import torchfleet; torchfleet.seed_everything(7)"
    # reset_seed says nothing (as Lightning)
    reseeded = seeded.replace("seed_everything(7)", "seed_everything(7, verbose=False); torchfleet.reset_seed()")
    # one that set torchfleet's level itself keeps it
    quiet_first = "import logging; logging.basicConfig(); logging.getLogger('torchfleet').setLevel(logging.WARNING); "
    said, unverbose, reset, quiet = _stderr_of(
        seeded, seeded.replace("seed_everything(7)", "seed_everything(7, verbose=False)"), reseeded,
        quiet_first + "import torchfleet; torchfleet.seed_everything(7)")
    assert "Seed set to 7" in said
    assert "Seed set to" not in unverbose
    assert "Seed set to" not in reset
    assert "Seed set to" not in quiet


SEEDED_WITHOUT_LOGGING = """
import os
{imports}
seed_everything(3)
seed_everything(4, workers=True)
seed_everything(5, verbose=False)
os.environ.update(RANK="1", WORLD_SIZE="2")  # as torchrun starts rank 1
seed_everything(6)
"""


def test_seed_lines_are_printed_without_logging_configured():
    """A program that configured no logging sees the line on stderr at the call, as under Lightning (whose import
    adds a handler); under torchrun with the rank first; nothing with verbose=False."""
    (err,) = _stderr_of(SEEDED_WITHOUT_LOGGING.format(imports="from torchfleet import seed_everything"))
    assert err.splitlines() == ["Seed set to 3", "Seed set to 4", "[rank: 1] Seed set to 6"]


@needs_lightning
def test_seed_lines_are_lightnings():
    lightning = start_in_lightning(SEEDED_WITHOUT_LOGGING.format(imports="from lightning.pytorch import seed_everything"))
    (ours,) = _stderr_of(SEEDED_WITHOUT_LOGGING.format(imports="from torchfleet import seed_everything"))
    _, theirs = lightning.communicate(timeout=240)
    assert lightning.returncode == 0, theirs[-3000:]
    assert ours.splitlines() == theirs.splitlines()
