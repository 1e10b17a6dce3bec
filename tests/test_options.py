"""Run options as one object: every flag of `run`, `scheduler`, `deploy` and `agent` — enumerated from
the real parsers, not from a list kept here — reaches the options the scheduler and the agents read
(locally, from the file `run` writes; on hosts, from the file `deploy` copies there), and the file
refuses what it does not know."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

import pytest

from emulation.trace import RateEvent, Trace
from wansync.cli import parser
from wansync.cluster import agent_options, agent_options_file
from wansync.deploy.hosts import Host
from wansync.deploy.rundir import host_options
from wansync.inventory import HostSpec
from wansync.options import DECLARED, SCHEMA, Options, OptionsError, offers, options_from
from wansync.remote import Remote
from wansync.runspec import resolve

pytestmark = pytest.mark.unit

COMMANDS = ("run", "scheduler", "deploy", "agent", "train")
# flags that are a process's own, not the run's: they stay on that process's command line (or, for
# deploy's hosts group, are the launcher's alone); every other flag must be a declared run option
OWN = {
    "agent": {"node", "scheduler", "listen", "advertise"},
    "scheduler": {"listen", "control_lines"},
    "deploy": {"inventory", "hosts", "known_hosts", "accept_new_host_keys", "identity", "wheelhouse",
               "scheduler_here", "scheduler_address", "shape", "clean", "force"},
    "run": set(),
    "train": {"script_path"},
}
REQUIRED = {"agent": ["--node", "1", "--scheduler", "127.0.0.1:9"], "deploy": ["-H", "a,b,c"], "train": ["s.py"]}
# options whose value agents get from the launcher, not from the run's flags (each with why)
SET_BY_LAUNCHER = {"name": "the run's cluster id", "shaping": "the backend's", "trace_file": "the computed trace",
                   "trace": "computed into trace_file", "dynamic": "computed into trace_file",
                   "secret_file": "a text secret travels in the environment"}


def _actions(command: str) -> list[argparse.Action]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if not isinstance(a, argparse._HelpAction)]


def _files(tmp: Path) -> dict[str, str]:
    """Real files for the options that name one."""
    Trace((RateEvent(1.0, 0, 1, 10.0),)).write(tmp / "t.json")
    (tmp / "scenario.toml").write_text('[[faults]]\nkind = "kill"\nnode = 1\nt = 30\n')
    (tmp / "secret").write_bytes(b"x" * 24)
    (tmp / "secret").chmod(0o600)
    return {k: str(tmp / v) for k, v in (("trace_file", "t.json"), ("scenario", "scenario.toml"),
                                         ("secret_file", "secret"))}


def _sample(opt, files: dict[str, str]) -> tuple[list[str], object]:
    """A value for `opt` that is not its default and that resolves: (argv, the value the object holds)."""
    special = {
        "--topology": (["hetero"], "hetero"), "--nodes": (["9"], 9), "--trace": (["walk"], "walk"),
        "--schemes": (["mst,ring"], ["mst", "ring"]), "--hub": (["3"], 3), "--roots": (["2"], 2),
        "--model": (["alexnet"], "alexnet"), "--chunk": (["200KB"], "200KB"),
        "--compute-model": (["constant:0.1"], "constant:0.1"), "--fault": (["kill:node=1@t=30"], ["kill:node=1@t=30"]),
        "--rounds-by-scheme": (["star=3"], {"star": 3}), "--sync-every": (["none"], None),
        "--http": (["127.0.0.1:8123"], "127.0.0.1:8123"), "--cluster": (["c-7"], "c-7"),
        "--tls-cert": (["c.pem"], "c.pem"), "--tls-key": (["k.pem"], "k.pem"), "--tls-ca": (["ca.pem"], "ca.pem"),
        "--out": (["r.jsonl"], "r.jsonl"), "--min-receivers": (["2"], 2), "--eta": (["0.5"], 0.5),
        "--handoff-dir": (["/run/h"], "/run/h"), "--script": (["t.py"], "t.py"), "--script-arg": (["x"], ["x"]),
        "--target-accuracy": (["0.9"], 0.9), "--probe-budget": (["0.5"], 0.5),
        "--train": (["t.py"], "t.py"), "--train-file": (["d.csv"], ["d.csv"]),
        "--train-package": (["scikit-learn"], ["scikit-learn"]),
    }
    if opt.flag in special:
        return special[opt.flag]
    if opt.name in files:
        return [files[opt.name]], files[opt.name]
    if opt.action == "store_true":
        return [], True
    if opt.action == "store_const":
        return [], opt.const
    if opt.choices is not None:
        other = next(c for c in opt.choices if c != opt.default)
        return [other], other
    if opt.type is int:
        n = (opt.default or 0) + 3
        return [str(n)], n
    if opt.type is float:
        return [str(opt.default * 2 + 1)], opt.default * 2 + 1
    raise AssertionError(f"no sample value for {opt.flag}: add one here")


def _by_dest(command: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for o in DECLARED:
        if offers(o, command):
            out.setdefault(o.key, []).append(o)
    return out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_is_a_declared_option_or_the_process_own(command):
    declared = _by_dest(command)
    for action in _actions(command):
        if action.dest in ("verbose", "options"):
            continue
        assert action.dest in declared or action.dest in OWN[command], \
            f"{command} {action.option_strings}: neither a declared run option nor one of the process's own flags"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_reaches_the_options_of_the_scheduler_and_the_agents(command, tmp_path):
    files = _files(tmp_path)
    declared = _by_dest(command)
    seen = 0
    for action in _actions(command):
        for opt in declared.get(action.dest, []):
            if opt.flag not in action.option_strings:
                continue
            argv, want = _sample(opt, files)
            args = parser().parse_args([command, *REQUIRED.get(command, []), opt.flag, *argv])
            if opt.flag == "--nodes":
                args.topology = "hetero"
            options = options_from(args)
            got = getattr(options, opt.group)[opt.name]
            assert got == want, f"{command} {opt.flag}: the options hold {got!r}, not {want!r}"
            # the file every process reads gives the same object back
            assert Options.read(options.write(tmp_path / "o.json")) == options, opt.flag
            seen += 1
            if command == "agent":
                continue  # the agent reads exactly this object (wansync.cli._agent)
            if opt.group == "security" and opt.name.startswith("tls_"):
                continue  # needs all three (test below); resolving one alone is refused
            cfg = resolve(options)
            # the scheduler side: `conduct` takes this cfg, and the results file records the whole object
            assert getattr(cfg.options, opt.group)[opt.name] == want, opt.flag
            # the agents: the file `run` writes for them
            mine = Options.read(agent_options_file(cfg, "c"))
            if opt.name not in SET_BY_LAUNCHER and opt.flag not in ("--chunk", "--probe-bytes"):
                assert getattr(mine, opt.group)[opt.name] == want, f"{command} {opt.flag} did not reach the agents"
            if command == "deploy":  # the file copied to each host: the same, with that host's paths
                host = Host(0, Remote(HostSpec(host="h0")))
                host.run_dir = "/w/runs/r"
                there = host_options(cfg, host, "c", "app")
                value = getattr(there, opt.group)[opt.name]
                if opt.name in ("trace_file", "secret_file", "scenario", "out", "script"):
                    assert value is None or value.startswith("/w/runs/r/"), (opt.flag, value)
                elif opt.name == "files":  # alone (no --train, which deploy refuses) nothing is shipped
                    assert value == want, (opt.flag, value)
                elif opt.name not in SET_BY_LAUNCHER and opt.flag not in ("--chunk", "--probe-bytes", "--http"):
                    assert value == want, f"deploy {opt.flag} did not reach the hosts' options"
    assert seen == sum(len(v) for v in declared.values()), "some declared option has no flag"


def test_probe_size_follows_the_chunk_and_tls_paths_are_rewritten_for_hosts(tmp_path):
    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("x")
    args = parser().parse_args(["deploy", "-H", "a,b,c", "--topology", "hetero", "--chunk", "4MiB", "--tls-cert",
                                str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem"), "--tls-ca",
                                str(tmp_path / "ca.pem")])
    cfg = resolve(options_from(args).replace(wan__nodes=3))
    assert agent_options(cfg, "c").agents["probe_bytes"] == (1 << 20) * 4 // 2
    host = Host(0, Remote(HostSpec(host="h0")))
    host.run_dir = "/w/runs/r"
    there = host_options(cfg, host, "c", "tc")
    assert there.security["tls_ca"] == "/w/runs/r/tls/ca.pem" and there.security["secret_file"] == "/w/runs/r/secret"
    assert there.agents["shaping"] == "delay-only" and there.output["out"] == "/w/runs/r/results.jsonl"


def test_the_file_is_private_and_refuses_what_it_does_not_know(tmp_path):
    path = Options.make(rounds=3).write(tmp_path / "o.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA and data["workload"]["rounds"] == 3
    for bad, says in (({**data, "schema": SCHEMA + 1}, "schema"), ({**data, "extra": {}}, "unknown group"),
                      ({**data, "wan": {**data["wan"], "colour": 1}}, "unknown option wan.colour"),
                      ([], "JSON object")):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(OptionsError, match=says):
            Options.read(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(OptionsError, match="not JSON"):
        Options.read(tmp_path / "bad.json")


def test_flags_override_the_file_and_values_are_validated_once(tmp_path):
    path = Options.make(rounds=3, progress__model="queue", group=3).write(tmp_path / "o.json")
    args = parser().parse_args(["run", "--options", str(path), "--rounds", "7"])
    options = options_from(args)
    assert options.workload["rounds"] == 7 and options.progress["model"] == "queue" and options.progress["group"] == 3
    for argv, says in ((["--rounds", "0"], "--rounds"), (["--eta", "2"], "--eta"), (["--group", "0"], "--group"),
                       (["--trace", "walk", "--dynamic"], "not both"), (["--hold-budget-mb", "0"], "hold-budget")):
        with pytest.raises(OptionsError, match=says):
            options_from(parser().parse_args(["run", *argv]))
    bad = Options.make(progress__model="nonsense")
    with pytest.raises(OptionsError, match="--progress must be one of"):  # a file is checked as flags are
        bad.validate()
    for key, value in (("rounds", "5"), ("scale", True), ("schemes", "ring"), ("faults", "kill"),
                       ("hold_budget_mb", None), ("rounds_by_scheme", {"ring": "2"}), ("dynamic", 1)):
        with pytest.raises(OptionsError, match="not a valid value"):
            Options.make(**{key: value}).validate()
    Options.make(sync_every=None, nodes=None, scale=1).validate()  # None where the option allows it
    with pytest.raises(OptionsError, match="does not fit --progress"):
        resolve(Options.make(progress__model="ssp", schemes=["ring"]))
    with pytest.raises(OptionsError, match="unknown scheme"):
        resolve(Options.make(schemes=["nope"]))


def test_the_secret_is_never_an_option(tmp_path):
    names = {o.name for o in DECLARED}
    assert "secret" not in names and all("secret" not in n or n == "secret_file" for n in names)


def test_the_loop_is_uvloop_on_both_backends_unless_named():
    from wansync.loops import resolve_loop

    assert resolve_loop("auto", "tc") == "uvloop" and resolve_loop("auto", "app") == "uvloop"
    assert resolve_loop("asyncio", "tc") == "asyncio" and resolve_loop("uvloop", "app") == "uvloop"
    with pytest.raises(ValueError, match="--loop must be one of"):
        resolve_loop("trio", "app")


def test_a_script_flag_that_begins_like_a_wansync_flag_reaches_the_script():
    # argparse would take `--mode` as an abbreviation of `--model`: wansync takes no abbreviations
    args, rest = parser().parse_known_args(["train", "script.py", "--mode", "model", "--nodes", "3"])
    assert rest == ["--mode", "model"] and args.nodes == 3 and getattr(args, "model", None) is None
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "--node", "3"])
