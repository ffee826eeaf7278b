"""Loading a policy class by name and calling it the way the worker promises.

The policy API (what `robotd serve MODULE:CLASS` loads)::

    from robotd.contract import Observations, Stream, Actions

    class MyPolicy:
        # optional: what it reads (SPEC §2); undeclared = the act's own observation alone
        observations = Observations(streams={"top": Stream(at=[-15, 0]), "joints.pos": Stream()})
        # optional: how its answer is shaped (SPEC §3)
        actions = Actions(hz=30, open_loop_horizon=8)

        def reset(self): ...                        # optional: before an episode's first act
        def infer(self, inputs, *, episode=None):   # required
            ...
        def on_episode_end(self): ...               # optional: after the episode ended

- The class is built once with the `--arg KEY=VALUE` pairs as keyword arguments; a string
  value is converted to int / float / bool when the constructor's annotation says so.
- `infer` is handed, without declared observations, the act's own observation (a dict of
  key -> value); with them, `{"observations": [dict, ...], "steps": [int, ...]}` (ascending,
  the act's own step last; each dict holds only the keys read at that step). Arrays in the
  inputs are read-only (copy before modifying). `episode` (the episode id) is passed only if
  infer accepts it.
- `infer` returns an (H, D) array or list of rows (row i meant for step t + i), or, when
  `actions.key` is declared, a mapping holding it under that key. H, D >= 1, finite numbers.
- Calls come from one thread, one at a time: the policy needs no locking.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import queue
import threading
import traceback
import typing
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from robotd.contract import Actions, Observations
from robotd.frames import FrameError, decode
from robotd.worker.store import DecodeBudget, Frame

log = logging.getLogger("robotd.worker")

ENDED_KEPT = 4096  # ended episode ids remembered, so a late act for one is refused
MAX_AHEAD = 256  # frames waiting to be decoded ahead; beyond it the policy thread decodes


class PolicyLoadError(ValueError):
    """The policy named on the command line cannot be loaded or built."""


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
    """One policy instance, its declared contract, its episode, and checked calls into it.

    Episodes: `begin(episode)` before each act calls reset() on a new episode id (ending
    the current one first if it was not ended); `end_episode` calls on_episode_end() for
    the current one. Ended ids (the last 4096) are refused by `begin` (episode_ended).
    Exceptions from the policy become PolicyCallError("policy_error") naming the call.
    """

    def __init__(self, spec: str, kwargs: Mapping[str, Any] | None = None) -> None:
        cls = load_class(spec)
        args = coerce_kwargs(cls, dict(kwargs or {}), spec)
        try:
            policy = cls(**args)
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
        self.observations = _declared(self.policy, "observations", Observations, spec)
        self.actions = _declared(self.policy, "actions", Actions, spec)
        infer = getattr(self.policy, "infer", None)
        if not callable(infer):
            raise PolicyLoadError(f"policy {spec!r}: has no infer(inputs) method")
        self._infer = infer
        self._pass_episode = _accepts_keyword(infer, "episode")
        streams = self.observations.streams if self.observations is not None else {}
        # How uploaded frames are handed over, per key (SPEC §2: HWC uint8 or CHW float32).
        self.layouts = {k: s.camera.layout for k, s in streams.items() if s.camera is not None}
        self.current: str | None = None
        self._ended: OrderedDict[str, None] = OrderedDict()

    def begin(self, episode: str) -> None:
        """Make `episode` current before an act: reset() on a new id, refuse an ended one."""
        if episode in self._ended:
            raise PolicyCallError(
                "episode_ended",
                f"field 'episode': episode {episode!r} has ended; start a new episode id",
            )
        if episode == self.current:
            return
        if self.current is not None:  # an episode left without end_episode ends now
            previous = self.current
            try:
                self._end_current()
            except PolicyCallError as err:
                log.warning("episode %s: %s", previous, err)
        self._hook("reset")  # raises on failure: the next act for this id tries again
        self.current = episode

    def end_episode(self, episode: str) -> None:
        """End `episode`: on_episode_end() if current; an unknown id is remembered as ended."""
        if episode == self.current:
            self._end_current()
        else:
            self._remember(episode)

    def _end_current(self) -> None:
        episode, self.current = self.current, None
        assert episode is not None
        self._remember(episode)
        self._hook("on_episode_end")

    def _remember(self, episode: str) -> None:
        self._ended[episode] = None
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _hook(self, name: str) -> None:
        hook = getattr(self.policy, name, None)
        if callable(hook):
            _call(f"{name}()", hook)

    def decode_frames(
        self, steps: list[int], observations: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The observations with every uploaded frame (robotd.worker.store.Frame) decoded to
        its key's layout; a bad frame is PolicyCallError("bad_frame") naming step and key."""
        out = []
        for step, obs in zip(steps, observations):
            if any(isinstance(v, Frame) for v in obs.values()):
                obs = {
                    k: self._decode(step, k, v) if isinstance(v, Frame) else v
                    for k, v in obs.items()
                }
            out.append(obs)
        return out

    def _decode(self, step: int, key: str, frame: Frame) -> np.ndarray:
        layout = self.layouts.get(key, "hwc_uint8")
        try:
            return frame.value(lambda msg: decode(msg, layout, name=key))
        except FrameError as err:
            raise PolicyCallError("bad_frame", f"step {step} key {key!r}: {err}") from None

    def inputs(self, steps: list[int], observations: list[dict[str, Any]]) -> Any:
        """What infer is handed for an act (see the module docstring)."""
        if self.observations is None:
            return observations[-1]
        return {"observations": observations, "steps": steps}

    def infer(self, inputs: Any, episode: str) -> np.ndarray:
        """Run infer and return its rows as a float64 (H, D) array; BadActions if malformed."""
        if self._pass_episode:
            answer = _call("infer()", self._infer, inputs, episode=episode)
        else:
            answer = _call("infer()", self._infer, inputs)
        return check_actions(answer, self.actions)


