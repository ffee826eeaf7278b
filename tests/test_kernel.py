"""The control kernel: episode states, asks, merges, holds, faults — driven tick by tick."""

from __future__ import annotations

import time

import numpy as np
import pytest

from drivers.base import JointState
from robotd.config import load_config
from robotd.control.episode import CommandRefused
from robotd.control.kernel import Kernel
from robotd.control.playback import Chunk
from tests.lane_util import plain

DT_NS = 33_333_333


class Rig:
    """A kernel with a recorder for what it emits and a clock in ticks."""

    def __init__(self, *overrides: str) -> None:
        # sync timing unless a test says otherwise (config/sim.toml runs realtime)
        self.cfg = load_config(None, ['control.timing="sync"', *overrides])
        self.out: list[dict] = []
        self.k = Kernel(self.cfg, run_id="t", emit=lambda m: self.out.append(plain(m)))
        self.t = 0
        self.pos = np.array([0.1, 0.2, 0.0])

    def tick(self, *, frames_age_ns: int = 0, joints: bool = True):
        self.t += DT_NS
        js = JointState(self.pos.copy(), np.zeros(3), np.zeros(3), self.t) if joints else None
        frames = {n: (self.t // DT_NS, self.t - frames_age_ns) for n in self.cfg.cameras}
        return self.k.update(self.t, js, frames)

    def asks(self) -> list[dict]:
        return [m for m in self.out if m["k"] == "ask"]

    def events(self, name: str) -> list[dict]:
        return [m for m in self.out if m["k"] == "event" and m["name"] == name]


def started(*overrides: str) -> Rig:
    rig = Rig(*overrides)
    rig.k.set_contract(4)  # the policy link is up: the sim config's first episode starts
    return rig


def test_sim_episode_starts_only_once_the_policy_link_is_up():
    rig = Rig()
    rig.tick()
    assert rig.k.machine.state == "IDLE" and not rig.asks()
    rig.k.set_contract(4)
    assert rig.k.machine.state == "RUNNING"


def test_sim_episode_waits_for_a_ready_contract_and_an_estop_taken_meanwhile_holds():
    """An openpi server's warm-up: the contract comes first not ready, then ready."""
    rig = Rig()
    rig.k.set_contract(4, ready=False)
    rig.tick()
    assert rig.k.machine.state == "IDLE" and not rig.asks()
    rig.k.set_contract(4, ready=True)
    assert rig.k.machine.state == "RUNNING"
    rig.k.set_contract(4, ready=True)  # a later contract (a worker back) starts nothing new
    assert rig.k.machine.episode == 1
    latched = Rig()
    latched.k.set_contract(4, ready=False)
    latched.k.command("estop", "before the warm-up ended")
    latched.k.set_contract(4, ready=True)
    assert latched.k.machine.state == "FAULT"


def test_sync_asks_when_empty_holds_while_waiting_and_plays_at_most_horizon():
    rig = started()
    rig.tick()
    (ask,) = rig.asks()
    assert ask["s"] == 0
    rig.tick()  # waiting: hold
    assert rig.k.counters.holds == 2
    rows = np.linspace(0.1, 0.4, 24).reshape(8, 3)
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], rows))
    played = [rig.tick() for _ in range(4)]
    assert np.allclose(played[0], rows[0]) and np.allclose(played[3], rows[3])
    assert len(rig.asks()) == 1
    rig.tick()  # the queue ran dry after open_loop_horizon=4 rows: ask again, hold meanwhile
    assert len(rig.asks()) == 2 and rig.asks()[1]["s"] == 6


def test_stale_camera_means_no_ask():
    rig = started()
    rig.tick(frames_age_ns=10**9)
    assert not rig.asks()
    assert rig.k.counters.invalid_observations == 1
    cams = tuple(rig.cfg.cameras)
    assert cams and rig.k.status().stale_cameras == cams  # status says why it holds
    rig.tick()
    assert len(rig.asks()) == 1
    assert rig.k.status().stale_cameras == ()
    rig.tick(frames_age_ns=10**9)
    rig.k.command("stop")
    assert rig.k.status().stale_cameras == ()  # said only while an episode runs


