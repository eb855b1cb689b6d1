"""Counting what the corpus reader drops, across Ray: the counter actor the clean tasks report to, and
the summary of one pass (`jobs.data.corpus` says what each skip reason means).

A module of its own, importing Ray alone: the counter's actor process imports the module that defines
it, and `jobs.data.corpus` brings Ray Data and pyarrow with it (a third of a core-second more to start
each counter, one per corpus read).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

FILE_REASONS = ("unreadable_file", "binary_file", "unsupported_format", "empty_file")  # the rest count records

@dataclass(frozen=True)
class SkipSummary:
    """What one pass over the corpus kept and dropped."""

    files: int  # files read
    documents: int  # documents kept
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    skipped_files: dict[str, list[str]] = field(default_factory=dict)  # file-level reason -> paths

    def format(self) -> str:
        lines = [f"corpus: {self.files} files, {self.documents} documents kept"]
        for reason, count in sorted(self.skipped.items()):
            where = self.skipped_files.get(reason)
            lines.append(f"  skipped {reason}: {count}" + (f"  ({', '.join(where)})" if where else ""))
        if not self.skipped:
            lines.append("  skipped: nothing")
        return "\n".join(lines)


@ray.remote(num_cpus=0)
class SkipCounter:
    """Collects per-file results from the clean tasks wherever they run.

    Why an actor: the stream is consumed lazily and split across Train workers, so no single
    process sees every row; a `skip_reason` column would need a second pass (an aggregation) over
    the corpus. Each clean task reports one file at a time, and the counter *sets* that file's
    result rather than adding to it, so a retried task or a second epoch cannot double-count:
    after any complete pass the totals are exactly one pass's counts.
    """

    def __init__(self) -> None:
        self._by_file: dict[str, tuple[int, dict[str, int]]] = {}

    def report(self, path: str, kept: int, skipped: dict[str, int]) -> None:
        self._by_file[path] = (kept, skipped)

    def summary(self) -> SkipSummary:
        totals: collections.Counter = collections.Counter()
        files: dict[str, list[str]] = collections.defaultdict(list)
        for path, (_, skipped) in sorted(self._by_file.items()):
            totals.update(skipped)
            for reason in skipped.keys() & set(FILE_REASONS):
                files[reason].append(path)
        kept = sum(k for k, _ in self._by_file.values())
        return SkipSummary(len(self._by_file), kept, dict(totals), dict(files))


def new_skip_counter() -> ray.actor.ActorHandle:
    """A SkipCounter on the driver's node: the clean tasks call it from every node, and a worker node
    that dies (taking the counter with it) would otherwise fail the stream of every later attempt.
    Restartable as well, should its node be lost anyway; the next pass re-reports every file."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return SkipCounter.options(scheduling_strategy=here, max_restarts=-1, max_task_retries=-1).remote()


def skip_summary(counter: ray.actor.ActorHandle) -> SkipSummary:
    """Counts so far; complete once the dataset has been consumed to the end once."""
    return ray.get(counter.summary.remote())
