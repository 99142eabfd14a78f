"""A sampler or batch sampler of the user's own under ddp (Trainer and Fleet), and loggers called from every rank.

Each launch (scripts/user_samplers.py) runs every case in the same 2 processes; the references are one-process
runs of the same functions here. A user's sampler must be dealt out: the ranks read disjoint parts of one epoch,
together the epoch one process reads, a new order each epoch; ``use_distributed_sampler=False`` leaves it as it
is; evaluation counts each sample once; a mid-epoch resume reads the batches the uninterrupted run read. Loggers:
one version folder, one event file, and only rank 0's values in them.
"""

from __future__ import annotations

import csv
import glob
import os
from collections import Counter

import pytest
from torch.utils.data import DataLoader, SubsetRandomSampler, WeightedRandomSampler

import torchfleet as tf
from tests.distributed.scripts import user_samplers as us
from tests.distributed.sharded_helpers import assert_close, load_results, run_script

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = us.__file__


def _launch(tmp_path_factory, mode: str) -> dict:
    out = tmp_path_factory.mktemp(mode)
    proc = run_script(SCRIPT, {"mode": mode, "dir": str(out)})
    results = load_results({"out": os.path.join(out, "results.pt")}, proc)
    results["dir"] = str(out)
    results["stderr"] = proc.stderr
    return results


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, "trainer")


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory) -> dict:
    return _launch(tmp_path_factory, "fleet")


def one_process_loaders() -> dict:
    data = us.make_data()
    return {
        "subset": DataLoader(data, batch_size=4, sampler=SubsetRandomSampler(us.SUBSET)),
        "weighted": DataLoader(data, batch_size=4, sampler=WeightedRandomSampler(us.WEIGHTS, num_samples=us.N - 16,
                                                                                  replacement=False)),
        "buckets": DataLoader(data, batch_sampler=us.Buckets()),
    }


def by_epoch(records: list) -> dict[int, list[list[int]]]:
    """(epoch, batch_idx, indices) records -> epoch -> the batches' indices, in order."""
    out: dict[int, list[list[int]]] = {}
    for epoch, _, idx in records:
        out.setdefault(epoch, []).append(idx)
    return out


def flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def check_dealt_out(ranks: list[list], one_process: list, epochs: int = us.EPOCHS) -> None:
    """Per epoch: the ranks' indices are disjoint, as many batches on each, together one process's epoch."""
    r0, r1 = by_epoch(ranks[0]), by_epoch(ranks[1])
    want = by_epoch(one_process)
    assert sorted(r0) == sorted(r1) == list(range(epochs))
    for epoch in range(epochs):
        a, b = flat(r0[epoch]), flat(r1[epoch])
        assert len(r0[epoch]) == len(r1[epoch])  # DDP needs as many steps on every rank
        assert not set(a) & set(b), f"epoch {epoch}: both ranks read {sorted(set(a) & set(b))}"
        assert len(set(a)) == len(a) and len(set(b)) == len(b)
        assert Counter(a + b) == Counter(flat(want[epoch]))


@pytest.mark.parametrize("case", ["subset", "weighted", "buckets"])
def test_trainer_deals_a_user_sampler_out_to_the_ranks(trainer_run, case):
    tf.seed_everything(0)
    one = us.trainer_fit("single_device", 1, one_process_loaders()[case])
    ranks = trainer_run[case]["train"] if case == "subset" else trainer_run[case]
    check_dealt_out(ranks, one.seen)
    if case == "buckets":  # a batch sampler's batches are dealt out whole (6 of 5 indices a rank), not re-cut
        assert [len(idx) for rank in ranks for _, _, idx in rank] == [5] * 6 * us.EPOCHS * 2


@pytest.mark.parametrize("case", ["subset", "weighted", "buckets"])
def test_fleet_deals_a_user_sampler_out_to_the_ranks(fleet_run, case):
    tf.seed_everything(0)
    fleet = tf.Fleet(accelerator="cpu", devices=1)
    one = us.fleet_epochs(fleet, fleet.setup_dataloaders(one_process_loaders()[case]))
    ranks = fleet_run[case]["train"] if case == "subset" else fleet_run[case]
    check_dealt_out(ranks, one)