def test_answer_to_an_old_ask_is_discarded():
    rig = started()
    rig.tick()
    ask = rig.asks()[0]
    rig.k.episode_lost("worker crashed")
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], np.zeros((4, 3))))
    rig.tick()
    assert rig.k.counters.late_chunks == 1
    assert rig.k.counters.episode_resets == 1
    assert rig.k.step == 1  # the new worker-side episode counts from 0 at the reset


def test_a_new_worker_episode_asks_at_once_whatever_the_old_episode_failed():
    rig = started()
    rig.tick()
    (ask,) = rig.asks()
    rig.k.act_failed(ask["id"], "act failed: TimeoutError")
    rig.tick()
    assert len(rig.asks()) == 1  # backing off after the failure
    rig.k.episode_lost("worker crashed")
    rig.tick()
    assert len(rig.asks()) == 2 and rig.asks()[1]["wep"] != ask["wep"]


def test_watchdog_ends_the_episode_at_exactly_max_hold_steps():
    rig = started("control.max_hold_steps=5")
    for _ in range(4):
        rig.tick()
    assert rig.k.machine.state == "RUNNING"
    rig.tick()
    assert rig.k.machine.state == "ENDED"
    (end,) = rig.events("episode_end")
    assert end["outcome"] == "starved"
    assert rig.k.counters.starved_episodes == 1
    target = rig.tick()
    assert target is not None and rig.k.machine.state == "RESETTING"  # still holding
    with pytest.raises(CommandRefused, match=r"state is RESETTING \(reset_done once"):
        rig.k.command("start")  # the refusal says what the operator is to do


def test_latched_start_needs_clear_fault_and_never_moves_straight_on():
    cfg_over = ('robot.start="latched"',)
    rig = Rig(*cfg_over)
    rig.tick()
    assert rig.k.machine.state == "FAULT"
    with pytest.raises(CommandRefused, match=r"start needs IDLE.*\(clear_fault to leave it\)"):
        rig.k.command("start")
    rig.k.command("clear_fault")
    assert rig.k.machine.state == "IDLE"
    rig.k.command("start")
    assert rig.k.machine.state == "RUNNING"


def test_estop_category_1_holds_then_turns_torque_off_and_clear_reanchors():
    rig = started()
    rig.tick()
    rig.k.command("estop", "test")
    assert rig.k.machine.state == "FAULT"
    assert rig.tick() is not None  # controlled stop: still holding
    for _ in range(20):
        rig.tick()
    assert not rig.k.torque_on and rig.tick() is None
    rig.pos = np.array([0.5, -0.3, 0.2])  # the arm sagged while torque was off
    rig.k.command("clear_fault")
    target = rig.tick()
    assert np.allclose(target, rig.pos)  # holds where it is, no jump back


def test_a_category_1_stop_says_how_long_before_torque_goes_off():
    rig = started()
    rig.tick()
    assert rig.k.status().stopping_s is None  # no stop under way
    st = rig.k.command("estop", "test")
    assert st.torque and st.stopping_s == pytest.approx(15 * rig.k.dt, abs=1e-3)  # 0.5 s
    said = [st.stopping_s]
    while rig.k.torque_on:
        rig.tick()
        said.append(rig.k.status().stopping_s)
    assert said[-1] is None and not rig.k.status().torque
    counting = said[:-1]
    assert counting == sorted(counting, reverse=True) and len(counting) == round(0.5 / rig.k.dt)
    rig.k.command("estop", "again")  # torque already off: nothing to count down
    assert rig.k.status().stopping_s is None


def test_estop_category_0_is_torque_off_at_once():
    rig = started("safety.estop_category=0")
    rig.tick()
    rig.k.command("estop")
    assert rig.tick() is None