class Decoder:
    """Decodes uploaded frames ahead of the acts that read them, on a thread of its own, so
    that what an act reads is decoded when it is handed to the policy (Frame.ahead).
    Bounded by the budget's bytes and a queue of MAX_AHEAD frames: a frame left out is
    decoded by the policy thread when read, as are frames that fail to decode (the error is
    the act's). `submit` is called from the worker's poll loop and never blocks."""

    def __init__(self, host: PolicyHost, budget: DecodeBudget) -> None:
        self.layouts = dict(host.layouts)
        self.budget = budget
        self._queue: queue.Queue[tuple[str, Frame] | None] = queue.Queue(MAX_AHEAD)
        self._thread = threading.Thread(target=self._run, name="robotd-decode", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, key: str, frame: Frame) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((key, frame))

    def stop(self) -> None:
        """Drop what waits and end the thread (call from the thread that submits)."""
        if not self._thread.is_alive():
            return
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            key, frame = item
            layout = self.layouts.get(key, "hwc_uint8")
            frame.ahead(
                lambda msg, k=key, lay=layout: decode(msg, lay, name=k),
                self.budget,
                decoded_size(frame.msg, layout),
            )


def decoded_size(msg: Any, layout: str) -> int:
    """Bytes a frame message decodes to, from its declared shape (0 if it has none: then it
    does not decode either)."""
    shape = msg.get("shape") if isinstance(msg, dict) else None
    if not isinstance(shape, list | tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        return 0
    return int(np.prod(shape, dtype=np.int64)) * (4 if layout == "chw_float" else 1)


def _call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a policy call; its exceptions become policy_error naming the call."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:
        log.error("policy %s raised:\n%s", what, traceback.format_exc())
        raise PolicyCallError("policy_error", f"{what} raised {type(err).__name__}: {err}") from err


def load_class(spec: str) -> type:
    """Import MODULE:CLASS (CLASS may be dotted, e.g. pkg.mod:Outer.Inner)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyLoadError(
            f"policy {spec!r}: expected MODULE:CLASS, e.g. robotd.demo:DotFollower"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise PolicyLoadError(
            f"policy {spec!r}: cannot import module {module_name!r}: {err}"
        ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PolicyLoadError(f"policy {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise PolicyLoadError(f"policy {spec!r}: {attr!r} is not a class")
    return obj


def coerce_kwargs(cls: type, kwargs: dict[str, Any], spec: str) -> dict[str, Any]:
    """Convert str values to the int/float/bool the constructor's annotations name.

    Unknown names are refused unless the constructor takes **kwargs.
    """
    params = inspect.signature(cls).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: leave the values as given
        hints = {}
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name not in params and not open_ended:
            known = ", ".join(n for n in params if n != "self") or "none"
            raise PolicyLoadError(f"policy {spec!r}: unknown argument {name!r} (takes: {known})")
        out[name] = _coerce(value, hints.get(name), f"policy {spec!r}: argument {name!r}")
    return out


def _coerce(value: Any, hint: Any, where: str) -> Any:
    if not isinstance(value, str) or hint not in (int, float, bool):
        return value
    if hint is bool:
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise PolicyLoadError(f"{where}: {value!r} is not a boolean (true/false)")
    try:
        return hint(value)
    except ValueError:
        raise PolicyLoadError(f"{where}: {value!r} is not {hint.__name__}") from None


def _declared(policy: Any, name: str, kind: type, spec: str) -> Any:
    value = getattr(policy, name, None)
    if value is None or isinstance(value, kind):
        return value
    raise PolicyLoadError(
        f"policy {spec!r}: attribute {name!r} must be a "
        f"robotd.contract.{kind.__name__} or None, got {type(value).__name__}"
    )


def _accepts_keyword(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_actions(answer: Any, actions: Actions | None) -> np.ndarray:
    """infer's answer -> float64 (H, D) array, or BadActions naming what is wrong."""
    key = actions.key if actions is not None else None
    if key is not None:
        if not isinstance(answer, Mapping):
            raise BadActions(
                f"infer returned {type(answer).__name__}; actions.key={key!r} "
                "is declared, so it must return a mapping holding the rows there"
            )
        if key not in answer:
            raise BadActions(
                f"infer's answer has no field {key!r} (actions.key); "
                f"fields: {sorted(map(str, answer))[:10]}"
            )
        answer, where = answer[key], f"answer[{key!r}]"
    elif isinstance(answer, Mapping):
        raise BadActions(
            "infer returned a mapping but actions.key is not declared; return "
            "the (H, D) rows, or declare Actions(key=...)"
        )
    else:
        where = "answer"
    try:
        rows = np.asarray(answer)
    except (ValueError, TypeError) as err:
        raise BadActions(f"{where}: not an array of rows ({err})") from None
    if rows.dtype.kind not in "biuf":
        raise BadActions(f"{where}: dtype {rows.dtype} is not numeric")
    if rows.ndim != 2:
        raise BadActions(f"{where}: shape {rows.shape} is not 2-D (H rows x D values)")
    if rows.shape[0] < 1 or rows.shape[1] < 1:
        raise BadActions(f"{where}: shape {rows.shape} is empty (need H >= 1, D >= 1)")
    rows = rows.astype(np.float64)
    bad = ~np.isfinite(rows)
    if bad.any():
        i, j = (int(k) for k in np.argwhere(bad)[0])
        raise BadActions(f"{where}: row {i} column {j} is {rows[i, j]} (must be finite)")
    return rows
