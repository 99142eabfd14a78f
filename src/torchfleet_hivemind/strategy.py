"""HivemindStrategy: a one-device Trainer whose optimizer averages with peers across the internet (hivemind).

Each peer is an ordinary one-process, one-device run (SingleDeviceStrategy). In ``setup`` the Module's optimizer
is wrapped in a ``hivemind.Optimizer``: each local step only accumulates gradients and reports progress in the
DHT; once the peers together have seen ``target_batch_size`` samples, the collaboration's epoch advances (the
peers average gradients and, with ``delay_state_averaging``, parameters) and the wrapped optimizer steps. LR
schedulers step per collaborative epoch (``CollaborativeEpochScheduler``). A peer's checkpoint holds its
collaborative epoch with its optimizer state; at the start of training a peer loads the newest state the others
hold (``load_state_from_peers``), so a late or restarted peer catches up. ``teardown`` shuts the optimizer and
the DHT down (first telling the others that this peer leaves): a hivemind peer's process exits only after that.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from torchfleet.errors import ConfigurationError, check_flag, check_int, not_valid
from torchfleet.rank_zero import rank_zero_info, rank_zero_warn
from torchfleet.strategies import SingleDeviceStrategy
from torchfleet_hivemind.network import (
    check_host_maddrs,
    check_initial_peers,
    dht_options,
    is_loopback,
    where_it_listens,
)
from torchfleet_hivemind.scheduler import CollaborativeEpochScheduler

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'torchfleet[hivemind]'"
#: the longest matchmaking_time / averaging_timeout accepted, in seconds (asyncio refuses much larger timeouts)
MAX_SECONDS = 86400


def hivemind_available() -> bool:
    return importlib.util.find_spec("hivemind") is not None


def not_installed() -> ConfigurationError:
    return ConfigurationError(
        "HivemindStrategy (strategy='hivemind') needs the hivemind package, which is not installed in this Python "
        f"environment. Install it with `{INSTALL_HINT}` (or `pip install hivemind==1.1.12`); it runs on Linux "
        "and macOS, on the CPU or one GPU per peer."
    )


def _batch_size(batch: Any) -> int | None:
    """The first dimension of the first tensor in ``batch`` (nested lists, tuples, dicts), None if it holds none."""
    if isinstance(batch, Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        found = _batch_size(item)
        if found is not None:
            return found
    return None


class HivemindStrategy(SingleDeviceStrategy):
    """Train with peers on unreliable machines and slow links (hivemind): lightning-hivemind's signature.

    Arguments (as lightning-hivemind's): ``target_batch_size`` samples, over all peers, make one collaborative
    epoch (one optimizer step); ``run_id`` names the run in the DHT (peers of one run share it); ``batch_size``
    is this peer's batch size (None: read from each batch); ``delay_state_averaging``, ``delay_optimizer_step``,
    ``delay_grad_averaging``, ``offload_optimizer``, ``reuse_grad_buffers``, ``matchmaking_time``,
    ``averaging_timeout``, ``verbose``, ``averager_opts`` and ``**optimizer_kwargs`` go to ``hivemind.Optimizer``;
    ``scheduler_fn`` (callable(optimizer) -> scheduler) is needed where hivemind re-creates the optimizer
    (offload or delayed steps); ``host_maddrs`` are the multiaddrs this peer listens on (default: loopback only,
    ``/ip4/127.0.0.1/tcp/0``); ``initial_peers`` the multiaddrs of running peers to join (a list, or one
    comma-separated string), else the environment variable ``TORCHFLEET_INITIAL_PEERS``; with neither, this peer
    starts a new collaboration and logs the line that others run to join it. Every argument is checked here: a value
    not accepted (a multiaddr hivemind cannot parse included) is one ConfigurationError naming it.

    Unlike lightning-hivemind, the DHT starts on first use of ``strategy.dht`` (at the latest when the fit sets
    up), not in the constructor, so building the strategy starts no process; where ``averager_opts`` sets
    no ``request_timeout``, it is kept below ``matchmaking_time`` (hivemind's rule against matchmaking deadlocks);
    and a peer listens on loopback unless ``host_maddrs`` says otherwise (lightning-hivemind listens on every
    interface, where anyone who reaches the port can join: peers are not authenticated). When its DHT starts, a
    peer logs where it listens, as a warning where that is beyond loopback (docs/hivemind.md, "Who can join").
    """

    requires_package = "hivemind"
    #: the environment variable read for ``initial_peers`` when it is not given
    INITIAL_PEERS_ENV = "TORCHFLEET_INITIAL_PEERS"

    def __init__(
        self,
        target_batch_size: int,
        run_id: str = "torchfleet_run",
        batch_size: int | None = None,
        delay_state_averaging: bool = False,
        delay_optimizer_step: bool | None = None,
        delay_grad_averaging: bool = False,
        offload_optimizer: bool | None = None,
        reuse_grad_buffers: bool = False,
        scheduler_fn: Callable | None = None,
        matchmaking_time: float = 5.0,
        averaging_timeout: float = 30.0,
        verbose: bool = False,
        averager_opts: dict | None = None,
        host_maddrs: list | None = None,
        initial_peers: str | list | None = None,
        **optimizer_kwargs: Any,
    ) -> None:
        if not hivemind_available():
            raise not_installed()
        _check_arguments(target_batch_size=target_batch_size, run_id=run_id, batch_size=batch_size,
                         matchmaking_time=matchmaking_time, averaging_timeout=averaging_timeout,
                         averager_opts=averager_opts, scheduler_fn=scheduler_fn,
                         flags=dict(delay_state_averaging=delay_state_averaging, delay_grad_averaging=delay_grad_averaging,
                                    reuse_grad_buffers=reuse_grad_buffers, verbose=verbose),
                         optional_flags=dict(delay_optimizer_step=delay_optimizer_step,
                                             offload_optimizer=offload_optimizer))
        super().__init__()
        self.target_batch_size = target_batch_size
        self.run_id = run_id
        self.batch_size = batch_size
        self.scheduler_fn = scheduler_fn
        self.reuse_grad_buffers = reuse_grad_buffers
        #: hivemind re-creates the optimizer from its class and parameter groups: a scheduler must be re-created too
        self._recreates_optimizer = bool(delay_optimizer_step or delay_state_averaging or offload_optimizer)
        averager_opts = dict(averager_opts or {})
        if matchmaking_time is not None:
            averager_opts.setdefault("request_timeout", min(3.0, matchmaking_time / 2))
        self.optimizer_kwargs: dict[str, Any] = dict(
            matchmaking_time=matchmaking_time, averaging_timeout=averaging_timeout,
            delay_optimizer_step=delay_optimizer_step, delay_state_averaging=delay_state_averaging,
            delay_grad_averaging=delay_grad_averaging, offload_optimizer=offload_optimizer,
            averager_opts=averager_opts, verbose=verbose, reuse_grad_buffers=reuse_grad_buffers, **optimizer_kwargs,
        )
        self.host_maddrs = check_host_maddrs(host_maddrs)
        if initial_peers is None and os.environ.get(self.INITIAL_PEERS_ENV, "").strip():
            value = os.environ[self.INITIAL_PEERS_ENV]
            self.initial_peers = check_initial_peers(value, f"The environment variable {self.INITIAL_PEERS_ENV}={value!r}")
        else:
            self.initial_peers = check_initial_peers(initial_peers, f"HivemindStrategy(initial_peers={initial_peers!r})")
        self._dht: Any = None
        self._opt: Any = None
        self._batch_size_now: int | None = batch_size

    # ------------------------------------------------------------------ the peer
    @property
    def dht(self) -> Any:
        """The hivemind DHT this peer runs (started on first use)."""
        if self._dht is None:
            import hivemind

            self._dht = hivemind.DHT(start=True, initial_peers=self.initial_peers, **dht_options(self.host_maddrs))
            where, is_open = where_it_listens(self.host_maddrs, [str(a) for a in self._dht.get_visible_maddrs()])
            (rank_zero_warn if is_open else rank_zero_info)(where)
            if self.initial_peers is None:
                rank_zero_info(self.join_instructions())
        return self._dht

    def visible_maddrs(self) -> list[str]:
        """This peer's multiaddrs that other machines can dial (all of them where it listens on loopback only)."""
        maddrs = [str(a) for a in self.dht.get_visible_maddrs()]
        reachable = [a for a in maddrs if not is_loopback(a)]
        return reachable or maddrs

    def join_instructions(self) -> str:
        """The lines (logged by the first peer) that other peers run to join this collaboration."""
        peers = ",".join(self.visible_maddrs())
        command = shlex.join([os.path.basename(sys.executable), *sys.argv]) if sys.argv and sys.argv[0] else "python ..."
        who = "other machines" if any(not is_loopback(m) for m in self.host_maddrs) else "other processes on this machine"
        return (f"Hivemind: {who} join this collaboration by running the same script with\n"
                f"{self.INITIAL_PEERS_ENV}={peers} {command}\n"
                f"or with HivemindStrategy(initial_peers='{peers}', run_id={self.run_id!r}, ...)")

    @property
    def num_peers(self) -> int:
        """How many peers the collaboration has, as this one last saw (1 before training)."""
        return self._opt.tracker.global_progress.num_peers if self._opt is not None else 1

    @property
    def hivemind_optimizer(self) -> Any:
        """The ``hivemind.Optimizer`` wrapping the Module's optimizer (None outside a fit)."""
        return self._opt

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        if not self.optimizers:  # validate/test/predict: an ordinary one-device run
            return
        if getattr(self.precision, "scaler", None) is not None:
            raise ConfigurationError(
                "HivemindStrategy does not support a loss-scaled precision (16-mixed): hivemind needs its own "
                "GradScaler. Use precision='32-true' or 'bf16-mixed'.")
        self._opt = self._wrap(self.optimizers)
        self.optimizers = [self._opt]

    def _wrap(self, optimizers: list[Optimizer]) -> Any:
        import hivemind
        from hivemind.optim.grad_averager import GradientAverager

        if len(optimizers) > 1:
            raise ConfigurationError(
                f"HivemindStrategy trains with one optimizer; configure_optimizers() returned {len(optimizers)}.")
        optimizer = optimizers[0]
        if self._recreates_optimizer:
            if self.scheduler_fn is None and self.lr_scheduler_configs:
                raise ConfigurationError(
                    "With delay_optimizer_step, delay_state_averaging or offload_optimizer hivemind re-creates the "
                    "optimizer, so a scheduler must be given as HivemindStrategy(scheduler_fn=lambda opt: ...) "
                    "instead of returned by configure_optimizers().")
            kwargs = dict(params=optimizer.param_groups, optimizer=type(optimizer), scheduler=self.scheduler_fn)
        else:
            kwargs = dict(optimizer=optimizer)
        options = dict(self.optimizer_kwargs)
        timeout = options["averager_opts"].get("request_timeout")
        if timeout is not None and "grad_averager_factory" not in options and not options.get("use_local_updates"):
            # hivemind gives averager_opts to the state averager only: the gradient averager needs the timeout too
            options["grad_averager_factory"] = functools.partial(GradientAverager, request_timeout=timeout)
        opt = hivemind.Optimizer(dht=self.dht, run_id=self.run_id, target_batch_size=self.target_batch_size,
                                 batch_size_per_step=self.batch_size, **kwargs, **options)
        if not self._recreates_optimizer:
            for config in self.lr_scheduler_configs:
                if isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    raise ConfigurationError(
                        "HivemindStrategy cannot step ReduceLROnPlateau per collaborative epoch; use another scheduler.")
                config.scheduler = CollaborativeEpochScheduler(opt, config.scheduler)
        if self.reuse_grad_buffers:
            # the gradients accumulate in .grad until the collaboration steps: the Trainer's zero_grad must not clear them
            opt.zero_grad = _keep_gradients
        return opt

    def on_train_start(self) -> None:
        # after a resumed checkpoint's optimizer state (and collaborative epoch) was loaded: newer state from peers wins
        if self._opt is not None:
            self._opt.load_state_from_peers()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.batch_size is None:
            found = _batch_size(batch)
            if found is None:
                raise ConfigurationError(
                    "HivemindStrategy could not find the batch size in the batch (no tensor in it). Pass it as "
                    "HivemindStrategy(batch_size=...).")
            self._batch_size_now = found

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, model: Any = None,
                       **kwargs: Any) -> Any:
        if optimizer is self._opt and "batch_size" not in kwargs:
            kwargs["batch_size"] = self._batch_size_now
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Tell the other peers this one leaves, shut the hivemind Optimizer and the DHT down (the process exits only
        then), then the one-device teardown."""
        try:
            if self._opt is not None:
                opt, self._opt = self._opt, None
                _say_goodbye(opt)
                opt.shutdown()  # still in ``optimizers``: a checkpoint saved after the fit holds its epoch
            if self._dht is not None:
                dht, self._dht = self._dht, None
                log.info("Shutting down the hivemind DHT.")
                dht.shutdown()
        finally:
            super().teardown()


def _say_goodbye(opt: Any, timeout: float = 5.0) -> None:
    """Tell the other peers that this one leaves: its progress record in the DHT becomes None, which they do not count.

    ``hivemind.Optimizer.shutdown`` stores that record without waiting for the request and then shuts its averagers
    down, after which the DHT process fails to receive it ("[Errno 2] No such file or directory" or "[Errno 104]
    Connection reset by peer" logged by hivemind.dht): the others would count this peer until its record expires
    (a minute), each of their rounds meanwhile waiting out ``averaging_timeout`` for it. So the tracker stops here
    first, and the record is stored while the averagers still run, waiting for it.
    """
    from hivemind.utils import get_dht_time

    tracker = opt.tracker
    try:
        tracker.shutdown(opt.shutdown_timeout)  # no progress reported after the goodbye
        tracker.dht.store(tracker.training_progress_key, subkey=tracker._local_public_key, value=None,
                          expiration_time=get_dht_time() + tracker.metadata_expiration,
                          return_future=True).result(timeout=timeout)
    except Exception as error:  # the peer leaves anyway: the others then wait for its record to expire
        log.warning("Hivemind: could not tell the other peers that this one left (%r).", error)


def _keep_gradients(set_to_none: bool = True) -> None:
    """zero_grad under reuse_grad_buffers: hivemind clears the accumulated gradients itself after each step."""


def _check_arguments(target_batch_size: Any, run_id: Any, batch_size: Any, matchmaking_time: Any,
                     averaging_timeout: Any, averager_opts: Any, scheduler_fn: Any, flags: dict[str, Any],
                     optional_flags: dict[str, Any]) -> None:
    """Each argument's type and range, one paragraph for the first that is not accepted (before hivemind sees it)."""
    owner = "HivemindStrategy"
    check_int("target_batch_size", target_batch_size, 1, owner, meaning="samples over all peers per collaborative epoch")
    check_int("batch_size", batch_size, 1, owner, allow_none=True, meaning="this peer's samples per step; None: read "
              "from each batch")
    if not isinstance(run_id, str) or not run_id.strip():
        raise not_valid("run_id", run_id, "give a non-empty str that names the run (the same on every peer)", owner)
    for name, value in (("matchmaking_time", matchmaking_time), ("averaging_timeout", averaging_timeout)):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS):
            raise not_valid(name, value, f"give a number of seconds > 0 and at most {MAX_SECONDS} (a day)", owner)
    for name, value in flags.items():
        check_flag(name, value, owner)
    for name, value in optional_flags.items():
        check_flag(name, value, owner, allow_none=True)
    if averager_opts is not None and not isinstance(averager_opts, dict):
        raise not_valid("averager_opts", averager_opts, "give a dict of hivemind averager options, or None", owner)
    if scheduler_fn is not None and not callable(scheduler_fn):
        raise not_valid("scheduler_fn", scheduler_fn, "give a callable(optimizer) -> LR scheduler, or None", owner)


__all__ = ["HivemindStrategy", "INSTALL_HINT", "hivemind_available"]
