"""Every public module path and name of Lightning's ``lightning.pytorch`` and ``lightning.fabric`` resolves under
torchfleet's name, or is in docs/porting.md's absent list with its reason (or is being built: PENDING).

Lightning's paths and names are the committed list tests/lightning_modules.json, written by
tools/record_lightning_modules.py (its docstring has the rule for what counts as public); where the reference
Lightning is installed, the list is checked against it. The mapping of paths and names is ``torchfleet_path`` and
``RENAMES`` here, documented in docs/porting.md ("Lightning's module paths").
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import warnings

import pytest

from tests.lightning_reference import LIGHTNING_PYTHON, needs_lightning

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LIST = os.path.join(HERE, "lightning_modules.json")
PORTING = os.path.join(ROOT, "docs", "porting.md")
TOOL = os.path.join(ROOT, "tools", "record_lightning_modules.py")

#: Lightning's name -> torchfleet's name for the same object, where torchfleet named it its own way
RENAMES = {
    "LightningModule": "Module",
    "LightningDataModule": "DataModule",
    "Fabric": "Fleet",
    "LightningOptimizer": "OptimizerWrapper",
    "ExperimentWriter": "CSVWriter",
    "MLFlowLogger": "MLflowLogger",
    "ACCELERATOR_REGISTRY": "AcceleratorRegistry",
    "STRATEGY_REGISTRY": "StrategyRegistry",
}

_PRUNING = "ModelPruning is not built yet (torch.nn.utils.prune under the Trainer's hooks): issue 34 item 3"
#: entries (in docs/porting.md's notation) being built; allowed absent until they land
PENDING: dict[str, str] = {entry: _PRUNING for entry in ("*:ModelPruning", "lightning.pytorch.callbacks.pruning")}


def torchfleet_path(path: str) -> str:
    """``lightning.pytorch.X.Y`` and ``lightning.fabric.X.Y`` -> ``torchfleet.X.Y``: one package for both, as the
    Trainer and Fleet share one strategy layer."""
    for root in ("lightning.pytorch", "lightning.fabric"):
        if path == root or path.startswith(root + "."):
            return "torchfleet" + path[len(root):]
    raise ValueError(f"{path} is not under lightning.pytorch or lightning.fabric")


def absent_list(text: str) -> dict[str, str]:
    """docs/porting.md's absent entries -> their reason group: the backticked entries of each bullet of the section
    "### Absent module paths and names", the bullet's bold words being the group."""
    section = text.split("### Absent module paths and names", 1)[1].split("\n#", 1)[0]
    entries: dict[str, str] = {}
    for bullet in re.split(r"\n- ", section)[1:]:
        group = re.match(r"\*\*(.+?)\*\*", bullet)
        assert group, f"an absent-list bullet without its bold reason group: {bullet[:80]!r}"
        for entry in re.findall(r"`([^`]+)`", bullet):
            if entry.startswith(("lightning.", "*:")):
                assert entry not in entries, f"{entry} is listed twice in docs/porting.md"
                entries[entry] = group.group(1)
    return entries


def matches(entry: str, module: str, name: str | None) -> bool:
    """Whether an absent-list entry covers ``module`` (``name`` None) or ``module:name``.

    ``a.b`` is the module and its names, ``a.b.*`` also everything under it, ``a.b:N`` one name, ``*:N`` the name
    wherever Lightning exports it."""
    path, _, wanted = entry.partition(":")
    if wanted:
        return name == wanted and (path == "*" or path == module)
    if path.endswith(".*"):
        return module == path[:-2] or module.startswith(path[:-1])
    return module == path


def _resolve(lightning: dict[str, list[str]]) -> tuple[list[tuple[str, str | None]], list[tuple[str, str | None]]]:
    """(entries that resolve, entries that do not): (module, None) for a module path, (module, name) for a name."""
    found, missing = [], []
    for module, names in lightning.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ours = importlib.import_module(torchfleet_path(module))
        except ImportError:
            missing += [(module, None)] + [(module, name) for name in names]
            continue
        found.append((module, None))
        for name in names:
            (found if hasattr(ours, RENAMES.get(name, name)) else missing).append((module, name))
    return found, missing


@pytest.fixture(scope="module")
def lightning() -> dict:
    with open(LIST) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def absent() -> dict[str, str]:
    with open(PORTING) as f:
        return absent_list(f.read())


@pytest.fixture(scope="module")
def resolved(lightning):
    return _resolve(lightning["modules"])


def _label(module: str, name: str | None) -> str:
    return module if name is None else f"{module}:{name}"


def test_every_lightning_path_and_name_resolves_or_is_explained(resolved, absent):
    _, missing = resolved
    allowed = list(absent) + list(PENDING)
    unexplained = [_label(*item) for item in missing if not any(matches(e, *item) for e in allowed)]
    assert not unexplained, (
        f"{len(unexplained)} Lightning module paths or names do not resolve under torchfleet's names (docs/porting.md, "
        f"\"Lightning's module paths\") and are not in its absent list: {unexplained}")


