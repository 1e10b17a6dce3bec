"""Training through wansync when something fails (docs/training-failures.md), for real: a scheduler,
`wansync agent` processes, trainer processes on the hand-off channel, a BSP job whose rounds are the
trainers' steps (wansync.failcases runs each case; this file checks what happened).

Every trainer's contribution names itself (a count, its step and its incarnation in its own slots,
then (rank + 1) x a pattern), so each sum a trainer printed is checked here, with `==`, against the
sum this test computes from the members it was told: nobody doubled or missing, no contribution of
an old incarnation. Every wait has a generous deadline; nothing asserts on speed."""

from __future__ import annotations

import numpy as np
import pytest

from wansync import failcases
from wansync.failcases import KILL_AT, NODES, VICTIM, judge, run_case

pytestmark = [pytest.mark.loopback, pytest.mark.torch, pytest.mark.timeout(300)]
pytest.importorskip("torch")

DEADLINE_S = 150.0  # each wait of a case: reaching it means what it waits for never came
# the hung-script limit: above the BSP barrier's floor (5 s) for a member that does not ask, so this
# also shows that a node paced by its script is judged by its agent (LEAVE), not lost by the barrier
STALL_S = 8.0


def expected(members: list[int], step: dict[int, int], inc: dict[int, int]) -> np.ndarray:
    """The exact sum of the members' contributions (float64; every value an integer below 2^24)."""
    p = failcases.P - 3 * NODES
    pattern = (np.arange(p) % 7 + 1).astype(np.float64)
    out = np.zeros(3 * NODES + p)
    for r in members:
        out[r] += 1
        out[NODES + r] += step[r] + 1
        out[2 * NODES + r] += inc.get(r, 0) + 1
        out[3 * NODES:] += (r + 1) * pattern
    return out


def assert_exact(line: dict, step: dict[int, int], inc: dict[int, int] | None = None) -> None:
    want = expected(line["members"], step, inc or {})
    got = line["counts"] + line["steps"] + line["incs"]
    assert got == want[:3 * NODES].tolist(), (line, want[:3 * NODES])
    assert line["bulk"] == want[3 * NODES:3 * NODES + 8].tolist() and line["bulk_sum"] == want[3 * NODES:].sum(), line
    assert line["weight"] == len(line["members"])


def survivors_went_on(run: failcases.CaseRun, exactly_at: bool = True) -> None:
    """Both survivors ended every step with a result (no error): the rounds before KILL_AT with the
    victim, every later one (from KILL_AT on; at or after it if not `exactly_at`: an agent killed
    after its trainer's step 2 may have sent step 3 already) exactly the survivors' sum."""
    for r in range(NODES):
        if r == VICTIM:
            continue
        lines = run.lines[f"r{r}.0"]
        assert lines[-1] == {"done": True}, lines[-3:]
        steps = [x for x in lines if "counts" in x]
        assert [x["k"] for x in steps] == list(range(1, failcases.STEPS + 1))
        without = next(x["k"] for x in steps if VICTIM not in x["members"])
        assert without == KILL_AT if exactly_at else KILL_AT <= without < failcases.STEPS, steps
        for x in steps:
            want = [0, 1, 2] if x["k"] < without else [0, 1]
            assert x["members"] == want, x
            assert_exact(x, {m: x["k"] for m in want})


async def test_a_killed_trainer_gives_its_peers_their_sum_and_the_round_goes_on_without_it(tmp_path):
    run = await run_case("trainer_killed", tmp_path, deadline_s=DEADLINE_S)
    assert not run.error, run.error
    survivors_went_on(run)
    assert [x["k"] for x in run.lines["r2.0"] if "counts" in x] == [1, 2]  # killed before step 3
    left = [e for e in run.timeline if e["kind"] == "script_left" and e["node"] == VICTIM]
    assert left and "died at step 3" in left[0]["why"] and not left[0]["ended"], left
    assert run.aborts and run.aborts[0]["round"] == KILL_AT and f"node {VICTIM} left" in run.aborts[0]["why"]
    assert not run.lost  # the agent stays: it only sits the job out
    assert judge(run) == (True, "")


