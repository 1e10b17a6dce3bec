"""Faults: the grammar and scenario files (errors name the field), the injector's timing and healing,
and real clusters on loopback where link faults heal and every round stays exact, and a killed
agent is caught by the launcher."""

import asyncio
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.exact import assert_results_exact
from helpers.waiting import until
from rich.console import Console

from emulation.faults import AppLinkControl, Fault, FaultError, FaultInjector, check, load_scenario, parse
from emulation.topology import build
from overlay.messages import ProtocolError, validate
from wansync.cli import main
from wansync.cluster import run
from wansync.options import Options
from wansync.runspec import resolve


# --- grammar ---------------------------------------------------------------------------------------
@pytest.mark.unit
def test_grammar_reads_every_kind():
    assert parse("kill:node=3@t=20") == Fault("kill", node=3, at_s=20.0, spec="kill:node=3@t=20")
    f = parse("blackhole:link=2-5@round=3,for=10")
    assert (f.kind, f.link, f.both, f.at_round, f.for_s) == ("blackhole", (2, 5), True, 3, 10.0)
    f = parse("freeze:node=1@round=2,scheme=ring,for=0.5")
    assert (f.node, f.scheme, f.for_s, f.at_s) == (1, "ring", 0.5, None)
    f = parse("collapse:link=2-5@t=1")
    assert f.factor == 7.0 and f.both
    f = parse("collapse: link=2>5 , mbps=3 @ t=4 , job=2")
    assert (f.link, f.both, f.mbps, f.factor, f.job) == ((2, 5), False, 3.0, None, 2)
    assert parse("down:link=0-1@t=0").at_s == 0.0


@pytest.mark.unit
@pytest.mark.parametrize("spec, match", [
    ("kill:node=3", "missing '@WHEN'"),
    ("node=3@t=1", "must start with KIND:"),
    ("explode:node=1@t=1", "kind: must be one of kill, freeze"),
    ("kill:node=x@t=1", "node: must be an integer, got 'x'"),
    ("kill:node=-1@t=1", "node: must be an integer >= 0"),
    ("kill:link=1-2@t=1", "node: kill needs node=N"),
    ("down:node=1@t=1", "link: down needs link=A-B"),
    ("down:link=1-2,node=1@t=1", "node: not an option of down"),
    ("down:link=1>2@t=1", "link: down takes both directions"),
    ("down:link=12@t=1", "link: must be 'A-B'"),
    ("down:link=3-3@t=1", "link: a link from node 3 to itself"),
    ("blackhole:link=1-2,factor=2@t=1", "factor: not an option of blackhole"),
    ("collapse:link=1-2,factor=2,mbps=3@t=1", "mbps: give factor or mbps, not both"),
    ("collapse:link=1-2,factor=0@t=1", "factor: must be positive"),
    ("down:link=1-2@t=1,round=2", "t: give exactly one of"),
    ("down:link=1-2@for=1", "t: give exactly one of"),
    ("down:link=1-2@t=-1", "t: must be >= 0"),
    ("down:link=1-2@t=soon", "t: must be a number"),
    ("kill:node=1@t=1,for=3", "for: a kill cannot be undone"),
    ("down:link=1-2,for=1@t=1", "for: belongs after the '@'"),
    ("down:link=1-2@t=1,node=3", "node: belongs before the '@'"),
    ("down:link=1-2@t=1,color=red", "color: unknown field"),
    ("down:link=1-2@t=1,t=2", "t: given twice"),
    ("down:link=1-2@t", "'t' is not key=value"),
])
def test_grammar_errors_name_the_field(spec, match):
    with pytest.raises(FaultError, match=match) as e:
        parse(spec)
    assert spec in str(e.value)  # which fault, too


@pytest.mark.unit
def test_faults_are_checked_against_the_topology():
    topo = build("internet2")
    check([parse("kill:node=8@t=1"), parse("down:link=0-1@t=1")], topo.nodes, topo.links)
    with pytest.raises(FaultError, match="node: node 9 outside 0..8"):
        check([parse("kill:node=9@t=1")], topo.nodes, topo.links)
    with pytest.raises(FaultError, match="link: 0-8 is not a link"):
        check([parse("blackhole:link=0-8@t=1")], topo.nodes, topo.links)


