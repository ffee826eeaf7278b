"""Calling a policy the way the worker promises: its contract, its episodes, checked calls.

The policy API (what `robotd serve MODULE:CLASS` loads)::

    from robotd.contract import Observations, Stream, Actions

    class MyPolicy:
        # optional: what it reads (docs/contract.md); undeclared = the act's own observation alone
        observations = Observations(streams={"top": Stream(at=[-15, 0]), "joints.pos": Stream()})
        # optional: how its answer is shaped and played (docs/contract.md)
        actions = Actions(hz=30, open_loop_horizon=8)

        def reset(self): ...                        # optional: before an episode's first act
        def infer(self, inputs, *, episode=None, rtc=None, temperature: float = 1.0):  # required
            ...
        def on_episode_end(self): ...               # optional: after the episode ended

- The class is built once per copy with the `--arg KEY=VALUE` pairs as keyword arguments; a
  string value is converted to int / float / bool when the constructor's annotation says so.
- `infer` is handed, without declared observations, the act's own observation (a dict of
  key -> value); with them, `{"observations": [dict, ...], "steps": [int, ...]}` (ascending,
  the act's own step last; each dict holds only the keys read at that step). Arrays in the
  inputs are read-only (copy before modifying).
- `episode`, if infer (or reset, or on_episode_end) takes it, is the episode's
  robotd.worker.episode.Episode: its id (it is also that string), `steps` (acts answered),
  a `state` dict the policy owns for the episode, and its `params`.
- `rtc` (real-time chunking) is passed to a policy whose infer names an `rtc` keyword, or
  that declares `Actions(rtc=True)`, with every act that carries it (realtime timing):
  `{"delay": d, "prefix": (p x D), "rest": (r x D)}`, the rows that will play at steps
  t … t+p−1 while it computes (p <= d; the robot plays them whatever it answers) and the
  queued rows after them, at its own `actions.hz`. `Actions(rtc=False)` opts out; hello
  says `actions.rtc = true` for a policy that takes it.
- Keyword arguments of infer with defaults (other than `episode`, `rtc`) are inference parameters
  (robotd.worker.params): listed in hello, set by a `params` request, in effect from the next
  episode on. infer is called with the values set for its episode.
- `infer` returns an (H, D) array of floats or a list of rows of numbers (row i meant for
  step t + i), or, when `actions.key` is declared, a mapping holding it under that key.
  H, D >= 1, finite values; bool and integer arrays are refused (no joint targets), and so is
  an answer over what any robot plays (robotd.contract.answers: 4096 rows, 64 columns),
  before it leaves the worker.
- Calls come from one thread, one at a time: the policy needs no locking.
"""

from __future__ import annotations

import logging
import traceback
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from robotd.contract import Actions, Observations
from robotd.contract.answers import dtype_problem, size_problem
from robotd.finite import all_finite
from robotd.wire import wire_name
from robotd.worker.episode import Episode
from robotd.worker.params import Param, declared_params
from robotd.worker.policy_load import (
    PolicyLoadError,
    accepts_keyword,
    coerce_kwargs,
    declared_attr,
    load_class,
    names_keyword,
)

log = logging.getLogger("robotd.worker")

ENDED_KEPT = 4096  # ended episode ids remembered, so a late act for one is refused
MAX_ERROR_TEXT = 2000  # characters of an exception's text said in a policy_error reply

__all__ = ["BadActions", "PolicyCallError", "PolicyHost", "PolicyLoadError", "check_actions"]


class PolicyCallError(Exception):
    """A call into the policy failed or was refused; `code` is the error reply's code
    (policy_error, bad_actions, bad_frame, episode_ended) and the message says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class BadActions(PolicyCallError):
    """infer's answer is not an (H, D) array of finite numbers; the message names why."""

    def __init__(self, message: str) -> None:
        super().__init__("bad_actions", message)


