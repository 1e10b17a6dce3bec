"""One registry of progress decisions (core.progress) serves the live scheduler's models and the
simulator's job mode: replacing an entry changes both; the decisions themselves answer exactly the rules
(SSP's bound, P-Reduce's groups of p in READY order), checked against references worked out here."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from core.compute import ComputeModel
from core.plan import ChunkGroup, Plan, make_layout
from core.progress import DECISIONS, SIMULATED, Form, Go, decide
from core.progress.queue import Queue as QueueDecision
from core.progress.ssp import Ssp as SspDecision
from scheduler.progress import MODELS, resolve
from sim import make_network
from sim.job import Queue, Ssp, simulate_job

pytestmark = pytest.mark.unit

NET = make_network({(a, b): 8e6 for a in range(4) for b in range(4) if a != b})


def star(members, receivers):
    root = min(members)
    kids = tuple(r for r in receivers if r != root)
    group = ChunkGroup((0,), root, {m: None if m == root else root for m in members}, {root: kids} if kids else {})
    return Plan(0, "star", members, dict.fromkeys(members, 1.0), make_layout(1000, 1000), (group,),
                receivers=receivers).validate()


class Recorder:
    """A Control that writes down what a scheduler model asks for."""

    def __init__(self, workers: int) -> None:
        self.workers, self.gos, self.formed = list(range(workers)), [], []

    def alive(self):
        return self.workers

    def go(self, js, upto, node):
        self.gos.append((node, upto))

    def form(self, js, members, receivers, rnd, iters=None, options=None):
        self.formed.append(dict(iters))
        return SimpleNamespace(id=len(self.formed) - 1)


def spy(base):
    """A decision class of the registry's model that notes every instance made and every event heard."""
    made = []

    class Spy(base):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.heard = []
            made.append(self)

        def ready(self, worker, iteration, t, **kw):
            self.heard.append(("ready", worker, iteration))
            return super().ready(worker, iteration, t, **kw)

        def over(self, ref, iters, t, **kw):
            self.heard.append(("over", dict(iters)))
            return super().over(ref, iters, t, **kw)
    return Spy, made


@pytest.mark.parametrize("name, sched_opts, policy", [("queue", {"group": 2}, Queue(2)),
                                                      ("ssp", {"staleness": 1}, Ssp(1))])
def test_the_scheduler_and_the_simulator_take_their_decisions_from_the_same_registry_entry(
        monkeypatch, name, sched_opts, policy):
    Spy, made = spy(DECISIONS[name])
    monkeypatch.setitem(DECISIONS, name, Spy)
    model = resolve(name, **sched_opts)  # the scheduler's model
    ctl, js = Recorder(3), SimpleNamespace(rounds=5)
    model.start(ctl, js)
    model.ready(ctl, js, 0, 0, set())
    assert len(made) == 1 and made[0].heard == [("ready", 0, 0)]
    pred = simulate_job(policy, star, ComputeModel("constant:0.1"), [0, 1, 2], NET, 1.0)  # the simulator's
    assert len(made) == 2 and pred.tasks
    sim = made[1]
    assert [h for h in sim.heard if h[0] == "ready"][:3] == [("ready", w, 0) for w in (0, 1, 2)]
    assert len([h for h in sim.heard if h[0] == "over"]) == sum(t.end_s is not None for t in pred.tasks)


def test_a_replaced_queue_decision_changes_what_both_form(monkeypatch):
    """A registry entry that groups every READY alone: the scheduler and the simulator both form one-member tasks."""
    class Alone(QueueDecision):
        def __init__(self, group: int = 2) -> None:
            super().__init__(1)
    monkeypatch.setitem(DECISIONS, "queue", Alone)
    model, ctl, js = resolve("queue", group=3), Recorder(3), SimpleNamespace(rounds=5)
    model.start(ctl, js)
    for w in (2, 0, 1):
        model.ready(ctl, js, w, 0, set())
    assert ctl.formed == [{2: 0}, {0: 0}, {1: 0}]
    pred = simulate_job(Queue(3), star, ComputeModel("constant:0.1"), [0, 1, 2], NET, 0.55)
    assert pred.tasks and all(len(t.members) == 1 for t in pred.tasks)
    monkeypatch.undo()
    pred = simulate_job(Queue(3), star, ComputeModel("constant:0.1"), [0, 1, 2], NET, 0.55)
    assert pred.tasks and all(len(t.members) == 3 for t in pred.tasks)


