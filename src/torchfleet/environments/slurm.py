"""SLURMEnvironment: processes started by srun inside an sbatch (or salloc) job."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

from torchfleet.environments._common import (
    LaunchedEnvironment,
    address_or_first_host,
    check_world_size,
    env_int,
    job_port,
)
from torchfleet.errors import ConfigurationError, LauncherSettingsError, PossibleUserWarning
from torchfleet.utilities import rank_zero_warn

log = logging.getLogger("torchfleet")

#: how long the requeue command may take before it is given up on (SLURM kills the job soon after the signal)
REQUEUE_TIMEOUT_S = 30.0
#: job names of an interactive allocation, where the shell (not srun) runs the script
INTERACTIVE_JOB_NAMES = ("bash", "interactive")

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _split_top_level(text: str) -> list[str]:
    """Split on the commas and whitespace that are outside brackets ("a,b", "a b" and "a, b" alike)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                break
        elif depth == 0 and (ch == "," or ch.isspace()):
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigurationError(
            f"The SLURM node list {text!r} has unbalanced brackets; expected a form like 'node[01-03,07],gpu5'."
        )
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_range(item: str, nodelist: str) -> list[str]:
    lo, sep, hi = item.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise ConfigurationError(
            f"The SLURM node list {nodelist!r} holds the range {item!r}; expected numbers like '01-03' or '7'."
        )
    if not sep:
        return [lo]
    # "01-03" keeps its zero padding: node01, node02, node03
    return [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]


