"""The policy's view of one worker-side episode: what `infer(inputs, *, episode)` is handed."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class Episode(str):
    """One episode as the policy sees it. It is also its id string (a str subclass), so a
    policy written when infer was handed the id keeps working.

    - `id`: the worker-side episode id (the daemon makes a new one after a reset).
    - `steps`: acts of this episode answered so far (0 during its first act): counted when
      an answer is accepted, so an act whose infer raised or whose answer was refused is
      not; control steps are not counted (one act answers a chunk of them).
    - `state`: a dict the policy owns: kept across the episode's acts, fresh for the next
      episode (and for an episode restarted in a new copy after its copy was lost).
    - `params`: the inference parameters in effect for this episode (read-only; a `params`
      request changes them from the next episode on, never during one).
    - `task`: the episode's task text, as the operator gave it (`robotctl start --task`),
      "" when none was given.
    """

    state: dict[str, Any]
    steps: int
    params: Mapping[str, Any]
    task: str

    def __new__(
        cls, episode_id: str, params: Mapping[str, Any] | None = None, task: str = ""
    ) -> Episode:
        self = super().__new__(cls, episode_id)
        self.state = {}
        self.steps = 0
        self.params = MappingProxyType(dict(params or {}))
        self.task = task
        return self

    @property
    def id(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Episode({self.id!r}, steps={self.steps})"