def test_the_registry_says_which_models_the_simulator_runs():
    assert SIMULATED == {"bsp", "ssp", "queue", "selective"} <= set(DECISIONS)
    assert SIMULATED <= set(MODELS)  # each has its live model too; crew and mcast-* are the scheduler's only
    assert not {"crew", "mcast-bsp", "mcast-ssp"} & set(DECISIONS)

    class Crew:
        name = "crew"

        def options(self):
            return {}
    with pytest.raises(ValueError, match="the simulator runs bsp, queue, selective, ssp"):
        simulate_job(Crew(), star, ComputeModel("constant:0.1"), [0, 1], NET, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown progress model 'crew'"):
        decide("crew")


@pytest.mark.parametrize("make", [lambda: resolve("queue", group=0), lambda: decide("queue", group=0),
                                  lambda: simulate_job(Queue(0), star, ComputeModel("constant:0.1"), [0], NET, 1.0)])
def test_the_queue_refuses_an_empty_group_everywhere(make):
    with pytest.raises(ValueError, match="group must be >= 1, got 0"):
        make()


@pytest.mark.parametrize("make", [lambda: resolve("ssp", staleness=-1), lambda: decide("ssp", staleness=-1),
                                  lambda: simulate_job(Ssp(-1), star, ComputeModel("constant:0.1"), [0], NET, 1.0)])
def test_ssp_refuses_a_negative_staleness_everywhere(make):
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        make()


def brute_allowance(i: int, done: dict[int, int], s: int, last: int) -> int:
    """The largest k <= last with d_i >= k - 1 and k <= min_j d_j + 1 + s, by trying every k."""
    ok = [k for k in range(last + 1) if done[i] >= k - 1 and k <= min(done.values()) + 1 + s]
    return max(ok, default=-1)


@pytest.mark.parametrize("seed", range(20))
def test_ssp_decision_allows_exactly_the_bound(seed):
    rng = random.Random(seed)
    n, s, rounds = rng.randint(1, 5), rng.randint(0, 3), rng.randint(2, 12)
    dec = decide("ssp", staleness=s)
    assert isinstance(dec, SspDecision)
    done = dict.fromkeys(range(n), -1)  # the reference: each worker's last iteration whose multicast is over
    allowed = dict.fromkeys(range(n), -1)

    def check(actions):
        gos = [a for a in actions if isinstance(a, Go)]
        want = []
        for i in sorted(done):
            k = brute_allowance(i, done, s, rounds - 1)
            if k > allowed[i]:
                allowed[i] = k
                want.append(Go(i, k))
        assert sorted(gos, key=lambda g: g.worker) == want  # a Go exactly where the allowance rose
    check(dec.start(range(n), 0.0, rounds=rounds))
    pending: dict[int, int] = {}  # worker -> the iteration whose multicast is running
    nxt = dict.fromkeys(range(n), 0)
    for _ in range(200):
        free = [w for w in done if w not in pending and nxt[w] <= allowed[w] and nxt[w] < rounds]
        if free and (not pending or rng.random() < 0.5):
            w = rng.choice(free)
            out = dec.ready(w, nxt[w], 0.0)
            if n > 1:
                assert out == [Form((w,), tuple(x for x in range(n) if x != w), {w: nxt[w]})]
                pending[w] = nxt[w]
            else:  # nobody to tell: done at once
                done[w] = nxt[w]
                check(out)
            nxt[w] += 1
        elif pending:
            w = rng.choice(sorted(pending))
            k = pending.pop(w)
            done[w] = max(done[w], k)
            check(dec.over(None, {w: k}, 0.0))
        else:
            break
    assert dec.violations == 0
    assert all(done[w] == rounds - 1 for w in done)  # the bound never deadlocks: everyone finished


@pytest.mark.parametrize("seed", range(30))
def test_queue_decision_groups_p_in_ready_order(seed):
    """P-Reduce: the first p queued go together, in READY order; once nobody else can queue (every other
    worker reported its last iteration), whoever is queued goes."""
    rng = random.Random(seed)
    n, p, rounds = rng.randint(1, 7), rng.randint(1, 4), rng.randint(1, 5)
    dec = decide("queue", group=p)
    dec.start(range(n), 0.0, rounds=rounds)
    queue: list[tuple[int, int]] = []  # the reference queue
    nxt = dict.fromkeys(range(n), 0)
    running: list[dict[int, int]] = []

    def expect() -> list[dict[int, int]]:
        groups = []
        while len(queue) >= p:
            groups.append(dict(queue[:p]))
            del queue[:p]
        queued = {w for w, _ in queue}
        if queue and all(w in queued or nxt[w] >= rounds for w in range(n)):
            groups.append(dict(queue))
            queue.clear()
        return groups
    while True:
        busy = {w for w, _ in queue} | {w for g in running for w in g}
        free = [w for w in range(n) if w not in busy and nxt[w] < rounds]
        if free and (not running or rng.random() < 0.6):
            w = rng.choice(free)
            out = dec.ready(w, nxt[w], 0.0, last=nxt[w] == rounds - 1)
            queue.append((w, nxt[w]))
            nxt[w] += 1
        elif running:
            out = dec.over(None, running.pop(rng.randrange(len(running))), 0.0)
        else:
            break
        want = expect()
        assert out == [Form(tuple(sorted(g)), None, g) for g in want]
        assert [list(a.iters.items()) for a in out] == [list(g.items()) for g in want]  # READY order
        running += want
    assert not dec.queue and all(k == rounds for k in nxt.values())