def _expand_term(term: str, nodelist: str) -> list[str]:
    match = _BRACKET.search(term)
    if match is None:
        return [term]
    prefix, rest = term[: match.start()], term[match.end() :]
    tails = _expand_term(rest, nodelist)  # several bracket groups ("rack[1-2]-n[1-2]") multiply
    hosts = []
    for item in match.group(1).split(","):
        for value in _expand_range(item.strip(), nodelist):
            hosts.extend(prefix + value + tail for tail in tails)
    return hosts


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compressed host list: "node[01-03,07],gpu5" -> node01, node02, node03, node07, gpu5.

    Hosts may be separated by commas or whitespace ("alpha beta gamma"), as Lightning accepts.
    """
    hosts: list[str] = []
    for term in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_term(term, nodelist))
    return hosts


def _warn_if_srun_unused() -> None:
    """Warn when srun exists here but did not start this process: a multi-process SLURM job needs it."""
    if sys.platform == "win32" or shutil.which("srun") is None or SLURMEnvironment._srun_started():
        return
    command = " ".join(["srun", os.path.basename(sys.executable), *sys.argv])[:64]
    # "`srun` ... available ... but is not used. HINT:" is Lightning's key phrase, kept for ported warning filters
    rank_zero_warn(
        "The `srun` command is available on this machine, but is not used. HINT: without srun, SLURM starts one "
        "process and torchfleet starts any others on this node only; to run on the SLURM job's nodes, prefix the "
        f"command with srun: {command} ...",
        category=PossibleUserWarning,
    )


def _check_ntasks_layout() -> None:
    """Refuse ``--ntasks=N`` (N > 1) when SLURM does not say how many of the tasks run on each node."""
    ntasks = env_int("SLURM_NTASKS", default=1)
    if ntasks > 1 and not any(os.environ.get(k) for k in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")):
        raise LauncherSettingsError(
            f"You set `--ntasks={ntasks}` in your SLURM job (SLURM_NTASKS={ntasks}), but neither "
            "SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE says how the tasks are spread over the nodes, so "
            "torchfleet cannot check them against devices. Accepted: #SBATCH --ntasks-per-node=<devices> "
            "(with --nodes=<num_nodes>), or a job launched with srun, which sets SLURM_TASKS_PER_NODE."
        )


def _tasks_per_node_from() -> tuple[int | None, str]:
    """Tasks per node when SLURM says it and it is the same on every node ("2" or "2(x3)"), and the variable read."""
    variable = "SLURM_NTASKS_PER_NODE" if os.environ.get("SLURM_NTASKS_PER_NODE") else "SLURM_TASKS_PER_NODE"
    match = re.fullmatch(r"(\d+)(?:\(x\d+\))?", os.environ.get(variable, "").strip())
    return (int(match.group(1)) if match else None), variable


class SLURMEnvironment(LaunchedEnvironment):
    """Ranks from SLURM_PROCID/SLURM_LOCALID/SLURM_NODEID; rank 0 runs on the first host of the job.

    Detected when SLURM_NTASKS is set and the job is not an interactive shell (SLURM_JOB_NAME
    "bash" or "interactive"), where the script runs without srun and torchfleet starts the
    processes itself. The main port is MASTER_PORT, else 15000 plus the last four digits of
    SLURM_JOB_ID (Lightning's rule), so every task computes the same port without talking to the others and two
    jobs sharing a node rarely collide.
    """

    WORLD_SIZE, RANK, LOCAL_RANK = ("SLURM_NTASKS",), ("SLURM_PROCID",), ("SLURM_LOCALID",)

    def __init__(self, auto_requeue: bool = True, requeue_command: Sequence[str] | None = None) -> None:
        """``auto_requeue``: after a preemption checkpoint is saved, global rank 0 runs ``requeue_command``
        (default ``["scontrol", "requeue", "<SLURM_JOB_ID>"]``; ``{job_id}`` in an item is replaced by the
        job id) so that SLURM runs the job again, and the restarted job resumes from that checkpoint."""
        if not isinstance(auto_requeue, bool):
            raise ConfigurationError(f"SLURMEnvironment(auto_requeue={auto_requeue!r}) is not valid: give True or False.")
        if requeue_command is not None and (
            isinstance(requeue_command, str) or not requeue_command
            or not all(isinstance(part, str) for part in requeue_command)
        ):
            raise ConfigurationError(
                f"SLURMEnvironment(requeue_command={requeue_command!r}) is not valid: give the command as a non-empty "
                "list of strings, e.g. [\"scontrol\", \"requeue\", \"{job_id}\"] ({job_id} is replaced by "
                "SLURM_JOB_ID), or None for that default."
            )
        self.auto_requeue = auto_requeue
        self.requeue_command = list(requeue_command) if requeue_command is not None else None
        _warn_if_srun_unused()
        _check_ntasks_layout()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(auto_requeue={self.auto_requeue})"

    @staticmethod
    def job_name() -> str | None:
        """SLURM_JOB_NAME (None outside a job)."""
        return os.environ.get("SLURM_JOB_NAME")

    @staticmethod
    def job_id() -> int | None:
        """SLURM_JOB_ID as an int; None outside a job, in an interactive shell, or when it is not a number."""
        if SLURMEnvironment.job_name() in INTERACTIVE_JOB_NAMES:
            return None
        try:
            return int(os.environ["SLURM_JOB_ID"])
        except (KeyError, ValueError):
            return None

    @staticmethod
    def _requeue_id() -> str | None:
        """SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID for an array task, else SLURM_JOB_ID (None outside a job)."""
        array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        if array_job and task:
            return f"{array_job}_{task}"
        return os.environ.get("SLURM_JOB_ID") or None

    def on_preempted(self) -> str | None:
        """Requeue the job (``auto_requeue``): a failure is a warning, never an error."""
        if not self.auto_requeue:
            return None
        job = self._requeue_id()
        if job is None:
            log.warning("torchfleet: cannot requeue the SLURM job: SLURM_JOB_ID is not set.")
            return None
        template = self.requeue_command or ["scontrol", "requeue", "{job_id}"]
        command = [part.replace("{job_id}", job) for part in template]
        shown = " ".join(command)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=REQUEUE_TIMEOUT_S)
        except FileNotFoundError:
            log.warning("torchfleet: could not requeue the SLURM job: %r was not found on PATH. Requeue it yourself "
                        "(%s), or pass SLURMEnvironment(auto_requeue=False).", command[0], shown)
            return None
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("torchfleet: could not requeue the SLURM job: `%s` failed (%s). Requeue it yourself.", shown, exc)
            return None
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip()
            log.warning("torchfleet: could not requeue the SLURM job: `%s` exited with code %d%s. Requeue it yourself "
                        "(the job needs #SBATCH --requeue).", shown, proc.returncode, f": {detail}" if detail else "")
            return None
        return f"SLURM job {job} requeued (`{shown}`)."

    @property
    def main_address(self) -> str:
        """MASTER_ADDR, else the first host of SLURM_NODELIST (or SLURM_JOB_NODELIST)."""
        return address_or_first_host(lambda: expand_nodelist(
            os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or ""))

    @property
    def main_port(self) -> int:
        """MASTER_PORT, else 15000 + the last four digits of SLURM_JOB_ID (Lightning's rule)."""
        return job_port("SLURM_JOB_ID", 15000, 4)

    @staticmethod
    def detect() -> bool:
        """Whether srun started this process (an interactive salloc shell does not count).

        Warns (PossibleUserWarning) when srun is installed here but did not start this process."""
        _warn_if_srun_unused()
        return SLURMEnvironment._srun_started()

    @staticmethod
    def _srun_started() -> bool:
        """``detect()`` without the warning about an unused srun."""
        return "SLURM_NTASKS" in os.environ and SLURMEnvironment.job_name() not in INTERACTIVE_JOB_NAMES

    def node_rank(self) -> int:
        """SLURM_NODEID."""
        return env_int("SLURM_NODEID")

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raise when the job's tasks per node, node count or task count disagree with devices / num_nodes.

        Nothing is checked in an interactive shell, where torchfleet, not SLURM, starts the processes."""
        if self.job_name() in INTERACTIVE_JOB_NAMES:
            return
        # "the number of tasks per node / nodes configured in SLURM ... does not match" is Lightning's key phrase
        per_node, variable = _tasks_per_node_from()
        if per_node is not None and per_node != num_devices:
            raise ConfigurationError(
                f"SLURM runs {per_node} tasks per node ({variable}={per_node}), but the Trainer has "
                f"devices={num_devices}: the number of tasks per node configured in SLURM ({per_node}) does not "
                f"match. Put #SBATCH --ntasks-per-node={num_devices} in the job script (or pass "
                f"--ntasks-per-node={num_devices} to srun), or set devices={per_node}."
            )
        nnodes = env_int("SLURM_NNODES", "SLURM_JOB_NUM_NODES", default=0)
        if nnodes and nnodes != num_nodes:
            raise ConfigurationError(
                f"The SLURM job has {nnodes} nodes (SLURM_NNODES={nnodes}), but the Trainer has num_nodes={num_nodes}: "
                f"the number of nodes configured in SLURM ({nnodes}) does not match. Put #SBATCH --nodes={num_nodes} "
                f"in the job script (or pass --nodes={num_nodes} to srun), or set num_nodes={nnodes}."
            )
        if not os.environ.get("SLURM_NTASKS"):
            return
        check_world_size(
            "SLURM", self.world_size(), num_devices, num_nodes,
            f"put #SBATCH --nodes={num_nodes} --ntasks-per-node={num_devices} in the job script and launch with "
            "srun python ...", "SLURM_NTASKS", per_node,
        )
