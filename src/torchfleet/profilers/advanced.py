"""AdvancedProfiler: a cProfile profile per action (function-level time inside each hook and step)."""

from __future__ import annotations

import cProfile
import io
import os
import pstats

from torchfleet.profilers.base import Profiler


class AdvancedProfiler(Profiler):
    """Runs Python's cProfile while each action runs, one profile per action name; the report prints, per action,
    the functions it called sorted by cumulative time.

    Only one cProfile can run at a time, so while an action runs inside another (``backward`` inside
    ``optimizer_step``), the time is recorded under the inner action only.

    Args:
        dirpath, filename: where the report goes (see ``Profiler``).
        line_count_restriction: how many functions each action lists: an int, or a float fraction (1.0: all).
        dump_stats: also write each action's raw profile as ``<stage>-<filename>[-<rank>]-<action>.prof``
            (readable with ``pstats`` or snakeviz).
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 line_count_restriction: int | float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath, filename)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self._stack: list[tuple[str, cProfile.Profile]] = []

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None,
              is_global_zero: bool | None = None) -> None:
        super().setup(stage, local_rank, log_dir, is_global_zero)
        self.profiled_actions = {}
        self._stack = []

    def start(self, action_name: str) -> None:
        if self._stack:
            self._stack[-1][1].disable()  # the outer action pauses while this one runs
        prof = self.profiled_actions.get(action_name)
        if prof is None:
            prof = self.profiled_actions[action_name] = cProfile.Profile()
        self._stack.append((action_name, prof))
        prof.enable()

    def stop(self, action_name: str) -> None:
        if not self._stack or self._stack[-1][0] != action_name:
            running = self._stack[-1][0] if self._stack else "nothing"
            raise ValueError(f"AdvancedProfiler.stop({action_name!r}) while {running!r} runs: actions must nest.")
        _, prof = self._stack.pop()
        prof.disable()
        if self._stack:
            self._stack[-1][1].enable()

    def stats(self, action_name: str) -> pstats.Stats:
        """The action's profile as ``pstats.Stats``."""
        return pstats.Stats(self.profiled_actions[action_name])

    def summary(self) -> str:
        if not self.profiled_actions:
            return ""
        title = f"{(self._stage or '').upper()} Profiler Report".strip()
        parts = [title]
        for name, prof in self.profiled_actions.items():
            stream = io.StringIO()
            stats = pstats.Stats(prof, stream=stream)
            if not stats.stats:  # type: ignore[attr-defined]
                continue
            stats.strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
            rank = f" rank: {self._rank}" if self._rank is not None else ""
            parts += [f"Profile stats for: {name}{rank}", stream.getvalue()]
            if self.dump_stats and self.dirpath:
                os.makedirs(self.dirpath, exist_ok=True)
                safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
                prof.dump_stats(os.path.join(self.dirpath, self._prepare_filename(safe, ".prof")))
        return "\n".join(parts) + "\n"

    def teardown(self, stage: str | None) -> None:
        for _, prof in self._stack:
            prof.disable()
        self._stack = []