@pytest.mark.unit
def test_scenario_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('name = "two"\n[[faults]]\nkind = "blackhole"\nlink = "2-5"\nround = 3\nfor = 10\n'
                 '[[faults]]\nkind = "collapse"\nlink = [0, 1]\nfactor = 4\nt = 2.5\nscheme = "mst"\n')
    a, b = load_scenario(p)
    assert (a.kind, a.link, a.at_round, a.for_s) == ("blackhole", (2, 5), 3, 10.0)
    assert (b.link, b.factor, b.at_s, b.scheme) == ((0, 1), 4.0, 2.5, "mst")


@pytest.mark.unit
@pytest.mark.parametrize("text, match", [
    ("[[faults]\n", "not valid TOML"),
    ("title = 'x'\n", "title: unknown key"),
    ("faults = []\n", "faults: must be a non-empty list"),
    ("faults = [1]\n", r"faults\[0\]: must be a table"),
    ('[[faults]]\nkind = "kill"\nnode = 1\nt = 1\n[[faults]]\nkind = "down"\nlink = "1-x"\nt = 1\n',
     r"faults\[1\]: link: must be an integer, got 'x'"),
    ('[[faults]]\nkind = "down"\nlink = [1, 2, 3]\nt = 1\n', r"faults\[0\]: link: must be two node ids"),
    ('[[faults]]\nkind = "kill"\nnode = true\nt = 1\n', r"faults\[0\]: node: must be an integer"),
    ('[[faults]]\nkind = "kill"\nnode = 1\nround = 1.5\n', r"faults\[0\]: round: must be an integer"),
    ('[[faults]]\nkind = "kill"\nnode = 1\nwhen = 1\n', r"faults\[0\]: when: unknown field"),
])
def test_scenario_errors_name_the_entry_and_field(tmp_path, text, match):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(FaultError, match=match) as e:
        load_scenario(p)
    assert "bad.toml" in str(e.value)


@pytest.mark.loopback
def test_cli_refuses_a_bad_fault_before_starting_anything(tmp_path, capsys):
    (tmp_path / "s.toml").write_text('[[faults]]\nkind = "down"\nlink = "0-8"\nt = 1\n')
    for extra, match in ((["--fault", "down:link=0-1@t=1,for=x"], "for: must be a number"),
                         (["--scenario", str(tmp_path / "s.toml")], "0-8 is not a link")):
        assert main(["run", "--topology", "internet2", *extra]) == 2
        assert match in capsys.readouterr().err


@pytest.mark.unit
def test_emu_messages_are_validated():
    ok = {"t": "EMU", "op": "rate", "src": 1, "dst": 2, "mbps": 0}
    assert validate(dict(ok)) == ok
    validate({"t": "EMU", "op": "down", "src": 1, "dst": 2, "on": True})
    for bad, field in [({**ok, "op": "melt"}, "op"), ({**ok, "mbps": -1}, "mbps"), ({**ok, "dst": 1}, "dst"),
                       ({"t": "EMU", "op": "rate", "src": 1, "dst": 2}, "mbps"),
                       ({"t": "EMU", "op": "blackhole", "src": 1, "dst": 2}, "on"),
                       ({**ok, "mbps": float("inf")}, "mbps")]:
        with pytest.raises(ProtocolError) as e:
            validate(bad)
        assert e.value.field == field


# --- the injector ----------------------------------------------------------------------------------
class Links:
    """Records every call, and when it came (the injector's clock is time.time)."""

    def __init__(self):
        self.calls = []
        self.at = {}

    def _call(self, call):
        self.calls.append(call)
        self.at.setdefault(call, time.time())

    def set_rate(self, src, dst, mbps):
        self._call(("rate", src, dst, mbps))

    def set_down(self, a, b, down):
        self._call(("down", a, b, down))

    def set_blackhole(self, a, b, on):
        self._call(("blackhole", a, b, on))