def test_the_absent_list_names_only_what_is_absent(lightning, resolved, absent):
    found, missing = resolved
    everything = found + missing
    stale = [e for e in list(absent) + list(PENDING) if not any(matches(e, *item) for item in everything)]
    assert not stale, f"absent entries that name nothing Lightning has: {stale}"
    present = sorted({e for e in absent for item in found if matches(e, *item)})
    assert not present, f"docs/porting.md lists as absent what torchfleet has now (remove them there): {present}"
    overlap = sorted(set(absent) & set(PENDING))
    assert not overlap, f"listed both as absent and as pending: {overlap}"


def test_the_mapping_reaches_the_same_objects():
    # the paths are aliases, not copies: a class reached through Lightning's path is torchfleet's own class
    import torchfleet
    from torchfleet.callbacks.early_stopping import EarlyStopping
    from torchfleet.callbacks.progress.tqdm_progress import TQDMProgressBar
    from torchfleet.core.module import Module
    from torchfleet.fabric import Fleet
    from torchfleet.plugins.environments.slurm import SLURMEnvironment
    from torchfleet.strategies.launchers.subprocess_script import ScriptLauncher

    assert EarlyStopping is torchfleet.callbacks.EarlyStopping
    assert TQDMProgressBar is torchfleet.callbacks.TQDMProgressBar
    assert Module is torchfleet.Module and Fleet is torchfleet.Fleet
    assert SLURMEnvironment is torchfleet.environments.SLURMEnvironment
    assert ScriptLauncher is torchfleet.launchers.ScriptLauncher
    assert torchfleet_path("lightning.fabric.plugins.io.torch_io") == "torchfleet.plugins.io.torch_io"


def test_every_callback_name_of_the_single_module_still_imports():
    # torchfleet.callbacks became a package: what `from torchfleet.callbacks import X` gave before still comes
    import torchfleet.callbacks as callbacks
    import torchfleet.trainer.callbacks as shipped

    for name in shipped.__all__:
        assert getattr(callbacks, name) is getattr(shipped, name)
    assert set(shipped.__all__) <= set(callbacks.__all__)


def test_the_rule_reads_entries(tmp_path):
    text = ("x\n### Absent module paths and names\n\nintro\n\n- **Needs XLA**: `lightning.fabric.strategies.xla_fsdp`, "
            "`*:XLAPrecision`.\n- **Loop internals**: `lightning.pytorch.loops.*` and more\n\n## Next\n- **No**: `lightning.x`\n")
    entries = absent_list(text)
    assert entries == {"lightning.fabric.strategies.xla_fsdp": "Needs XLA", "*:XLAPrecision": "Needs XLA",
                       "lightning.pytorch.loops.*": "Loop internals"}
    assert matches("lightning.pytorch.loops.*", "lightning.pytorch.loops.optimization.closure", "Closure")
    assert matches("lightning.pytorch.loops.*", "lightning.pytorch.loops", None)
    assert not matches("lightning.pytorch.loops.*", "lightning.pytorch.loopsy", None)
    assert matches("*:XLAPrecision", "lightning.pytorch.plugins", "XLAPrecision")
    assert not matches("*:XLAPrecision", "lightning.pytorch.plugins", None)
    assert not matches("lightning.fabric.strategies.xla_fsdp", "lightning.fabric.strategies", "XLAFSDPStrategy")


def test_tally(lightning, resolved, absent, capsys):
    """Prints the counts docs/porting.md quotes; they must add up."""
    found, missing = resolved
    groups: dict[str, int] = {}
    for item in missing:
        entry = next((e for e in list(PENDING) + list(absent) if matches(e, *item)), None)
        group = PENDING.get(entry) or absent.get(entry, "unexplained")
        groups[group] = groups.get(group, 0) + 1
    modules = len(lightning["modules"])
    names = sum(len(v) for v in lightning["modules"].values())
    assert len(found) + len(missing) == modules + names
    with capsys.disabled():
        print(f"\n{modules} module paths + {names} names = {modules + names}; resolve {len(found)} "
              f"({sum(1 for m, n in found if n is None)} paths); absent {len(missing)}: {groups}")


@needs_lightning
def test_the_committed_list_is_the_installed_lightnings(lightning):
    out = subprocess.run([LIGHTNING_PYTHON, TOOL], capture_output=True, text=True, timeout=240, check=True).stdout
    assert json.loads(out) == lightning, (
        f"Lightning's module paths changed: regenerate with `{LIGHTNING_PYTHON} tools/record_lightning_modules.py > "
        "tests/lightning_modules.json`, then make the new ones resolve or list them in docs/porting.md")
