"""SelMcast's receiver selection (scheduler/selection), pure: Algorithm 1 on a hand-computed instance,
the consistency rule over many rounds, Algorithm 2's shrink-only and stickiness rules, Orpheus, the
MILP against brute force, and bad input refused naming the field."""

import itertools

import numpy as np
import pytest

from scheduler.progress import resolve as resolve_progress
from scheduler.selection import Consistency, completion, orpheus, selmcast_bsp, selmcast_ssp
from scheduler.selection.choosers import make
from scheduler.selection.optimal import optimal_bsp

pytestmark = pytest.mark.unit


def rows(x: np.ndarray) -> dict[int, list[int]]:
    return {i: np.flatnonzero(x[i]).tolist() for i in range(len(x))}


# --- Algorithm 1, by hand ---------------------------------------------------------------------------
def hand_instance():
    """5 workers, v = 1, p = 3, L3, uplinks ample (100). Forced pairs make the order of senders
    unambiguous (most forced first): 4 (4 forced), 0 (3), 1 (2), 2 (1), 3 (0)."""
    n = 5
    forced = np.zeros((n, n), dtype=bool)
    for i, js in {4: [0, 1, 2, 3], 0: [1, 2, 3], 1: [0, 2], 2: [3]}.items():
        forced[i, js] = True
    return np.ones(n), np.full(n, 100.0), np.array([2.0, 4.0, 2.5, 3.0, 1.5]), forced


def test_algorithm_1_picks_the_hand_computed_receivers():
    v, b_in, b_out, forced = hand_instance()
    # By hand. Loads after D: R = [2, 2, 3, 3, 0] (R_j = forced senders into j).
    # sender 4, 0: q <= 0. sender 1: q = 1 of {3, 4}: (1+3)/3 = 1.33, (1+0)/1.5 = 0.67 -> 4; R4 = 1.
    # sender 2: q = 2 of {0, 1, 4}: (1+2)/2 = 1.5, (1+2)/4 = 0.75, (1+1)/1.5 = 1.33 -> 1, 4; R1 = 3, R4 = 2.
    # sender 3: q = 3 of {0, 1, 2, 4}: 1.5, (1+3)/4 = 1.0, (1+3)/2.5 = 1.6, (1+2)/1.5 = 2.0 -> 1, 0, 2.
    # Downlink loads / bandwidth: 3/2, 4/4, 4/2.5, 3/3, 2/1.5 -> t = 1.6 (uplinks: 1/100).
    # Pareto, t fixed: 0->4 (3/1.5 = 2 > 1.6 no), 1->3 (4/3 = 1.33 yes), 2->0 (4/2 = 2 no), 3->4 (no).
    sel = selmcast_bsp(v, b_in, b_out, 3, mode="l3", forced=forced, rng=np.random.default_rng(7))
    assert rows(sel.basic) == {0: [1, 2, 3], 1: [0, 2, 4], 2: [1, 3, 4], 3: [0, 1, 2], 4: [0, 1, 2, 3]}
    assert sel.t_basic == pytest.approx(1.6)
    assert rows(sel.x) == {0: [1, 2, 3], 1: [0, 2, 3, 4], 2: [1, 3, 4], 3: [0, 1, 2], 4: [0, 1, 2, 3]}
    assert sel.t == pytest.approx(1.6)  # the Pareto pass never raises the estimate
    for seed in range(20):  # the tie-breaking rng cannot change an instance without ties
        again = selmcast_bsp(v, b_in, b_out, 3, mode="l3", forced=forced, rng=np.random.default_rng(seed))
        assert np.array_equal(again.x, sel.x)
    assert np.array_equal(selmcast_bsp(v, b_in, b_out, 3, mode="l3", forced=forced, pareto=False).x, sel.basic)