EARLY = 0.005  # a timer may fire this much before its time (clock resolution, two clocks)


@pytest.mark.unit
async def test_injector_fires_at_times_and_rounds_and_heals():
    """Each fault fires at its time or round and heals after its `for`: never sooner (a loaded
    machine only makes them later, so only lower bounds are asserted)."""
    links, reports = Links(), []
    faults = [parse("down:link=0-1@t=0.05,for=0.1"), parse("collapse:link=2-3,factor=4@round=1,scheme=mst,for=0.05"),
              parse("blackhole:link=1-2@round=0,job=2"), parse("collapse:link=0>1,mbps=2@t=0.02,scheme=mst")]
    inj = FaultInjector(faults, links=links, pid_of=lambda n: None, rate_of=lambda s, d: 40.0 + s,
                        report=reports.append)
    t0 = time.time()
    inj.start()
    inj.on_event("job", {"job": 1, "scheme": "ring"})
    inj.on_event("task", {"job": 1, "scheme": "ring", "round": 0})  # not mst: nothing
    await until(lambda: links.calls, "the first fault (down at t=0.05)")
    assert links.calls == [("down", 0, 1, True)]  # neither of mst's faults, nor round 1's
    assert links.at[("down", 0, 1, True)] >= t0 + 0.05 - EARLY
    await until(lambda: len(links.calls) > 1, "the down fault to heal")
    assert links.calls[-1] == ("down", 0, 1, False)
    assert links.at[("down", 0, 1, False)] >= links.at[("down", 0, 1, True)] + 0.1 - EARLY
    t_job2 = time.time()
    inj.on_event("job", {"job": 2, "scheme": "mst"})  # round 0 of job 2 starts: the blackhole
    assert links.calls[-1] == ("blackhole", 1, 2, True)
    inj.on_event("task", {"job": 2, "scheme": "mst", "round": 0})  # round 1 of mst starts
    assert links.calls[-2:] == [("rate", 2, 3, 42.0 / 4), ("rate", 3, 2, 43.0 / 4)]
    healed = [("rate", 2, 3, 42.0), ("rate", 3, 2, 43.0)]
    await until(lambda: all(c in links.calls for c in healed), "the collapse to heal")
    assert all(links.at[c] >= links.at[("rate", 2, 3, 42.0 / 4)] + 0.05 - EARLY for c in healed)
    await until(lambda: ("rate", 0, 1, 2.0) in links.calls, "mst's collapse at t=0.02")
    assert links.at[("rate", 0, 1, 2.0)] >= t_job2 + 0.02 - EARLY  # t counts from the mst job's start
    inj.on_event("task", {"job": 2, "scheme": "mst", "round": 0})  # fires once only
    await inj.stop()  # the blackhole had no `for`: stop heals it
    assert links.calls[-1] == ("blackhole", 1, 2, False) or ("blackhole", 1, 2, False) in links.calls
    actions = [(r["kind"], r["action"]) for r in reports]
    assert actions.count(("blackhole", "inject")) == 1 and ("blackhole", "heal") in actions
    assert links.calls.count(("rate", 2, 3, 42.0 / 4)) == 1
    assert all(r["type"] == "fault" and "spec" in r for r in reports)