class PolicyHost:
    """One policy instance, its declared contract and parameters, its episode, and checked
    calls into it.

    Episodes: `begin(episode)` before each act makes a new episode id current: the current
    one (if not ended) ends first, then a fresh Episode is made and reset() called;
    `end_episode` calls on_episode_end() for the current one. Ended ids (the last 4096) are
    refused by `begin` (episode_ended). Exceptions from the policy become
    PolicyCallError("policy_error") naming the call; MemoryError passes through untouched
    (the caller decides whether the copy survives it).
    """

    def __init__(self, spec: str, kwargs: Mapping[str, Any] | None = None) -> None:
        cls = load_class(spec)
        args = coerce_kwargs(cls, dict(kwargs or {}), spec)
        try:
            policy = cls(**args)
        except MemoryError:
            raise
        except Exception as err:
            raise PolicyLoadError(
                f"policy {spec!r}: constructor failed: {type(err).__name__}: {err}"
            ) from err
        self._adopt(policy, spec)

    @classmethod
    def wrap(cls, policy: Any, name: str | None = None) -> PolicyHost:
        """Host an already built policy (in-process use: the virtual-clock runner)."""
        host = cls.__new__(cls)
        host._adopt(policy, name or type(policy).__name__)
        return host

    def _adopt(self, policy: Any, spec: str) -> None:
        self.spec = spec
        self.policy = policy
        self.observations = declared_attr(self.policy, "observations", Observations, spec)
        self.actions = declared_attr(self.policy, "actions", Actions, spec)
        infer = getattr(self.policy, "infer", None)
        if not callable(infer):
            raise PolicyLoadError(f"policy {spec!r}: has no infer(inputs) method")
        self._infer = infer
        self._pass_episode = accepts_keyword(infer, "episode")
        declared = self.actions.rtc if self.actions is not None else None
        self.takes_rtc = names_keyword(infer, "rtc") if declared is None else declared
        if self.takes_rtc and not accepts_keyword(infer, "rtc"):
            raise PolicyLoadError(
                f"policy {spec!r}: declares Actions(rtc=True) but infer takes no rtc= keyword"
            )
        self.params: dict[str, Param] = {}
        self.params, warnings = declared_params(infer)
        for warning in warnings:
            log.warning("policy %s: %s", spec, warning)
        self.next_params: dict[str, Any] = {}  # for episodes begun without params given
        self.episode: Episode | None = None
        self._ended: OrderedDict[str, None] = OrderedDict()

    @property
    def current(self) -> str | None:
        """The current episode's id, or None between episodes."""
        return self.episode.id if self.episode is not None else None

    def begin(
        self, episode: str, params: Mapping[str, Any] | None = None, task: str = ""
    ) -> Episode:
        """Make `episode` current before an act: on a new id, a fresh Episode with `params`
        (default: `next_params`) and reset(); an ended id is refused. Parameters never
        change for an episode already current."""
        if episode in self._ended:
            raise PolicyCallError(
                "episode_ended",
                f"field 'episode': episode {episode!r} has ended; start a new episode id",
            )
        if self.episode is not None and episode == self.episode.id:
            return self.episode
        if self.episode is not None:  # an episode left without end_episode ends now
            previous = self.episode.id
            try:
                self._end_current()
            except PolicyCallError as err:
                log.warning("episode %s: %s", previous, err)
        fresh = Episode(episode, self.next_params if params is None else params, task)
        self._hook("reset", fresh)  # raises on failure: the next act for this id tries again
        self.episode = fresh
        return fresh

    def end_episode(self, episode: str) -> None:
        """End `episode`: on_episode_end() if current; an unknown id is remembered as ended."""
        if episode == self.current:
            self._end_current()
        else:
            self._remember(episode)

    def _end_current(self) -> None:
        ended, self.episode = self.episode, None
        assert ended is not None
        self._remember(ended.id)
        self._hook("on_episode_end", ended)

    def _remember(self, episode: str) -> None:
        self._ended[episode] = None
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _hook(self, name: str, episode: Episode) -> None:
        hook = getattr(self.policy, name, None)
        if not callable(hook):
            return
        if accepts_keyword(hook, "episode"):
            _call(f"{name}()", hook, episode=episode)
        else:
            _call(f"{name}()", hook)

    def inputs(self, steps: list[int], observations: list[dict[str, Any]]) -> Any:
        """What infer is handed for an act (see the module docstring)."""
        if self.observations is None:
            return observations[-1]
        return {"observations": observations, "steps": steps}

    def actions_wire(self) -> dict[str, Any] | None:
        """The action contract hello declares: as declared, with `rtc` true when the policy
        takes the frozen prefix (the robot then keeps those rows whatever it answers)."""
        if not self.takes_rtc:
            return self.actions.to_wire() if self.actions is not None else None
        return {**(self.actions.to_wire() if self.actions is not None else {}), "rtc": True}

    def infer(self, inputs: Any, episode: str, rtc: dict[str, Any] | None = None) -> np.ndarray:
        """Run infer for the current episode `episode` (begun) with its parameters and return
        its rows as an (H, D) array in the policy's own dtype; BadActions if malformed.
        `rtc` reaches a policy that takes it (see the module docstring), no other."""
        ep = self.episode if self.episode is not None and self.episode.id == episode else None
        if ep is None:  # not begun: an in-process caller that skipped begin()
            ep = self.begin(episode)
        kwargs: dict[str, Any] = dict(ep.params)
        if self._pass_episode:
            kwargs["episode"] = ep
        if rtc is not None and self.takes_rtc:
            kwargs["rtc"] = rtc
        answer = _call("infer()", self._infer, inputs, **kwargs)
        rows = check_actions(answer, self.actions)
        ep.steps += 1
        return rows


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a policy call; its exceptions become policy_error naming the call."""
    try:
        return fn(*args, **kwargs)
    except MemoryError:
        raise
    except Exception as err:
        log.error("policy %s raised:\n%s", what, traceback.format_exc())
        text = str(err)
        if len(text) > MAX_ERROR_TEXT:  # it goes to the daemon, whose replies are bounded
            text = f"{text[:MAX_ERROR_TEXT]}... ({len(text)} characters)"
        message = f"{what} raised {type(err).__name__}: {text}"
        raise PolicyCallError("policy_error", message) from err


def check_actions(answer: Any, actions: Actions | None) -> np.ndarray:
    """infer's answer -> (H, D) array, or BadActions naming what is wrong (the rules of
    robotd.contract.answers). The rows keep the policy's float dtype (float32 travels as
    float32; the daemon converts once, robot-side); a list's rows and a float the wire does
    not carry (float128) become float64."""
    key = actions.key if actions is not None else None
    if type(answer) is np.ndarray and key is None:  # the usual answer: no Mapping check
        return _checked_rows(answer, "answer")
    if answer is None:
        want = f"a mapping holding the rows at actions.key={key!r}" if key else "(H, D) rows"
        raise BadActions(f"infer() returned None; it must return {want}")
    if key is not None:
        if not isinstance(answer, Mapping):
            raise BadActions(
                f"infer returned {type(answer).__name__}; actions.key={key!r} "
                "is declared, so it must return a mapping holding the rows there"
            )
        if key not in answer:
            raise BadActions(
                f"infer's answer has no field {key!r} (actions.key); "
                f"fields: {[k[:64] for k in sorted(map(str, answer))[:10]]}"
            )
        answer, where = answer[key], f"answer[{key!r}]"
    elif isinstance(answer, Mapping):
        raise BadActions(
            "infer returned a mapping but actions.key is not declared; return "
            "the (H, D) rows, or declare Actions(key=...)"
        )
    else:
        where = "answer"
    if answer is None or isinstance(answer, str | bytes):
        said = "infer() returned" if where == "answer" else f"{where} is"
        raise BadActions(f"{said} {_kind(answer)}, not (H, D) rows of numbers")
    try:
        rows = np.asarray(answer)
    except (ValueError, TypeError) as err:
        raise BadActions(f"{where}: not an array of rows ({err})") from None
    return _checked_rows(rows, where, listed=isinstance(answer, list | tuple))


def _checked_rows(rows: np.ndarray, where: str, listed: bool = False) -> np.ndarray:
    """`rows` checked (floats, H x D, within what any robot plays, finite) and copied in their
    own dtype. `listed`: they came as a list of rows, which has no dtype of its own, so its
    integer numbers are read as floats (bools still are no joint targets)."""
    as_floats = listed and rows.dtype.kind in "iu"
    problem = None if as_floats else dtype_problem(rows.dtype)
    if problem is not None:
        raise BadActions(f"{where}: {problem}")
    if rows.ndim != 2:
        raise BadActions(f"{where}: shape {rows.shape} is not 2-D (H rows x D values)")
    if rows.shape[0] < 1 or rows.shape[1] < 1:
        raise BadActions(f"{where}: shape {rows.shape} is empty (need H >= 1, D >= 1)")
    # Before any copy: a runaway answer is refused here, never carried to the daemon (which
    # would have to take in all of it to refuse it, the robot holding meanwhile).
    problem = size_problem(rows.shape, 8 if as_floats else rows.dtype.itemsize)
    if problem is not None:
        raise BadActions(f"{where}: {problem}")
    # A copy (the policy may reuse its buffer while the answer travels), in its own dtype.
    # (wire_name, not dtype.name: numpy computes that name in Python, ~4 µs an act)
    keep = not as_floats and wire_name(rows.dtype) is not None
    rows = rows.copy() if keep else rows.astype(np.float64)
    if not all_finite(rows):
        i, j = (int(k) for k in np.argwhere(~np.isfinite(rows))[0])
        raise BadActions(f"{where}: row {i} column {j} is {rows[i, j]} (must be finite)")
    return rows


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    return f"a {type(value).__name__} ({value!r:.40})"