def test_pareto_admits_extras_only_while_no_port_exceeds_the_estimate():
    rng = np.random.default_rng(3)
    for mode in ("l3", "l7"):
        for _ in range(20):
            n = int(rng.integers(5, 30))
            b_in, b_out = rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, n)
            sel = selmcast_bsp(np.ones(n), b_in, b_out, max(1, n // 3), mode=mode, rng=rng)
            assert (sel.x.sum(axis=1) >= max(1, n // 3)).all() and not sel.x.diagonal().any()
            assert (sel.x >= sel.basic).all() and sel.t <= sel.t_basic * (1 + 1e-9)
            assert sel.t == pytest.approx(completion(sel.x, np.ones((n, n)), b_in, b_out, mode))


# --- consistency: every pair at least once in every k + 1 rounds ---------------------------------------
@pytest.mark.parametrize("scheme", ["selmcast", "orpheus"])
@pytest.mark.parametrize("mode", ["l3", "l7"])
def test_every_pair_is_delivered_at_least_once_in_every_k_plus_1_rounds(scheme, mode):
    n, p, k, rounds = 12, 2, 3, 50
    rng = np.random.default_rng(11)
    chooser = make(scheme, n, p, k=k, mode=mode, seed=5)
    got = []
    for _ in range(rounds):  # bandwidth drawn afresh every round: the selection moves around
        x = chooser.bsp(rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, n), np.ones(n))
        for i in range(n):
            chooser.delivered(i, np.flatnonzero(x[i]))
        got.append(x)
    got = np.array(got)
    off = ~np.eye(n, dtype=bool)
    for start in range(rounds - k):
        window = got[start:start + k + 1].any(axis=0)
        assert window[off].all(), f"a pair went {k + 1} rounds without a delivery from round {start}"
    assert not got[:, ~off].any()


def test_a_dropped_receiver_does_not_count_as_delivered():
    rule = Consistency(3, k=1)
    rule.after_round(0, [1])  # 0 -> 2 missed once: forced next time
    assert rule.forced()[0].tolist() == [False, False, True]
    rule.after_round(0, [2])
    assert rule.forced()[0].tolist() == [False, True, False]
    with pytest.raises(ValueError, match="delivered: worker 0 cannot deliver to itself"):
        rule.after_round(0, [0])
    assert not Consistency(3, None).forced().any()


# --- Algorithm 2 -----------------------------------------------------------------------------------------
def test_algorithm_2_shrinks_running_sets_keeps_sticky_and_forced_receivers_and_sets_deadlines():
    n = 6
    v = np.ones(n)
    b = np.ones(n)
    active = np.array([True, True, False, False, False, False])
    x = np.zeros((n, n), dtype=bool)
    x[0, [1, 2, 3, 4]] = True
    x[1, [2, 3, 4, 5]] = True
    V = np.zeros((n, n))
    V[0, [1, 2, 3, 4]] = [0.1, 0.9, 0.9, 0.0]  # 1: past 1 - eta (sticky), 4: complete
    V[1, [2, 3, 4, 5]] = 0.95
    forced = np.zeros((n, n), dtype=bool)
    forced[1, 5] = True
    tau = np.array([0.0, 0.0, 7.0, 0.0, 0.0, 0.0])
    c = selmcast_ssp(2, active, x, V, v, b, b, 1, tau, eta=0.75, forced=forced, rng=np.random.default_rng(1))
    assert (c.y[:2] <= x[:2]).all()  # running sets only shrink
    assert c.y[0, 1] and c.y[0, 4] and c.y[1, 5]  # sticky, complete and forced receivers stay
    assert c.y[2].sum() >= 1 and not c.y[2, 2]  # the new task: p at least, never itself
    assert set(c.dropped) == {(i, j) for i in (0, 1) for j in range(n) if x[i, j] and not c.y[i, j]} | \
        {(2, j) for j in range(n) if j != 2 and not c.y[2, j]}
    assert c.deadline[2] >= 7.0  # t_i >= tau_i: a worker blocked anyway has slack
    assert np.isinf(c.deadline[3:]).all() and sorted(c.order) == [0, 1, 2]


def test_algorithm_2_keeps_a_task_with_eta_0_only_to_its_minimum():
    """eta = 0: nothing is sticky; the running task 0 keeps p = 1 receiver of its two when worker 1's new
    task takes a port (the case the live drop test reproduces, at every progress and tie order)."""
    n = 4
    b_in, b_out = np.array([16.0, 4, 4, 4]), np.array([2.0, 1, 4, 4])
    first = selmcast_ssp(0, np.zeros(n, bool), np.zeros((n, n), bool), np.zeros((n, n)), np.ones(n), b_in, b_out, 1,
                         np.zeros(n), mode="l7", eta=0.0)
    assert np.flatnonzero(first.y[0]).tolist() == [2, 3]  # Pareto: both fast downlinks at once
    for frac in (0.05, 0.5, 0.95):
        for seed in range(6):
            c = selmcast_ssp(1, np.array([True, False, False, False]), first.y, np.where(first.y, frac, 0.0),
                             np.ones(n), b_in, b_out, 1, np.zeros(n), mode="l7", eta=0.0,
                             rng=np.random.default_rng(seed))
            assert c.y[0].sum() == 1 and len([d for d in c.dropped if d[0] == 0]) == 1


# --- Orpheus ---------------------------------------------------------------------------------------------
def test_orpheus_takes_the_forced_pairs_then_random_receivers_up_to_p():
    rng = np.random.default_rng(0)
    forced = np.zeros(8, dtype=bool)
    forced[[1, 6]] = True
    for _ in range(30):
        r = orpheus(3, 8, 4, forced=forced, rng=rng)
        assert len(r) == 4 and {1, 6} <= set(r) and 3 not in r
    many = np.ones(8, dtype=bool)
    assert orpheus(3, 8, 2, forced=many).tolist() == [0, 1, 2, 4, 5, 6, 7]  # D may exceed p


# --- the MILP ----------------------------------------------------------------------------------------------
def brute_force(v, b_in, b_out, p, mode):
    n = len(v)
    options = [[c for q in range(p, n) for c in itertools.combinations([j for j in range(n) if j != i], q)]
               for i in range(n)]
    best = (np.inf, 0)
    for pick in itertools.product(*options):
        x = np.zeros((n, n), dtype=bool)
        for i, c in enumerate(pick):
            x[i, list(c)] = True
        t = completion(x, np.broadcast_to(v[:, None], (n, n)), b_in, b_out, mode)
        best = min(best, (round(t, 9), -int(x.sum())))
    return best


@pytest.mark.parametrize("mode", ["l3", "l7"])
def test_the_milp_finds_the_brute_force_optimum_and_selmcast_is_no_better(mode):
    rng = np.random.default_rng(4)
    for _ in range(3):
        n = 4
        v, b_in, b_out = rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, n)
        opt = optimal_bsp(v, b_in, b_out, 1, mode=mode, time_limit_s=20)
        t, neg_scale = brute_force(v, b_in, b_out, 1, mode)
        assert opt.proven and opt.t == pytest.approx(t, rel=1e-6)
        assert opt.x is not None and int(opt.x.sum()) == -neg_scale  # stage 2: the most receivers at t*
        sel = selmcast_bsp(v, b_in, b_out, 1, mode=mode, rng=rng)
        assert sel.t >= opt.t * (1 - 1e-6)


def test_the_milp_honours_forced_pairs():
    n = 5
    forced = np.zeros((n, n), dtype=bool)
    forced[0, 4] = True
    opt = optimal_bsp(np.ones(n), np.ones(n), np.array([1, 1, 1, 1, 0.1]), 1, forced=forced, time_limit_s=20)
    assert opt.x[0, 4] and opt.t == pytest.approx(10.0)


# --- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda: selmcast_bsp(np.ones(3), np.ones(3), np.array([1.0, 0.0, 1.0]), 1), "b_out: every value must be"),
    (lambda: selmcast_bsp(np.ones(3), np.ones(2), np.ones(3), 1), "b_in: expected 3 values"),
    (lambda: selmcast_bsp(np.ones(3), np.ones(3), np.ones(3), 1, mode="l5"), "mode: must be l3 or l7"),
    (lambda: selmcast_bsp(np.ones(3), np.ones(3), np.ones(3), -1), "p: the minimum receivers"),
    (lambda: selmcast_bsp(np.ones(3), np.ones(3), np.ones(3), 1, forced=np.zeros((2, 2))), "forced: expected"),
    (lambda: selmcast_ssp(3, np.zeros(3, bool), None, None, np.ones(3), np.ones(3), np.ones(3), 1, np.zeros(3)),
     "kappa: worker 3 outside"),
    (lambda: selmcast_ssp(0, np.zeros(3, bool), None, None, np.ones(3), np.ones(3), np.ones(3), 1, np.zeros(3),
                          eta=1.5), "eta: must be in"),
    (lambda: make("random", 3, 1), "select: unknown"),
    (lambda: Consistency(3, -1), "k: must be an integer"),
    (lambda: resolve_progress("mcast-bsp", select="random"), "select: unknown 'random'"),
    (lambda: resolve_progress("mcast-ssp", caps="guessed"), "caps: declared or measured"),
])
def test_bad_input_is_refused_naming_the_field(call, message):
    with pytest.raises(ValueError, match=message):
        call()


async def test_multicast_progress_models_refuse_reduce_schemes_and_reduce_models_multicast_ones():
    from scheduler.service import Scheduler

    sched = Scheduler("refuse", 3)
    with pytest.raises(ValueError, match="progress mcast-bsp forms multicasts: scheme mcast or mcast-l3, not star"):
        await sched.run_job("star", rounds=1, params=10, chunk_params=10, progress="mcast-bsp")
    with pytest.raises(ValueError, match="mcast plans one worker's multicast"):
        await sched.run_job("mcast", rounds=1, params=10, chunk_params=10, progress="queue")