@pytest.mark.parametrize("client", ["trainer", "fleet"])
def test_a_random_sampler_draws_a_new_order_each_epoch(trainer_run, fleet_run, client):
    run = trainer_run if client == "trainer" else fleet_run
    for rank in run["subset"]["train"]:
        orders = by_epoch(rank)
        assert flat(orders[0]) != flat(orders[1]) != flat(orders[2])
        # and a new split: the ranks do not keep the same samples from epoch to epoch
        assert set(flat(orders[0])) != set(flat(orders[1]))


@pytest.mark.parametrize("client", ["trainer", "fleet"])
def test_use_distributed_sampler_false_keeps_the_users_sampler(trainer_run, fleet_run, client):
    run = trainer_run if client == "trainer" else fleet_run
    rank0, rank1 = (flat(by_epoch(r)[0]) for r in run["kept"])
    # each rank reads the whole subset (the user's sampler as it is)
    assert sorted(rank0) == sorted(rank1) == us.SUBSET


def test_trainer_validation_with_a_user_sampler_counts_each_sample_once(trainer_run):
    subset = trainer_run["subset"]
    val0, val1 = subset["val"]
    disjoint_per_run(val0, val1, us.EPOCHS)
    assert Counter(val0 + val1) == Counter(us.UNEVEN_VAL * us.EPOCHS)  # validated once per epoch
    assert [count for _, count in subset["val_total"]] == [len(us.UNEVEN_VAL)] * us.EPOCHS

    tf.seed_everything(0)
    model = us.Recorder()
    loader = DataLoader(us.make_data(), batch_size=4, sampler=SubsetRandomSampler(us.UNEVEN_VAL))
    (want,) = us.make_trainer("single_device", 1).validate(model, loader, verbose=False)
    got = trainer_run["validate"]
    assert sorted(got["val_seen"][0] + got["val_seen"][1]) == sorted(us.UNEVEN_VAL)
    assert got["val_total"] == pytest.approx(model.val_total[-1], rel=1e-6)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-6)


def test_fsdp_deals_a_user_sampler_out_and_evens_out_evaluation(trainer_run):
    tf.seed_everything(0)
    one = us.trainer_fit("single_device", 1, one_process_loaders()["subset"], max_epochs=1)
    check_dealt_out(trainer_run["fsdp"]["train"], one.seen, epochs=1)
    val0, val1 = trainer_run["fsdp"]["val"]
    # 15 samples: 8 a rank, so both run 2 batches; the one repeated sample is the epoch's first (rank 0's first)
    assert len(val0) == len(val1) == 8 and set(val0 + val1) == set(us.UNEVEN_VAL)
    assert [i for i, c in Counter(val0 + val1).items() if c > 1] == [val0[0]]


def disjoint_per_run(seen0: list[int], seen1: list[int], runs: int) -> None:
    """Each validation run deals the sampler's draw out: no sample on both ranks within a run (a run draws anew:
    evaluation samplers are told the training epoch, as Lightning's, so the unions over runs may overlap)."""
    n0, n1 = len(seen0) // runs, len(seen1) // runs
    assert n0 * runs == len(seen0) and n1 * runs == len(seen1)
    for r in range(runs):
        assert not set(seen0[r * n0:(r + 1) * n0]) & set(seen1[r * n1:(r + 1) * n1]), f"run {r}"


def check_kfold(got: list[dict], want: list[dict]) -> None:
    for fold, (g, w) in enumerate(zip(got, want)):
        _, val_ids = us.kfold_split(fold)
        seen0, seen1 = g["val_seen"]
        runs = len(seen0 + seen1) // len(val_ids)  # the Trainer validates every epoch, the Fleet loop once
        assert runs >= 1 and Counter(seen0 + seen1) == Counter(val_ids * runs)
        disjoint_per_run(seen0, seen1, runs)
        assert g["val_total"][1] == pytest.approx(w["val_total"][1])  # not doubled: each sample counted once
        assert g["val_loss"] == pytest.approx(w["val_loss"], rel=1e-5)
        assert_close(g["weights"], w["weights"], atol=1e-6)


def test_trainer_kfold_program_gives_the_one_process_validation_loss(trainer_run):
    tf.seed_everything(0)
    check_kfold(trainer_run["kfold"], us.kfold("single_device", 1))


def test_fleet_kfold_program_gives_the_one_process_validation_loss(fleet_run):
    tf.seed_everything(0)
    check_kfold(fleet_run["kfold"], us.fleet_kfold(tf.Fleet(accelerator="cpu", devices=1)))


