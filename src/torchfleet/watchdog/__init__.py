"""Hang and desync diagnosis: every collective torchfleet issues is numbered, named and located.

Each collective torchfleet issues goes through ``collective(name)``, which gives it this process's next number, its
name and the user's call site (a collective over a group of ranks, ``collective(name, group=...)``, is numbered
within that group). Ranks that run the same program issue the same collectives in the same order, so the
same number names the same collective on every rank; where it does not, the ranks desynchronised. A watchdog thread
per rank ends a rank that waits too long, and the launching process reports what every rank was doing.

One file per job:

- ``numbering.py``  the recorder: ``collective``, ``labelled``, ``set_position``, ``current``
- ``groups.py``     how a collective over a group (a mesh dimension) is written in the records (``group_text``)
- ``sites.py``      the call site: the first frame of the user's code (``call_site``)
- ``blackbox.py``   each rank's record in a memory-mapped file that survives the process (``read_box``)
- ``hang.py``       the watchdog thread (``start``), ``hang_timeout`` (``parse_hang_timeout``), ``HANG_EXIT_CODE``
- ``desync.py``     comparing the ranks' records: a desync or a hang (``analyse``)
- ``report.py``     the launching process's report (``report``), a rank's own part under torchrun
- ``nccl.py``       PyTorch's NCCL flight recorder, switched on and dumped (``nccl_flight_recorder_env``)

Callers import from this package (``from torchfleet.watchdog import collective``), not from its files.
"""

from __future__ import annotations

from torchfleet.watchdog.blackbox import box_path, read_box, stacks_path
from torchfleet.watchdog.desync import _DESYNC_HINT as _DESYNC_HINT
from torchfleet.watchdog.desync import analyse
from torchfleet.watchdog.groups import group_text, over
from torchfleet.watchdog.hang import (
    DEFAULT_HANG_TIMEOUT_S,
    DUMP_REQUEST,
    HANG_EXIT_CODE,
    HANG_MARKER,
    explain_failure,
    parse_hang_timeout,
    probe_after,
    set_in_process_supervisor,
    start,
    tick_for,
    write_stacks,
)
from torchfleet.watchdog.nccl import FLIGHT_RECORDER_ENTRIES, nccl_flight_recorder_env
from torchfleet.watchdog.numbering import _describe_position as _describe_position
from torchfleet.watchdog.numbering import _Recorder as _Recorder
from torchfleet.watchdog.numbering import collective, current, labelled, set_position
from torchfleet.watchdog.report import describe_record, main_thread_stack, report
from torchfleet.watchdog.sites import call_site

__all__ = [
    "DEFAULT_HANG_TIMEOUT_S",
    "DUMP_REQUEST",
    "FLIGHT_RECORDER_ENTRIES",
    "HANG_EXIT_CODE",
    "HANG_MARKER",
    "analyse",
    "box_path",
    "call_site",
    "collective",
    "current",
    "describe_record",
    "explain_failure",
    "group_text",
    "labelled",
    "main_thread_stack",
    "nccl_flight_recorder_env",
    "over",
    "parse_hang_timeout",
    "probe_after",
    "read_box",
    "report",
    "set_in_process_supervisor",
    "set_position",
    "stacks_path",
    "start",
    "tick_for",
    "write_stacks",
]