async def test_a_hung_trainer_is_dropped_its_peers_go_on_and_its_late_step_raises(tmp_path):
    run = await run_case("trainer_hung", tmp_path, deadline_s=DEADLINE_S, stall_s=STALL_S)
    assert not run.error, run.error
    survivors_went_on(run)
    last = run.lines["r2.0"][-1]
    assert last["k"] == KILL_AT, last
    assert f"stopped calling step(): no step 3 for {STALL_S:.0f} s" in last["error"], last
    assert last["error"].startswith("rank 2: dropped from the job"), last
    left = [e for e in run.timeline if e["kind"] == "script_left" and e["node"] == VICTIM]
    assert left and "stopped calling step()" in left[0]["why"], left
    assert not run.lost  # its agent said so; the barrier did not declare the node lost meanwhile
    assert judge(run) == (True, "")


async def test_a_killed_agent_gives_its_trainer_a_sync_error_naming_it(tmp_path):
    run = await run_case("agent_killed", tmp_path, deadline_s=DEADLINE_S)
    assert not run.error, run.error
    survivors_went_on(run, exactly_at=False)
    last = run.lines["r2.0"][-1]
    assert "its wansync agent" in last["error"] and "died" in last["error"], last
    assert run.lost[VICTIM]["why"] == "control connection closed"
    assert judge(run) == (True, "")


async def test_a_restarted_trainer_gets_the_current_model_then_sums_once_with_its_new_incarnation(tmp_path):
    run = await run_case("trainer_restarted", tmp_path, deadline_s=DEADLINE_S)
    assert not run.error, run.error
    old, new = run.lines["r2.0"], run.lines["r2.1"]
    assert [x["k"] for x in old if "counts" in x] == [1, 2]
    # the new incarnation's first sync is the model of a rank that stayed, at the round it rejoined
    assert new[0]["kind"] == "bcast" and new[0]["rejoined"] and new[-1] == {"done": True}
    s0 = [x for x in run.lines["r0.0"] if "counts" in x]
    back = [i for i, x in enumerate(s0) if VICTIM in x["members"] and x["k"] > KILL_AT]
    assert len(back) == failcases.BACK_ROUNDS and back == list(range(back[0], back[0] + len(back)))
    assert new[0]["digest"] == s0[back[0] - 1]["digest"], (new[0], s0[back[0] - 1])
    # every sum since: the survivors' step k and the newcomer's step j, each once, the new incarnation's
    news = [x for x in new if "counts" in x]
    assert [x["k"] for x in news] == list(range(1, failcases.BACK_ROUNDS + 1))
    for j, (mine, theirs) in enumerate(zip(news, (s0[i] for i in back), strict=True), start=1):
        step = {0: theirs["k"], 1: theirs["k"], VICTIM: j}
        assert_exact(mine, step, {VICTIM: 1})
        assert_exact(theirs, step, {VICTIM: 1})
    for r in (0, 1):  # and the survivors' own sums, before and after, exact
        lines = run.lines[f"r{r}.0"]
        assert lines[-1] == {"done": True}
        for x in (x for x in lines if "counts" in x and VICTIM not in x["members"]):
            assert_exact(x, {0: x["k"], 1: x["k"]})
    rejoined = [e for e in run.timeline if e["kind"] == "script_rejoined"]
    assert len(rejoined) == 1 and rejoined[0]["node"] == VICTIM
    assert judge(run) == (True, "")


async def test_an_agent_declared_lost_drops_its_trainer_and_comes_back_without_it(tmp_path):
    """Frozen past the heartbeat timeout, then thawed: its trainer's steps belong to rounds that went on
    without it, so the trainer gets SyncError naming why; the agent rejoins as a new incarnation, with
    no script it sits the job out (LEAVE), and no round ever waits for it."""
    run = await run_case("agent_frozen", tmp_path, deadline_s=DEADLINE_S)
    assert not run.error, run.error
    survivors_went_on(run, exactly_at=False)
    last = run.lines["r2.0"][-1]
    assert "was declared lost by the scheduler" in last["error"] and "restart the script" in last["error"], last
    assert run.lost[VICTIM]["why"].startswith("silent for")
    left = [e for e in run.timeline if e["kind"] == "script_left" and e["node"] == VICTIM]
    assert left and "has no training script attached" in left[-1]["why"], left