def test_mid_epoch_resume_with_a_wrapped_sampler_reads_the_same_batches(trainer_run):
    resume = trainer_run["resume"]
    assert resume["same_weights"]
    for whole, resumed in zip(resume["whole"], resume["resumed"]):
        # the checkpoint was written after global step 8: epoch 1 (6 batches an epoch), its second batch
        after = [r for r in whole if (r[0], r[1]) > (1, 1)]
        assert resumed == after and resumed[0][:2] == (1, 2)


@pytest.mark.parametrize("client", ["trainer", "fleet"])
def test_an_iterable_dataset_is_warned_about_once(trainer_run, fleet_run, client):
    run = trainer_run if client == "trainer" else fleet_run
    # a training and a validation loader (over 2 epochs in the Trainer): one warning, from rank 0
    assert run["iterable_warnings"] == [1, 0]


def check_one_folder_written_by_rank_zero(run: dict, log_dirs: list) -> None:
    logs = os.path.join(run["dir"], "logs")
    tb, csv_dir = log_dirs[0]
    assert all(dirs == log_dirs[0] for dirs in log_dirs)  # every rank names the same folders
    assert sorted(os.listdir(os.path.join(logs, "tb"))) == sorted(os.listdir(os.path.join(logs, "csv"))) == [
        "version_0"]
    assert tb == os.path.join(logs, "tb", "version_0") and csv_dir == os.path.join(logs, "csv", "version_0")
    (events,) = glob.glob(os.path.join(tb, "events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(events)
    acc.Reload()
    written = [e.value for e in acc.Scalars("rank_of_writer")]
    assert written and set(written) == {0.0}
    with open(os.path.join(csv_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get("rank_of_writer")]
    assert rows and {float(r["rank_of_writer"]) for r in rows} == {0.0}


def test_trainer_loggers_write_one_version_folder_from_rank_zero(trainer_run):
    check_one_folder_written_by_rank_zero(trainer_run, trainer_run["log_dirs"])


def test_fleet_loggers_write_one_version_folder_from_rank_zero(fleet_run):
    check_one_folder_written_by_rank_zero(fleet_run, fleet_run["log_dirs"])
    with open(os.path.join(fleet_run["log_dirs"][0][1], "hparams.yaml")) as f:
        assert f.read().strip() == "rank: 0"


def test_fleet_spawn_loggers_agree_and_the_launching_process_names_rank_zeros_folder(tmp_path_factory):
    run = _launch(tmp_path_factory, "fleet_spawn")
    check_one_folder_written_by_rank_zero(run, run["log_dirs"])
    # after launch() the launching process's loggers point at what the ranks wrote, not at a next version
    assert run["launcher_log_dirs"] == run["log_dirs"][0]
    versions, names = run["versions"], run["loggers"]
    assert versions[0] == versions[1] == run["launcher_versions"]  # one version (run id) for every rank
    logs = os.path.join(run["dir"], "logs")
    if "MLflowLogger" in names:  # installed: the run rank 0 created is the one every rank names
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{os.path.join(logs, 'mlflow', 'mlflow.db')}")
        (experiment,) = [e for e in client.search_experiments() if e.name == "samplers"]
        (only_run,) = client.search_runs([experiment.experiment_id])
        assert only_run.info.run_id == versions[0][names.index("MLflowLogger")]
        history = client.get_metric_history(only_run.info.run_id, "rank_of_writer")
        assert history and {m.value for m in history} == {0.0}
        assert only_run.data.params == {"rank": "0"}
    if "WandbLogger" in names:
        run_id = versions[0][names.index("WandbLogger")]
        (one,) = glob.glob(os.path.join(logs, "wandb", "wandb", "offline-run-*"))  # rank 1 started no run
        assert one.endswith(f"-{run_id}")


def test_ranks_that_draw_different_orders_stop_with_one_clear_error(fleet_run):
    """Seeded differently, the ranks' SubsetRandomSampler draws differ: Lightning would train on overlapping parts
    silently; here every rank raises the same error at the pass's start, and the ranks stay in step."""
    unequal = fleet_run["unequal_draws"]
    first, second = unequal["messages"]
    assert first == second and first is not None
    assert first.startswith("The processes drew different orders from your SubsetRandomSampler (rank 0 drew order 1; "
                            "rank 1 drew order 2).")
    assert "seed_everything(seed)" in first
    # seeded alike again, the next pass runs on both ranks: half the subset's batches each
    assert unequal["batches_after"] == [-(-len(us.SUBSET) // 2 // 4)] * 2
