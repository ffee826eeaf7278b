"""The worker's copies of the policy: which episode each holds, the calls queued for them,
and what happens when one stops (docs/protocol.md, "Copies of the policy").

- An episode is bound to the copy that began it: a new episode id goes to an idle copy
  (reset() there), waits for one that is starting, or, when every copy holds an episode,
  takes the copy used longest ago (whose episode ends, as with a single policy).
- Each copy computes one call at a time; the next goes when it answers. A call unanswered
  within hang_s is a hang. A copy that exits, is killed, reports a MemoryError or hangs is
  lost: every act queued for it is answered `episode_lost` with the cause, its episode is
  remembered as lost (its later acts too are answered so), and a new copy is started.
- The pool keeps `copies` copies running; idle ones are warm spares.

Single-threaded: every method is called from the worker's poll loop.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from robotd import wire
from robotd.repeats import Repeats
from robotd.worker import pipe
from robotd.worker.child import error_done
from robotd.worker.copies import Copies
from robotd.worker.death import Loss
from robotd.worker.decoding import decoded_window
from robotd.worker.params import check_params
from robotd.worker.policy_host import ENDED_KEPT, PolicyCallError
from robotd.worker.runners import InlineRunner
from robotd.worker.slots import CopyOptions, Slot, Task, answer, error

log = logging.getLogger("robotd.worker")

MAX_QUEUED = 64  # calls waiting for copies (or parked for uploads); beyond that: "busy"
REFUSED_EVERY_S = 10.0  # a refused answer of one kind is logged at most once this often
_NUMBERS = re.compile(r"[-+]?\d[\d.e+-]*")  # what varies between answers of one kind

Reply = Callable[[list[bytes], dict[str, Any]], None]
Prepare = Callable[[bytes, int, dict[str, Any], list[dict[str, Any]]], None]
PackNow = Callable[[dict[str, Any], list[dict[str, Any]]], list[Any] | None]
DecodeNow = Callable[[list[int], list[dict[str, Any]]], list[dict[str, Any]]]


class Busy(Exception):
    """MAX_QUEUED calls already wait."""


class Pool:
    """Episodes on the copies of policy `spec` (robotd.worker.copies), each on a channel of
    its own. `reply(route, message)` answers a client;
    `prepare(identity, seq, header, observations)` has an act made ready off the loop (then
    `prepared` is called); `pack_now(header, observations)` packs one at once when it needs
    no decoding (None: it does)."""

    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any],
        options: CopyOptions,
        reply: Reply,
    ) -> None:
        self.options, self.reply = options, reply
        self.copies = Copies(spec, kwargs, options, self)
        self.prepare: Prepare | None = None  # set once the contract is known
        self.pack_now: PackNow | None = None  # an act that needs no decoding, packed at once
        self.decode_now: DecodeNow | None = None  # an inline copy's window, decoded at once
        self.bound: dict[str, Slot] = {}
        self.lost: OrderedDict[str, dict[str, Any]] = OrderedDict()  # episode -> its error
        self.ended: OrderedDict[str, None] = OrderedDict()
        self.waiting: deque[Task] = deque()  # acts of new episodes waiting for a copy
        self.params_next: dict[str, Any] = {}
        self.episode_params: dict[str, dict[str, Any]] = {}
        self.episodes_lost = 0
        self.last_loss: dict[str, Any] | None = None
        self._seqs = itertools.count(1)
        self._refused = Repeats(REFUSED_EVERY_S)

    @property
    def slots(self) -> dict[bytes, Slot]:
        return self.copies.slots

    # ---- what the copies tell (robotd.worker.copies.CopyEvents) ----------------------------

    def copy_ready(self, slot: Slot) -> None:
        self._assign_waiting()

    def copy_lost(self, slot: Slot, loss: Loss, now: float) -> None:
        """Answer every call `slot` held; its episode (and any act's) is lost."""
        if slot.episode is not None and self.bound.get(slot.episode) is slot:
            del self.bound[slot.episode]
        who = f"copy {slot.id} (pid {slot.runner.pid})"
        tasks = [t for t in (slot.current, *slot.fifo) if t is not None]
        episodes = {t.episode for t in tasks if t.kind == "act"}
        if slot.episode is not None:
            episodes.add(slot.episode)
        for episode in sorted(episodes):
            message = f"episode {episode!r} lost: {who} {loss.message}; start a new episode"
            self.lost[episode] = {
                "code": "episode_lost",
                "message": message,
                "cause": loss.kind,
                "copy": slot.id,
                "signal": loss.signal,
                "exit_code": loss.exit_code,
            }
            log.warning("%s", message)
            self.last_loss = {"episode": episode, "cause": loss.kind, "message": message, "at": now}
            self.episode_params.pop(episode, None)
        _trim(self.lost)
        self.episodes_lost += len(episodes)
        for task in tasks:
            if task.kind == "act":
                self.reply(task.route, {"id": task.rid, "ok": False, "error": self._lost(task)})
            else:  # the end of an episode that was over anyway
                self.reply(task.route, {"id": task.rid, "ok": True, "result": {}})

    def no_copy(self, why: str) -> None:
        while self.waiting:
            task = self.waiting.popleft()
            self.reply(task.route, error(task.rid, "no_copy", f"no copy of the policy: {why}"))

    def _lost(self, task: Task) -> dict[str, Any]:
        found = self.lost.get(task.episode)
        if found is not None:
            return found
        return {"code": "episode_lost", "message": f"episode {task.episode!r} lost with its copy"}

    # ---- messages from copies ------------------------------------------------------------

    def on_message(self, slot: Slot, frames: list[Any]) -> None:
        """One message (robotd.worker.pipe's frames) from the copy in `slot`."""
        if self.slots.get(slot.identity) is not slot:
            return  # a copy given up already (its last words)
        try:
            msg = pipe.unpack(frames)
        except wire.WireError as err:
            log.error("copy %d sent a malformed message: %s", slot.id, err)
            return
        kind = msg.get("k") if isinstance(msg, dict) else None
        now = time.monotonic()
        if kind == "done":
            self._done(slot, msg, now)
        elif kind == "lost":
            self.copies.sample(slot, now)
            text = f"{str(msg.get('message'))[:500]}; {slot.runner.memory().text()}"
            self.copies.lose(slot, Loss("out_of_memory", text), now)
        elif isinstance(kind, str):
            self.copies.on_control(slot, kind, msg, now)

    def _done(self, slot: Slot, msg: dict[str, Any], now: float) -> None:
        task = slot.current
        if task is None or msg.get("seq") != task.seq:
            log.error("copy %d answered a call it was not given (%r)", slot.id, msg.get("seq"))
            return
        slot.current, slot.deadline = None, None
        slot.answered += 1
        slot.last_used = now
        reply = answer(task, msg)
        if task.kind == "act" and not reply["ok"] and reply["error"]["code"] == "bad_actions":
            self._say_refused(slot, task, reply["error"]["message"])
        self.reply(task.route, reply)  # its memory is sampled on its schedule
        if task.kind == "end" and slot.episode == task.episode:
            self.bound.pop(task.episode, None)
            slot.episode = None
        self._pump(slot)
        if slot.idle:
            self._assign_waiting()

    def _say_refused(self, slot: Slot, task: Task, why: str) -> None:
        """Log that the policy's answer was refused (the robot is told `bad_actions`): said
        at once, then per kind (the reason, its numbers aside) at most every
        REFUSED_EVERY_S, with the count left unsaid."""
        said = self._refused.say(_NUMBERS.sub("#", why))
        if said is None:
            return
        log.warning(
            "episode %r step %d: the policy's answer was refused (copy %d): %s%s",
            task.episode,
            task.step,
            slot.id,
            why,
            said.tail,
        )

    def prepared(self, identity: bytes, seq: int, ok: bool, frames: list[Any]) -> None:
        """An act made ready by the preparer: send it to its copy, or answer its error."""
        slot = self.slots.get(identity)
        task = slot.current if slot is not None else None
        if slot is None or task is None or task.seq != seq:
            return  # its copy was lost meanwhile (the act is answered already)
        if ok:
            self._send(slot, frames)
            return
        try:
            err = wire.unpackb(frames[0].bytes if hasattr(frames[0], "bytes") else frames[0])
            code, text = str(err["code"]), str(err["message"])
        except (wire.WireError, KeyError, TypeError):
            code, text = "internal", "the act could not be prepared"
        slot.current = None
        self.reply(task.route, error(task.rid, code, text))
        self._pump(slot)
        if slot.idle:
            self._assign_waiting()

    # ---- calls from clients --------------------------------------------------------------

    def queued(self) -> int:
        return len(self.waiting) + sum(len(s.fifo) for s in self.slots.values())

    def submit(self, task: Task) -> None:
        """Queue an act or end for the copy its episode is bound to (answering at once when
        the episode is lost or ended); Busy if MAX_QUEUED calls wait already."""
        episode = task.episode
        if task.kind == "act" and episode in self.lost:
            self.reply(task.route, {"id": task.rid, "ok": False, "error": self.lost[episode]})
            return
        if task.kind == "act" and episode in self.ended:
            text = f"field 'episode': episode {episode!r} has ended; start a new episode id"
            self.reply(task.route, error(task.rid, "episode_ended", text))
            return
        if task.kind == "end":
            self._end(task)
            return
        if self.queued() >= MAX_QUEUED:
            raise Busy
        slot = self.bound.get(episode)
        if slot is None and not any(t.episode == episode for t in self.waiting):
            slot = self._slot_for_new()
            if slot is not None:
                self._bind(episode, slot)
        if slot is not None:
            slot.fifo.append(task)
            self._pump(slot)
        elif not self.slots and self.copies.last_start_error:
            why = f"no copy of the policy: {self.copies.last_start_error}"
            self.reply(task.route, error(task.rid, "no_copy", why))
        else:
            self.waiting.append(task)

    def _end(self, task: Task) -> None:
        episode = task.episode
        slot = self.bound.get(episode)
        if slot is not None and self.queued() >= MAX_QUEUED:
            raise Busy  # before anything changes: the client may end it again
        if episode not in self.lost:
            self.ended[episode] = None
            _trim(self.ended)
        for waiting in [t for t in self.waiting if t.episode == episode]:
            self.waiting.remove(waiting)
            text = f"episode {episode!r} ended while the act at step {waiting.step} waited"
            self.reply(waiting.route, error(waiting.rid, "episode_ended", text))
        if slot is None:  # unknown, lost or ended already: nothing to call
            self.reply(task.route, {"id": task.rid, "ok": True, "result": {}})
            return
        self.episode_params.pop(episode, None)
        slot.fifo.append(task)
        self._pump(slot)

    def _slot_for_new(self) -> Slot | None:
        ready = [s for s in self.slots.values() if s.state == "ready"]
        idle = [s for s in ready if s.idle]
        if idle:
            return idle[0]
        if not ready or len(ready) < len(self.slots) or len(self.slots) < self.copies.wanted:
            return None  # a copy is starting: wait for it rather than take a busy one
        victim = min(ready, key=lambda s: s.last_used)
        if victim.episode is not None:
            old = victim.episode
            self.bound.pop(old, None)
            self.episode_params.pop(old, None)
            self.ended[old] = None
            _trim(self.ended)
            log.info("episode %s ends: its copy %d takes a new episode", old, victim.id)
        return victim

    def _bind(self, episode: str, slot: Slot) -> None:
        slot.episode = episode
        self.bound[episode] = slot
        self.episode_params[episode] = dict(self.params_next)

    def _assign_waiting(self) -> None:
        while self.waiting:
            slot = next((s for s in self.slots.values() if s.idle), None)
            if slot is None:
                return
            episode = self.waiting[0].episode
            self._bind(episode, slot)
            for task in [t for t in self.waiting if t.episode == episode]:
                self.waiting.remove(task)
                slot.fifo.append(task)
            self._pump(slot)

    def _pump(self, slot: Slot) -> None:
        """Hand the copy its next call if it is free."""
        if slot.state != "ready" or slot.current is not None or not slot.fifo:
            return
        task = slot.current = slot.fifo.popleft()
        task.seq = next(self._seqs)
        if task.kind == "end":
            self._send(slot, msg={"k": "end", "seq": task.seq, "episode": task.episode})
            return
        assert self.prepare is not None and task.observations is not None
        header = {
            "k": "act",
            "seq": task.seq,
            "episode": task.episode,
            "step": task.step,
            "steps": task.steps,
            "params": self.episode_params.get(task.episode, {}),
        }
        if task.rtc is not None:
            header["rtc"] = task.rtc
        if task.task:
            header["task"] = task.task
        observations, task.observations = task.observations, None  # sent, or the preparer's
        if isinstance(slot.runner, InlineRunner):
            self._call_inline(slot, header, observations)
            return
        frames = self.pack_now(header, observations) if self.pack_now else None
        if frames is not None:
            self._send(slot, frames)
        else:
            self.prepare(slot.identity, task.seq, header, observations)

    def _send(self, slot: Slot, frames: list[Any] | None = None, msg: Any = None) -> None:
        """The call in `slot.current` to its copy, as frames on its channel; to the copy in
        this loop (InlineRunner), a plain call answered at once."""
        runner = slot.runner
        if not isinstance(runner, InlineRunner):
            self.copies.send(slot, frames if frames is not None else pipe.pack(msg))
            return
        assert slot.current is not None and msg is not None  # (acts go by _call_inline)
        slot.current.sent = time.perf_counter()
        self._done(slot, runner.call(msg), time.monotonic())

    def _call_inline(self, slot: Slot, header: dict[str, Any], observations: Any) -> None:
        """An act to the copy in this loop: its window decoded here (what was not decoded
        ahead), then the call; a frame that does not decode is the act's error."""
        assert self.decode_now is not None
        window = decoded_window(observations)
        if window is None:
            try:
                window = self.decode_now(header["steps"], observations)
            except PolicyCallError as err:
                self._done(slot, error_done(header["seq"], err.code, str(err)), time.monotonic())
                return
        self._send(slot, msg={**header, "observations": window})

    # ---- parameters and what is known of an episode ----------------------------------------

    def set_params(self, given: Any) -> dict[str, Any]:
        """Check and keep parameter values for the episodes that begin from now on
        (ParamError naming the field; nothing is kept then)."""
        values = check_params(self.copies.declared, given)
        self.params_next.update(values)
        return dict(self.params_next)

    def episode_state(self, episode: str) -> dict[str, Any]:
        """What the worker knows of `episode` (for a ping that asks)."""
        out: dict[str, Any] = {"id": episode, "state": "unknown", "cause": None}
        if episode in self.lost:
            out.update(state="lost", cause=self.lost[episode].get("message"))
        elif episode in self.bound:
            out.update(state="running", copy=self.bound[episode].id)
        elif any(t.episode == episode for t in self.waiting):
            out["state"] = "waiting"
        elif episode in self.ended:
            out["state"] = "ended"
        return out


def _trim(table: OrderedDict) -> None:
    while len(table) > ENDED_KEPT:
        table.popitem(last=False)
