"""A job and the life of each of its rounds, as objects: what the scheduler knows of a round from
its first topology request to its record.

A round's current attempt goes through: the barrier (agents ask which version it uses; the first
request freezes it), started (everyone asked, replies sent), done (every member's ROUND_DONE, then
its record). An abort ends the attempt: everything of it is forgotten at once and the next attempt
starts at the barrier again. Nothing here talks to agents; the scheduler does.
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from overlay.messages import RoundDone

from .plan import Job, Plan
from .planners import PlannerSpec


@dataclass
class RoundRecord:
    job: int
    scheme: str
    round: int
    version: int
    round_s: float
    compute_s: float
    ok: bool
    digests_agree: bool
    versions_agree: bool  # every node ran the frozen version: the round mixed none
    t_start: float
    t_end: float
    warmup: bool
    errors: list[str]
    trp_wait_s: float = 0.0  # longest time an agent waited for this round's topology reply
    coverage: float = 0.0  # share of directed links the view has measured, when the round ended
    prediction_s: float | None = None  # filled in by whoever knows the configured network
    attempt: int = 0  # > 0: earlier attempts were aborted (a lost agent, a stall) and retried
    participants: int = 0
    # node -> hex blake2b-128 of its result's bytes: lets anyone check the result against a sum of their own
    digests: dict[int, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": "round", **{k: v for k, v in self.__dict__.items()}}


@dataclass
class Round:
    """One round: its current attempt's barrier, version, start and results; when it was recorded."""

    number: int
    attempt: int = 0
    version: int | None = None  # frozen for the current attempt by its first request
    asked: dict[int, set[int]] | None = None  # at the barrier: node -> plan versions it holds
    barrier_t: float | None = None  # the current attempt's first request
    blocked: str | None = None  # why no plan exists for its members yet
    started_t: float | None = None  # past the barrier, not complete
    done: dict[int, RoundDone] = field(default_factory=dict)  # node -> its ROUND_DONE
    recorded_t: float | None = None  # when its last ROUND_DONE came (the round is over)
    aborted: int = 0  # attempts aborted so far

    @property
    def frozen(self) -> bool:
        return self.version is not None

    def ask(self, node: int, have: set[int], now: float) -> None:
        if self.asked is None:
            self.asked, self.barrier_t = {}, now
        self.asked[node] = have

    def start(self, now: float) -> None:
        """Everyone asked and was answered: the barrier is passed."""
        self.asked, self.barrier_t = None, None
        self.started_t = now

    def abort(self) -> int:
        """The current attempt ends (it cannot end exact); returns its number. The next one starts
        from the barrier, with a version frozen anew."""
        att = self.attempt
        self.attempt += 1
        self.aborted += 1
        self.version = None
        self.asked, self.barrier_t, self.blocked, self.started_t = None, None, None, None
        self.done = {}
        return att

    def record(self, js: JobState, members: tuple[int, ...], coverage: float) -> RoundRecord:
        """Every member reported: the round's record (times from the agents' synced clocks)."""
        got = self.done
        starts = [m.t_start for m in got.values()]
        ends = [m.t_end for m in got.values()]
        version = -1 if self.version is None else self.version
        return RoundRecord(
            job=js.job, scheme=js.scheme, round=self.number, version=version,
            round_s=max(ends) - min(starts), compute_s=statistics.median(m.t_compute for m in got.values()),
            ok=all(m.ok for m in got.values()), digests_agree=len({m.digest for m in got.values()}) == 1,
            versions_agree={m.version for m in got.values()} == {version},
            t_start=min(starts), t_end=max(ends), warmup=self.number < js.warmup,
            errors=[m.error for m in got.values() if m.error],
            trp_wait_s=max((m.t_wait or 0.0) for m in got.values()), coverage=coverage,
            attempt=self.attempt, participants=len(members),
            digests={n: m.digest.hex() for n, m in sorted(got.items())})


@dataclass
class JobState:
    """One scheme's run of `rounds` synchronized rounds on the agents, and what its planner keeps."""

    job: int
    scheme: str
    rounds: int
    spec: Job
    plan: Plan
    warmup: int
    planner: PlannerSpec | None = None
    memory: dict[str, Any] = field(default_factory=dict)  # what the planner keeps between its plans
    stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    records: list[RoundRecord] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    view_at_plan: dict[tuple[int, int], float] = field(default_factory=dict)
    policy_s: float = 0.0
    t0: float = 0.0
    last_plan_t: float = 0.0
    replans: int = 0
    view_at_aux: dict[tuple[int, int], float] = field(default_factory=dict)
    last_aux_t: float = 0.0
    aux_updates: int = 0  # AUX_UPDATE pushes: new auxiliary tables without a new version
    aborts: list[dict[str, Any]] = field(default_factory=list)  # every aborted attempt, with why and when
    predicted: dict[int, float | None] = field(default_factory=dict)  # version -> simulated on the view
    job_msg: dict[str, Any] = field(default_factory=dict)  # the JOB message, for agents that rejoin
    avoid: list[list[int]] = field(default_factory=list)  # links the current plan routes around (view.unusable)
    joins: dict[int, int] = field(default_factory=dict)  # node -> first round it runs after rejoining
    by_round: dict[int, Round] = field(default_factory=dict)

    def round(self, rnd: int) -> Round:
        r = self.by_round.get(rnd)
        if r is None:
            r = self.by_round[rnd] = Round(rnd)
        return r

    def attempt_of(self, rnd: int) -> int:
        r = self.by_round.get(rnd)
        return 0 if r is None else r.attempt

    # what the per-round dicts of earlier versions showed: read-only views, for logs and tests
    @property
    def frozen(self) -> Mapping[int, int]:
        return {n: r.version for n, r in self.by_round.items() if r.version is not None}

    @property
    def started(self) -> Mapping[int, float]:
        return {n: r.started_t for n, r in self.by_round.items() if r.started_t is not None}

    @property
    def blocked(self) -> Mapping[int, str]:
        return {n: r.blocked for n, r in self.by_round.items() if r.blocked is not None}

    @property
    def asked(self) -> Mapping[int, dict[int, set[int]]]:
        return {n: r.asked for n, r in self.by_round.items() if r.asked is not None}

    @property
    def attempt(self) -> Mapping[int, int]:
        return {n: r.attempt for n, r in self.by_round.items() if r.attempt}

    @property
    def done(self) -> Mapping[int, dict[int, RoundDone]]:
        return {n: r.done for n, r in self.by_round.items() if r.done}

    @property
    def recorded_t(self) -> Mapping[int, float]:
        return {n: r.recorded_t for n, r in self.by_round.items() if r.recorded_t is not None}
