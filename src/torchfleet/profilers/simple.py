"""SimpleProfiler: wall time per action (mean, calls, total, share of the stage)."""

from __future__ import annotations

import os
import time
from collections import defaultdict

from torchfleet.profilers.base import Profiler


class SimpleProfiler(Profiler):
    """Times every action; the report lists, per action, the mean duration, number of calls, total time and
    the percentage of the stage's wall time, slowest total first.

    Args:
        dirpath, filename: where the report goes (see ``Profiler``).
        extended: with False, only the mean and total columns.
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None,
                 extended: bool = True) -> None:
        super().__init__(dirpath, filename)
        self.extended = extended
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self._running: dict[str, list[float]] = defaultdict(list)  # a stack per name: the same action may nest
        self.start_time = time.perf_counter()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None,
              is_global_zero: bool | None = None) -> None:
        super().setup(stage, local_rank, log_dir, is_global_zero)
        # each stage's report covers that stage
        self.recorded_durations.clear()
        self._running.clear()
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        self._running[action_name].append(time.perf_counter())

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        started = self._running.get(action_name)
        if not started:
            raise ValueError(f"SimpleProfiler.stop({action_name!r}) without a start({action_name!r}) before it.")
        self.recorded_durations[action_name].append(end - started.pop())

    def rows(self) -> list[tuple[str, float, int, float, float]]:
        """(action, mean s, calls, total s, percent of the stage's time), largest total first."""
        elapsed = max(time.perf_counter() - self.start_time, 1e-12)
        out = [(name, sum(d) / len(d), len(d), sum(d), 100.0 * sum(d) / elapsed)
               for name, d in self.recorded_durations.items() if d]
        return sorted(out, key=lambda r: r[3], reverse=True)

    def summary(self) -> str:
        rows = self.rows()
        if not rows:
            return ""
        elapsed = time.perf_counter() - self.start_time
        title = f"{(self._stage or '').upper()} Profiler Report".strip()
        if self._rank is not None:
            title += f" (rank {self._rank})"
        width = max(len("Action"), *(len(r[0]) for r in rows))
        if self.extended:
            header = (f"| {'Action':<{width}} | {'Mean duration (s)':>17} | {'Num calls':>9} | "
                      f"{'Total time (s)':>14} | {'Percentage %':>12} |")
            rule = "-" * len(header)
            body = [f"| {'Total':<{width}} | {'-':>17} | {sum(r[2] for r in rows):>9} | {elapsed:>14.5g} | "
                    f"{'100 %':>12} |", rule]
            body += [f"| {a:<{width}} | {m:>17.5g} | {n:>9} | {t:>14.5g} | {p:>12.4g} |" for a, m, n, t, p in rows]
        else:
            header = f"| {'Action':<{width}} | {'Mean duration (s)':>17} | {'Total time (s)':>14} |"
            rule = "-" * len(header)
            body = [f"| {a:<{width}} | {m:>17.5g} | {t:>14.5g} |" for a, m, _, t, _ in rows]
        return "\n".join([title, rule, header, rule, *body, rule]) + "\n"
