"""resolve(): the Trainer's and Fleet's arguments in, one fully built Strategy out.

A pure function: it reads its arguments and the machine (device counts, environment
variables), never mutates global state, and raises every argument error before any process
starts or any device is initialised.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from torchfleet.errors import ConfigurationError, unknown_name
from torchfleet.launchers.base import check_max_restarts
from torchfleet.watchdog import DEFAULT_HANG_TIMEOUT_S

log = logging.getLogger(__name__)

_PLUGIN_KINDS = ("precision", "checkpoint_io", "cluster_environment", "accelerator")


def _plugin_kind(plugin: Any) -> str:
    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.precision import Precision

    for kind, cls in (
        ("precision", Precision),
        ("checkpoint_io", CheckpointIO),
        ("cluster_environment", ClusterEnvironment),
        ("accelerator", Accelerator),
    ):
        if isinstance(plugin, cls):
            return kind
    raise ConfigurationError(
        f"plugins=[...] holds {plugin!r} of type {type(plugin).__name__}, which is not a plugin. Accepted plugins "
        "are Precision, CheckpointIO and ClusterEnvironment objects (and an Accelerator)."
    )


def _collect_plugins(plugins: Any) -> dict[str, Any]:
    if plugins is None:
        return {}
    if not isinstance(plugins, Iterable) or isinstance(plugins, (str, bytes)):
        plugins = [plugins]
    found: dict[str, Any] = {}
    twice: dict[str, list[Any]] = {}
    for plugin in plugins:
        kind = _plugin_kind(plugin)
        if kind in found:
            twice.setdefault(kind, [found[kind]]).append(plugin)
        found[kind] = plugin
    if twice:
        # "Received multiple values for <kinds>" is Lightning's key phrase, kept for ported pytest.raises(match=...)
        order = [k for k in found if k in twice]  # as Lightning: in the order the kinds first appear
        kinds = ", ".join(_PLUGIN_CLASS_NAMES[k] for k in order)
        given = "; ".join(f"{len(twice[k]) if len(twice[k]) > 2 else 'two'} {k} plugins: "
                          f"{' and '.join(map(repr, twice[k]))}" for k in order)
        raise ConfigurationError(
            f"Received multiple values for {kinds}: plugins=[...] holds {given}. A strategy has exactly one of each; "
            "pass only one."
        )
    return found


_PLUGIN_CLASS_NAMES = {"precision": "Precision", "checkpoint_io": "CheckpointIO",
                       "cluster_environment": "ClusterEnvironment", "accelerator": "Accelerator"}


def _check_num_nodes(num_nodes: Any) -> int:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ConfigurationError(
            f"num_nodes={num_nodes!r} is not valid: it is the number of machines, an int >= 1 (default 1)."
        )
    return num_nodes


def _asks_for_no_device(devices: Any) -> bool:
    return not isinstance(devices, bool) and devices in ([], (), 0, "0")


def _no_device(devices: Any, accelerator: Any) -> ConfigurationError:
    from torchfleet.accelerators.base import Accelerator

    name = type(accelerator).__qualname__ if isinstance(accelerator, Accelerator) else accelerator
    # "`Trainer(devices=0)` value is not a valid input using ... accelerator" is Lightning's key phrase
    return ConfigurationError(
        f"devices={devices!r} asks for no device: the `Trainer(devices={devices!r})` value is not a valid input "
        f"using {name} accelerator. Give a number of devices >= 1, a list of device ids, or 'auto'."
    )


def _check_device_type_agrees(strategy: Any, accelerator: Any) -> None:
    """A strategy object built for one device type and an accelerator name for another: refuse, naming both."""
    wanted = strategy.requested_device_type
    if wanted is None or not isinstance(accelerator, str) or accelerator.lower() in ("auto", wanted):
        return
    if accelerator.lower() == "gpu" and wanted in ("cuda", "mps"):
        return
    kind = "CPU" if wanted == "cpu" else "GPU" if wanted in ("cuda", "mps") else wanted
    # "<CPU|GPU> parallel_devices set through <Strategy> class" is Lightning's key phrase
    raise ConfigurationError(
        f"{type(strategy).__name__} was built for {wanted} devices, but accelerator={accelerator!r} asks for "
        f"another device type: {kind} parallel_devices set through {type(strategy).__name__} class disagree with "
        f"the accelerator. Choose one device type: accelerator='auto' (or {wanted!r}) with this strategy object, "
        "or a strategy object without devices."
    )


_AUTO_CHOICES_LOGGED: set[str] = set()


def _auto_strategy(total: int, per_node: int, num_nodes: int, accelerator: str) -> str:
    """strategy='auto': one process -> single_device; several -> ddp, or ddp_fork where a script cannot be re-run."""
    from torchfleet.launchers.base import interactive_session

    if total == 1:
        return "single_device"
    if interactive_session():
        name, why = "ddp_fork", "this is an interactive session (notebook or prompt), which cannot be re-run per rank"
    else:
        name, why = "ddp", "the script is re-run once per local rank"
    reason = (f"strategy='auto' chose {name!r} for {per_node} {accelerator} process(es) x {num_nodes} node(s): {why}. "
              "Pass strategy=... to choose another.")
    if reason not in _AUTO_CHOICES_LOGGED:  # once per process, not once per Trainer
        _AUTO_CHOICES_LOGGED.add(reason)
        log.info(reason)
    return name


def _strategies_worth_suggesting(accelerator: Any) -> list[str]:
    """Strategy names a typo may have meant: not those whose hardware is missing (dp: CUDA GPUs)."""
    import torch

    from torchfleet.strategies.registry import StrategyRegistry

    cuda = accelerator in ("cuda", "gpu") or (accelerator in ("auto", None) and torch.cuda.is_available())
    return [e.name for e in StrategyRegistry.entries() if e.cls.unusable_here(cuda) is None]


def resolve(
    accelerator: Any = "auto",
    devices: Any = "auto",
    strategy: Any = "auto",
    precision: Any = None,
    num_nodes: int = 1,
    plugins: Any = None,
    max_restarts: int = 0,
    hang_timeout: float | None = DEFAULT_HANG_TIMEOUT_S,
) -> Any:
    """Build the Strategy that the Trainer/Fleet arguments describe, with all its parts attached.

    ``strategy`` is a registered name or a Strategy object; ``accelerator`` a name or an
    Accelerator; ``devices`` as in the devices table of docs/strategies.md; ``precision`` a precision
    string/number or None (32-true unless a Precision plugin is given); ``plugins`` Precision,
    CheckpointIO or ClusterEnvironment objects, at most one of each kind. ``max_restarts`` (0: not asked)
    goes to a strategy that starts processes (ddp, fsdp, deepspeed and their variants). ``hang_timeout``: seconds
    (already checked by ``watchdog.parse_hang_timeout``; None: no watchdog) that the strategy's watchdog lets a rank
    wait in one collective, set on every strategy (a strategy object's own value is replaced, as for the other
    run settings); those of one process run no collective and ignore it.
    """
    from torchfleet.accelerators import AcceleratorRegistry, select_accelerator
    from torchfleet.accelerators.base import accelerator_name
    from torchfleet.environments import detect_environment
    from torchfleet.precision import DEFAULT_PRECISION, normalize_precision, precision_for
    from torchfleet.strategies.registry import StrategyRegistry
    from torchfleet.strategies.strategy import Strategy

    num_nodes = _check_num_nodes(num_nodes)
    check_max_restarts(max_restarts)
    parts = _collect_plugins(plugins)

    if precision is not None and "precision" in parts:
        raise ConfigurationError(
            f"precision={precision!r} and a Precision plugin ({parts['precision']!r}) were both given. Pass one."
        )
    precision_name = normalize_precision(precision) if precision is not None else None

    # The strategy object: given, built from the registry, or chosen below ("auto").
    if isinstance(strategy, Strategy):
        built = strategy
        for kind in ("precision", "checkpoint_io", "accelerator", "cluster_environment"):
            if kind in parts and built.has_part(kind):
                raise ConfigurationError(
                    f"The {type(built).__name__} passed as strategy= already has a {kind} "
                    f"({getattr(built, kind)!r}) and plugins=[...] gives another ({parts[kind]!r}). Pass it once."
                )
        if precision_name is not None and built.has_part("precision") and built.precision.name != precision_name:
            raise ConfigurationError(
                f"precision={precision!r} disagrees with the precision of the strategy object "
                f"({built.precision.name!r}). Pass it once."
            )
    elif isinstance(strategy, str):
        built = None
        if strategy != "auto" and strategy not in StrategyRegistry and strategy.lower() in StrategyRegistry:
            strategy = strategy.lower()  # names are matched as accelerator names are: exactly, then in lower case
        if strategy != "auto":
            if strategy not in StrategyRegistry:  # unknown names fail here, before devices are looked at
                raise unknown_name("strategy", strategy, StrategyRegistry.available(),
                                   suggest=_strategies_worth_suggesting(accelerator),
                                   hint=f"(You selected an invalid strategy name: `strategy={strategy!r}`.)")
    else:
        raise ConfigurationError(
            f"strategy={strategy!r} is not understood: pass a registered name ('auto', 'single_device', ...; see "
            "`torchfleet strategies`) or a Strategy object."
        )

    # Accelerator: the strategy's own, else the argument, else a plugin.
    acc_arg = parts.get("accelerator", accelerator)
    if built is not None and built.accelerator is not None:
        built_name = accelerator_name(built.accelerator)
        if acc_arg not in ("auto", None) and not (isinstance(acc_arg, str) and acc_arg == built_name):
            if not (acc_arg == "gpu" and built_name in ("cuda", "mps")):
                raise ConfigurationError(
                    f"accelerator={acc_arg!r} disagrees with the strategy's accelerator {built.accelerator!r}."
                )
        acc = built.accelerator
    elif acc_arg in ("auto", None) and built is not None and built.requested_device_type is not None:
        # the strategy object names its device: its type, not the machine's best device, is the accelerator
        kind = built.requested_device_type
        acc = select_accelerator(kind if kind in AcceleratorRegistry else "cpu")
    else:
        if built is not None:
            _check_device_type_agrees(built, acc_arg)
        try:
            acc = select_accelerator(acc_arg if acc_arg is not None else "auto")
        except ConfigurationError:
            # as Lightning: a request for no device is named first, before an accelerator this machine lacks
            if _asks_for_no_device(devices):
                raise _no_device(devices, acc_arg) from None
            raise

    if isinstance(devices, str) and devices.strip().lower() == "auto":
        devices = acc.auto_device_count()  # as Lightning: the accelerator says what "auto" means
    parsed = acc.parse_devices(devices)
    device_list = acc.get_parallel_devices(parsed)
    total = len(device_list) * num_nodes
    env = parts.get("cluster_environment") or detect_environment()

    if built is None:
        name = strategy
        if name == "auto":
            # a launcher that started several ranks (torchrun, srun) means a multi-process run even where
            # devices x num_nodes says 1: ddp's pre-flight check then names the disagreement
            launched = env.world_size() if env.creates_processes_externally else 1
            name = _auto_strategy(max(total, launched), len(device_list), num_nodes, accelerator_name(acc))
        built = StrategyRegistry.get(name)

    built.configure(device_list, num_nodes, env)
    if built.accelerator is None:
        built.accelerator = acc
    if "checkpoint_io" in parts:
        built.checkpoint_io = parts["checkpoint_io"]
    if "precision" in parts:
        built.precision = parts["precision"]
    elif not built.has_part("precision"):
        # the device type, not root_device: this rank's device is known only once the launch is checked (a torchrun
        # rank beyond `devices` has none, and launcher.launch says so)
        device_type = built.requested_device_type or built.root_device.type
        built.precision = precision_for(precision_name or DEFAULT_PRECISION, device_type)
    if max_restarts:
        _apply_max_restarts(built, max_restarts)
    built.hang_timeout = hang_timeout
    return built


def _apply_max_restarts(strategy: Any, max_restarts: int) -> None:
    """Give the Trainer's/Fleet's ``max_restarts`` to the strategy, unless it already holds another value."""
    if not hasattr(type(strategy), "max_restarts"):
        log.warning("max_restarts=%d has no effect with %s: it runs in this one process, and no launching process "
                    "watches it and starts it again.", max_restarts, type(strategy).__name__)
        return
    if strategy.max_restarts not in (0, max_restarts):
        raise ConfigurationError(
            f"max_restarts={max_restarts} disagrees with the strategy object's max_restarts={strategy.max_restarts}. "
            "Give it once: to the Trainer/Fleet, or to the strategy."
        )
    strategy.max_restarts = max_restarts
