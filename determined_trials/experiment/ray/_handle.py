"""``RayTrialRun``: one run of a trial on Ray as the runner sees it (the ``TrialHandle`` protocol), over
one actor per node it runs on. When one node's part fails or its actor or node dies, the others are
killed at once, so no rank waits in a collective for a peer that is gone. What each part's ranks wrote
for TensorBoard on its node comes back with its result (``on_files``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DIED_EXIT_CODE", "PREEMPTED_EXIT_CODE", "RayTrialRun"]

DIED_EXIT_CODE = 1
PREEMPTED_EXIT_CODE = 75
_KILL_WAIT_S = 10.0


class RayTrialRun:
    """The actors of one trial run (node rank order) and their ``run`` results; ``group``: the placement
    group to remove at the end (or None)."""

    def __init__(self, ray: Any, actors: Sequence[Any], refs: Sequence[Any], group: Any,
                 on_files: Callable[[bytes], object] | None = None) -> None:
        self.terminated = False
        self._ray, self._actors, self._refs, self._group = ray, list(actors), list(refs), group
        self._on_files = on_files
        self._results: dict[int, tuple[int, str]] = {}
        self._code: int | None = None
        self._reason = ""

    def _gather(self, timeout: float | None) -> None:
        """File the results of the parts that ended (waiting up to ``timeout`` for one)."""
        pending = [ref for index, ref in enumerate(self._refs) if index not in self._results]
        if not pending:
            return
        ready, _ = self._ray.wait(pending, num_returns=1, timeout=timeout)
        ready, _ = self._ray.wait(pending, num_returns=len(pending), timeout=0) if ready else (ready, None)
        for ref in ready:
            index = self._refs.index(ref)
            try:
                code, reason, *files = self._ray.get(ref)
                self._results[index] = (int(code), str(reason))
                if files and files[0] and self._on_files is not None:
                    with contextlib.suppress(Exception):  # TensorBoard files are a bonus, never a failure
                        self._on_files(files[0])
            except self._ray.exceptions.RayError as exc:  # the node or the actor's worker died
                where = f" on node {index} of {len(self._refs)}" if len(self._refs) > 1 else ""
                self._results[index] = (DIED_EXIT_CODE, f"the trial's Ray actor or its node died{where}: "
                                                        f"{type(exc).__name__}: {exc}")

    def _failed(self) -> tuple[int, str] | None:
        """The first part that failed. A preemption's 75 is no failure: the ranks agree on a stop (one
        collective), so every node's part ends with it soon; the run's code is decided when all did."""
        for index in sorted(self._results):
            code, reason = self._results[index]
            if code not in (0, PREEMPTED_EXIT_CODE):
                where = f"node {index}: " if len(self._refs) > 1 and reason else ""
                return code, where + reason
        return None

    def _settle(self) -> None:
        """Decide once every part ended, or one failed (then the others are killed)."""
        if self._code is not None:
            return
        failed = self._failed()
        if failed is None and len(self._results) < len(self._refs):
            return
        if failed is not None:
            self._code, self._reason = failed
            self._kill_parts()
        else:
            codes = [self._results[index][0] for index in range(len(self._refs))]
            self._code = next((code for code in codes if code != 0), 0)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)
        if self._group is not None:
            with contextlib.suppress(Exception):
                self._ray.util.remove_placement_group(self._group)

    def _kill_parts(self) -> None:
        """SIGKILL every process still running on the other nodes, waiting a little for it."""
        live = [actor for index, actor in enumerate(self._actors) if index not in self._results]
        refs = [actor.kill_now.remote() for actor in live]
        with contextlib.suppress(Exception):
            self._ray.wait(refs, num_returns=len(refs), timeout=_KILL_WAIT_S)

    def poll(self) -> int | None:
        if self._code is None:
            self._gather(timeout=0)
            self._settle()
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        while self._code is None:
            before = len(self._results)
            self._gather(timeout=timeout)
            self._settle()
            if self._code is None and len(self._results) == before:
                raise TimeoutError(f"the trial's Ray actors did not end within {timeout} s")
        return self._code

    def terminate(self) -> None:
        """Ask every node's part, once, to checkpoint and stop (they stop at the same batch)."""
        if not self.terminated:
            self.terminated = True
            for actor in self._actors:
                actor.signal.remote("TERM")

    def kill(self) -> None:
        """SIGKILL to the trial's processes on every node, then end the actors (also unplaced ones)."""
        refs = [actor.signal.remote("KILL") for actor in self._actors]
        with contextlib.suppress(Exception):
            self._ray.wait(refs, num_returns=len(refs), timeout=_KILL_WAIT_S)
        for actor in self._actors:
            self._ray.kill(actor)

    def reason(self, code: int) -> str:
        return self._reason or f"trial process failed (exit code {code})"
