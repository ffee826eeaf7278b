"""Window planning: which steps an act reads, and which keys at each step (its contract).
Pure logic, no I/O; the uplink asks it what the next act will read.

An act asked at step `t` (the previous act of the same worker-side episode at `prev_act`,
None for its first act) reads:
  - an `at` stream: steps t + o for each offset o (before step 0: kept and reading step 0
    with pad repeat_first, left out with pad drop);
  - an `every` k stream: steps p + k, p + 2k, ... before t (p = prev_act; first act:
    0, k, 2k, ... before t), and t itself;
  - a stream with neither: t alone (the contract resolves it to at=(0,));
  - no contract (None): t alone, with every key.
The act's own step `t` is always in the window, last, even when no stream reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from robotd.contract import ContractError, ResolvedObservations


@dataclass(frozen=True)
class Window:
    """The steps one act reads, ascending, the act's own step last.

    steps: may hold negative steps (pad repeat_first); each reads step 0's recorded values.
    keys_at: step -> keys read at that step, sorted; the own step may map to ().
    """

    steps: tuple[int, ...]
    keys_at: Mapping[int, tuple[str, ...]]

    @property
    def t(self) -> int:
        """The act's own step."""
        return self.steps[-1]

    @staticmethod
    def source_step(step: int) -> int:
        """The step whose recorded values `step` reads: step 0 for a padded negative step."""
        return max(step, 0)

    def needed(self) -> dict[int, frozenset[str]]:
        """Recorded (non-negative) step -> keys this window reads from it; steps read for no
        key are left out (nothing to upload for them)."""
        out: dict[int, set[str]] = {}
        for step in self.steps:
            if self.keys_at[step]:
                out.setdefault(self.source_step(step), set()).update(self.keys_at[step])
        return {s: frozenset(keys) for s, keys in sorted(out.items())}


def _check_steps(t: int, prev_act: int | None) -> None:
    if t < 0:
        raise ValueError(f"act step t={t} must be >= 0")
    if prev_act is not None and not 0 <= prev_act < t:
        raise ValueError(f"previous act step {prev_act} must be in 0..{t - 1} for an act at {t}")


class WindowPlanner:
    """Plans windows for one resolved contract over an observation of `all_keys`.

    obs None means an undeclared contract: every act reads its own step alone, all keys.
    A declared key missing from `all_keys` raises ContractError (it could never be read).
    """

    def __init__(self, obs: ResolvedObservations | None, all_keys: Sequence[str]) -> None:
        self._obs = obs
        self._all_keys = tuple(sorted(set(all_keys)))
        self._drop = obs is not None and obs.pad == "drop"
        if obs is None:
            self._at: list[tuple[str, tuple[int, ...]]] = []
            self._every: list[tuple[str, int]] = []
            return
        missing = [k for k in obs.keys if k not in set(all_keys)]
        if missing:
            raise ContractError(
                f"observations.streams: {', '.join(map(repr, missing))} not produced by this "
                f"robot (it has {', '.join(map(repr, self._all_keys)) or 'no keys'})"
            )
        self._at = [(k, s.at) for k, s in sorted(obs.streams.items()) if s.at is not None]
        self._every = [(k, s.every) for k, s in sorted(obs.streams.items()) if s.every is not None]

    @property
    def keys(self) -> tuple[str, ...]:
        """The keys captured for upload: the declared streams, or every key if undeclared."""
        return self._all_keys if self._obs is None else self._obs.keys

    @property
    def lookback(self) -> int:
        """Past steps the robot-side ring must keep for at-windows (the caller adds a margin,
        and the act interval for every-streams)."""
        return 0 if self._obs is None else self._obs.max_lookback

    def plan(self, t: int, prev_act: int | None) -> Window:
        """The window of an act at step `t`; `prev_act` is the previous act's step in the
        same worker-side episode (None for its first act). ValueError if not 0 <= prev < t."""
        _check_steps(t, prev_act)
        if self._obs is None:
            return Window((t,), {t: self._all_keys})
        reads: dict[int, set[str]] = {t: set()}
        for key, offsets in self._at:
            for o in offsets:
                if t + o >= 0 or not self._drop:
                    reads.setdefault(t + o, set()).add(key)
        for key, k in self._every:
            start = 0 if prev_act is None else prev_act + k
            for step in (*range(start, t, k), t):
                reads.setdefault(step, set()).add(key)
        steps = tuple(sorted(reads))
        return Window(steps, {s: tuple(sorted(reads[s])) for s in steps})

    def needed(self, t: int, prev_act: int | None) -> dict[int, frozenset[str]]:
        """Recorded step -> keys the act at `t` reads from it (what must have been uploaded)."""
        return self.plan(t, prev_act).needed()

    def every_keys_at(self, step: int, last_act: int | None) -> tuple[str, ...]:
        """Every-stream keys the next act will read at `step` (step > last_act, the latest
        act asked), known as soon as the step is made, before the next act's step is known.
        The next act's own step reads all every-keys too; it goes up with that act."""
        if self._obs is None or (last_act is not None and step <= last_act):
            return ()
        base = 0 if last_act is None else last_act
        return tuple(key for key, k in self._every if (step - base) % k == 0)


def assemble(window: Window, lookup: Callable[[int, str], Any]) -> dict[str, list[Any]]:
    """The policy's input for one act: {"observations": [...], "steps": [...]}, one dict per
    window step holding only the keys read there. `lookup(step, key)` returns the recorded
    value of `key` at a non-negative step (negative steps are read at step 0)."""
    return {
        "observations": [
            {key: lookup(window.source_step(s), key) for key in window.keys_at[s]}
            for s in window.steps
        ],
        "steps": list(window.steps),
    }