@pytest.mark.parametrize("cmd", ["clear_fault", "start", "reset_done"])
def test_a_command_taken_before_the_latest_estop_is_refused_as_superseded(cmd: str):
    rig = started("safety.estop_category=0")
    rig.tick()
    first, between, second = (time.monotonic_ns() for _ in range(3))  # CLOCK_MONOTONIC
    rig.k.command("estop", "first", sent_ns=first)
    rig.k.command("estop", "second", sent_ns=second)
    with pytest.raises(CommandRefused) as refused:
        rig.k.command(cmd, sent_ns=between)  # taken between them: before the latest
    assert refused.value.code == "superseded" and "before the e-stop" in str(refused.value)
    assert rig.k.status().state == "FAULT"


def test_commands_taken_after_an_estop_or_unstamped_are_carried_out():
    rig = started("safety.estop_category=0")
    rig.tick()
    rig.k.command("estop", "", sent_ns=time.monotonic_ns())
    rig.k.command("estop", "the lane's own, unstamped")  # 0 never moves the mark back
    assert rig.k.command("clear_fault", sent_ns=time.monotonic_ns()).state == "IDLE"
    rig.k.command("estop", "", sent_ns=time.monotonic_ns())
    assert rig.k.command("clear_fault").state == "IDLE"  # unstamped: a test's or replay's


def test_a_clear_fault_taken_before_a_fault_of_the_lanes_own_does_not_clear_it():
    rig = started("safety.driver_fault_run=3")
    rig.tick()
    taken = time.monotonic_ns()  # an operator's clear_fault, queued while the bus fails
    for _ in range(3):
        rig.tick(joints=False)
    rig.tick()  # the bus reads again: the cause is gone, the latch stays
    assert rig.k.machine.state == "FAULT" and rig.k.machine.fault.cause == "driver"
    with pytest.raises(CommandRefused) as refused:
        rig.k.command("clear_fault", sent_ns=taken)
    assert refused.value.code == "superseded"
    assert rig.k.command("clear_fault", sent_ns=time.monotonic_ns()).state == "IDLE"


def test_driver_failures_latch_fault_and_recovery_allows_clear():
    rig = started("safety.driver_fault_run=3")
    rig.tick()
    for _ in range(3):
        rig.tick(joints=False)
    assert rig.k.machine.state == "FAULT" and rig.k.machine.fault.cause == "driver"
    with pytest.raises(CommandRefused, match="driver still present"):
        rig.k.command("clear_fault")
    rig.tick()  # a good read: the cause is gone
    rig.k.command("clear_fault")
    assert rig.k.machine.state == "IDLE"


def test_rejected_rows_hold_and_a_run_latches_safety_fault():
    rig = started("safety.reject_run=2")
    rig.tick()
    ask = rig.asks()[0]
    bad = np.full((4, 3), 9.0)
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], bad))
    first = rig.tick()
    assert np.allclose(first, rig.pos)  # held at the anchor
    rig.tick()
    assert rig.k.machine.state == "FAULT" and rig.k.machine.fault.cause == "safety"
    # The offending chunk was flushed as the fault latched: its cause is gone, it clears.
    assert len(rig.k.playback.queue) == 0 and not rig.k.machine.fault.active
    assert rig.k.command("clear_fault").state == "IDLE"


def test_max_steps_ends_the_episode_and_reset_done_returns_to_idle():
    rig = started("control.max_steps=3")
    for _ in range(3):
        rig.tick()
    assert rig.k.machine.state == "ENDED"
    rig.tick()
    rig.k.command("reset_done")
    assert rig.k.machine.state == "IDLE"


def test_bad_chunk_shape_is_counted_not_fatal():
    rig = started()
    rig.tick()
    ask = rig.asks()[0]
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], np.zeros((4, 2))))
    rig.tick()
    assert rig.k.counters.bad_chunks == 1
    assert (
        "rows of shape [4, 2]; this robot needs (H >= 1, 3)" in rig.events("bad_chunk")[0]["error"]
    )
    for _ in range(10):
        rig.tick()
    assert len(rig.asks()) == 1  # backs off like a failed act: no ask every tick