@pytest.mark.loopback
async def test_injector_signals_processes():
    """Freeze is SIGSTOP then SIGCONT after `for`; kill is SIGKILL; both reported."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    reports = []
    try:
        # frozen for 2 s: long enough to see it stopped, polling, on a loaded machine
        inj = FaultInjector([parse("freeze:node=0@t=0,for=2"), parse("kill:node=1@t=0")], links=None,
                            pid_of=lambda n: procs[n].pid, rate_of=lambda s, d: 1.0, report=reports.append)
        inj.start()
        await until(lambda: _state(procs[0].pid) == "T", "node 0's process to be stopped")
        assert procs[1].wait(30) == -signal.SIGKILL
        await until(lambda: len(reports) == 3, "the freeze to heal")
        await until(lambda: _state(procs[0].pid) in ("S", "R"), "node 0's process to continue")
        await inj.stop()
        assert [(r["kind"], r["action"]) for r in reports] == [("freeze", "inject"), ("kill", "inject"),
                                                              ("freeze", "heal")]
        assert reports[2]["t_run"] >= reports[0]["t_run"] + 2 - EARLY  # healed after its `for`, not sooner
        # a link fault without link control is reported, never fatal
        inj2 = FaultInjector([parse("down:link=0-1@t=0")], links=None, pid_of=lambda n: None,
                             rate_of=lambda s, d: 1.0, report=reports.append)
        inj2.start()
        await until(lambda: len(reports) > 3, "the link fault's report")
        assert "no link control" in reports[-1]["error"]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.unit
def test_app_link_control_messages_go_to_the_owners():
    sent = []
    c = AppLinkControl(lambda n, m: sent.append((n, m)))
    c.set_rate(2, 3, 0.0)
    c.set_down(1, 4, True)
    c.set_blackhole(1, 4, False)
    assert [n for n, _ in sent] == [2, 1, 4, 1, 4]
    for _, m in sent:
        validate(dict(m))


# --- real clusters ---------------------------------------------------------------------------------
def _cfg(tmp_path, *faults, rounds=3):
    return resolve(Options.make(topology="uniform:50", nodes=4, schemes=["ring"], workload__model="resnet50",
                                scale=0.005, rounds=rounds, warmup=1, out=str(tmp_path / "r.jsonl"),
                                faults=list(faults), no_http=True))


def _records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]


@pytest.mark.loopback
@pytest.mark.parametrize("fault", ["down:link=0-1@round=2,for=1", "blackhole:link=0-1@round=2,for=1",
                                   "collapse:link=0-1,factor=7@round=2,for=1"])
def test_link_fault_heals_and_every_round_stays_exact(tmp_path, fault):
    """The ring runs 0->1->2->3->0; a fault on 0-1 as round 2 begins stalls (or slows to 1/7) that
    round; after it heals (reconnect + resend, held bytes released, rate restored) every round of
    the run, the faulted one included, ends with the exact sum at every node."""
    jobs = asyncio.run(run(_cfg(tmp_path, fault), Console(file=io.StringIO()), show_table=False))
    recs = jobs[0].records
    assert len(recs) == 4
    for r in recs:
        assert r.ok and r.digests_agree and r.versions_agree, r
    assert assert_results_exact(tmp_path / "r.jsonl") == 4  # the exact sum, as this test computes it
    faults = [r for r in _records(tmp_path) if r["type"] == "fault"]
    assert [(f["action"], f["round"]) for f in faults] == [("inject", 2), ("heal", 2)]
    assert faults[0]["spec"] == fault and "error" not in faults[0] and "error" not in faults[1]
    events = [r for r in _records(tmp_path) if r["type"] == "event" and r["kind"] == "fault"]
    assert len(events) == 2  # on the scheduler's timeline too (the dashboard's)
    faulted = next(r for r in recs if r.round == 2)
    # the fault bounds the round from below, whatever the machine's speed: a stalled link for 1 s,
    # or ~6 Mbit over a link at 50/7 Mbit/s
    assert faulted.round_s > (0.9 if not fault.startswith("collapse") else 0.5), faulted


@pytest.mark.loopback
def test_a_killed_agent_is_survived_by_the_run(tmp_path):
    jobs = asyncio.run(run(_cfg(tmp_path, "kill:node=2@round=1", rounds=8), Console(file=io.StringIO()),
                           show_table=False))
    kills = [r for r in _records(tmp_path) if r["type"] == "fault"]
    assert [(k["kind"], k["node"], k["action"], k["round"]) for k in kills] == [("kill", 2, "inject", 1)]
    recs = jobs[0].records
    assert len(recs) == 8 + jobs[0].warmup and all(r.ok and r.digests_agree and r.versions_agree for r in recs)
    assert assert_results_exact(tmp_path / "r.jsonl") == len(recs)
    assert recs[-1].participants == 3  # the survivors, exact