def test_delta_mode_moves_arm_by_the_row_and_commands_the_gripper_absolutely():
    rig = started('control.control_mode="delta"')
    rig.tick()
    ask = rig.asks()[0]
    rows = np.array([[0.05, -0.05, 0.1], [0.05, -0.05, 0.05]])
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], rows))
    first = rig.tick()
    assert np.allclose(first, [0.15, 0.15, 0.1])
    second = rig.tick()
    assert np.allclose(second, [0.2, 0.1, 0.05])
    held = rig.tick()  # queue empty: zero motion, gripper keeps its last command
    assert np.allclose(held, second)


def test_starved_episode_reports_the_steps_it_ran():
    rig = started("control.max_hold_steps=4")
    for _ in range(4):
        rig.tick()
    (end,) = rig.events("episode_end")
    assert end["outcome"] == "starved" and end["steps"] == 4


def test_skipped_deadlines_are_steps_and_rows_keep_their_time():
    rig = started('control.timing="realtime"', "control.refill_steps=0")
    rig.tick()
    ask = rig.asks()[0]
    rows = np.array([[0.1 + 0.01 * i, 0.2, 0.0] for i in range(10)])
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], rows))
    rig.tick()  # step 1 plays row 1
    rig.t += 2 * DT_NS
    target = rig.k.update(
        rig.t + DT_NS,
        JointState(rig.pos, np.zeros(3), np.zeros(3), rig.t),
        {n: (1, rig.t) for n in rig.cfg.cameras},
        skipped=2,
    )
    assert rig.k.step == 5 and rig.k.counters.skipped_steps == 2
    assert np.allclose(target, rows[4])  # step 4's row, not step 2's
    steps = [m for m in rig.out if m["k"] == "step"]
    assert [m["s"] for m in steps] == [0, 1, 2, 3, 4]
    assert steps[2]["skipped"] and steps[3]["skipped"] and not steps[4]["skipped"]
    assert steps[2]["pos"] == steps[1]["pos"]  # nothing was read: the last reading stands


def test_a_failed_read_is_a_step_too():
    rig = started('control.timing="realtime"')
    rig.tick()
    rig.tick(joints=False)
    rig.tick()
    assert rig.k.step == 3 and rig.k.counters.skipped_steps == 1


def test_rejection_holds_count_towards_the_watchdog():
    rig = started("safety.reject_run=100", "control.max_hold_steps=5")
    rig.tick()
    ask = rig.asks()[0]
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], np.full((8, 3), 9.0)))
    for _ in range(4):
        rig.tick()
    assert rig.k.counters.max_consecutive_holds == 5
    assert rig.events("episode_end")[0]["outcome"] == "starved"


def test_velocity_mode_holds_with_zero_motion_and_the_gripper_keeps_its_command():
    rig = started('control.control_mode="velocity"')
    rig.tick()
    ask = rig.asks()[0]
    rows = np.array([[0.3, 0.3, 0.1], [0.3, 0.3, 0.05]])  # rad/s; gripper absolute
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], rows))
    first = rig.tick()
    assert np.allclose(first, [0.1 + 0.3 / 30, 0.2 + 0.3 / 30, 0.1])
    second = rig.tick()
    assert np.allclose(rig.tick(), second) and np.allclose(rig.tick(), second)


def test_absolute_mode_holds_the_last_played_target_not_the_start_pose():
    rig = started()
    rig.tick()
    ask = rig.asks()[0]
    rig.k.deliver(Chunk(ask["id"], ask["wep"], ask["s"], np.array([[0.15, 0.25, 0.05]])))
    played = rig.tick()
    assert np.allclose(played, [0.15, 0.25, 0.05])
    assert np.allclose(rig.tick(), played)  # queue empty: the last commanded target
