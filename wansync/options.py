"""A run's options as one object: declared once, validated once, written to one file every process reads.

Every option of `wansync run`, `scheduler`, `deploy` and `agent` is declared here once (`DECLARED`):
its group, its command-line flag, its type, default and help, and which commands offer it. The
command line is built from these declarations (`add_arguments`), and `Options.from_args` reads a
parsed command line back into the object, so a flag cannot exist without its field. The launcher
writes the object to a file (`Options.write`, mode 0600, schema-versioned JSON) and the scheduler
and every agent, local or on a remote host, read that same file (`--options FILE`): no process
gets its options as a command line rebuilt field by field. The cluster secret is never in it.

What differs per process (an agent's node id, the addresses it listens on and advertises, the
scheduler's address as that host reaches it) is not a run option: it stays on that process's
command line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.dispatch import DISPATCH

from .loops import DEFAULT_LOOP, LOOPS

SCHEMA = 1
RUN, SCHEDULER, DEPLOY, AGENT, SIMULATE, TRAIN = "run", "scheduler", "deploy", "agent", "simulate", "train"
ADVISE = "advise"  # ranks the schemes on a WAN (wansync/advise.py): the WAN, the workload, the planners' options
LAUNCHERS = (RUN, SCHEDULER, DEPLOY)  # commands that run every scheme (the agent only moves bytes)
EVERY = (*LAUNCHERS, AGENT)
WAN = (*EVERY, SIMULATE, ADVISE)  # the WAN's options: the simulator predicts on the same one
# four baselines, NetStorm, tree packing and auto
DEFAULT_SCHEMES = ("star", "ring", "mst", "ktree", "netstorm", "packing", "auto")
SSP_SCHEMES = ("mcast", "mcast-l3")  # one-source schemes: each worker's parameters multicast
ONE_SOURCE_PROGRESS = ("ssp", "mcast-bsp", "mcast-ssp")
PROGRESS = ("bsp", "ssp", "queue", "crew", "selective", "mcast-bsp", "mcast-ssp")
SHAPING = ("app", "delay-only", "none")  # the agents emulate rate+delay, delay only (tc shapes rate), nothing


class OptionsError(ValueError):
    """An option's value cannot work; the message names the option (its flag) and why."""


@dataclass(frozen=True)
class Opt:
    """One declared option: `group.name` in the object, `flag` on the command line."""

    group: str
    name: str
    flag: str
    default: Any
    help: str
    commands: tuple[str, ...] = LAUNCHERS
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    action: str | None = None  # "store_true", "append", "store_const"
    const: Any = None  # store_const's value
    metavar: str | None = None
    dest: str = ""  # argparse's dest; defaults to the flag's name

    @property
    def key(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")


def _schemes(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _per_scheme(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in _schemes(text):
        scheme, sep, n = part.partition("=")
        if not sep or not n.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected SCHEME=N,..., got {part!r}")
        out[scheme.strip()] = int(n)
    return out


def _sync_every(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 or none, got {text!r}") from None


PROGRESS_HELP = ("how workers synchronize: bsp (a reduce of all per round, default), ssp (each worker's parameters "
                 "multicast after every iteration, at most --staleness ahead of the slowest; schemes mcast, "
                 "mcast-l3), queue (reduces of the first --group ready workers), crew (the same queue with CREW's "
                 "failure rules: a lost member's task abandoned, a lost aggregator's block moved), selective "
                 "(selective reduce: groups of > --group ready workers by bandwidth, waiting for faster ones; "
                 "bandwidths from the node caps, e.g. --topology switch:N:unit=U), mcast-bsp and mcast-ssp "
                 "(multicasts to the receivers --select picks: SelMcast)")
TOPOLOGY_HELP = ("internet2 | uniform[:Mbps] | hetero[:lo-hi] | geo:NAME[:x=F] (measured, e.g. geo:aws10) | "
                 "waxman:N[:seed=S] | crew:N[:seed=S] | FILE.toml/.json (default internet2)")
TRACE_HELP = ("fluctuation: constant | redraw:PERIOD | walk:period=10,step=0.2,lo=20,hi=155 | "
              "markov:mean_up=60,mean_down=5 | steps:T=F,... | steps:FILE | csv:FILE (time,src,dst,rate); "
              "seeded by --seed, times scaled by --scale (--dynamic = redraw:--period)")
COMPUTE_HELP = ("per-node compute time per iteration, seeded by --seed (overrides --compute): constant:S | "
                "normal:mean=S,sd=S[,spread=F] | lognormal:mean=S,cv=F[,spread=F][,spike=Q] | cnn:mean=S | "
                "transformer:mean=S | csv:FILE (node,iteration,seconds); spread: each node's own mean within +-F")
CHUNK_HELP = ("chunk size, overriding the scaled default (1 M parameters x --scale): bytes with a unit "
              "(200KB, 4MiB, 200000B; KB = 1000, KiB = 1024 bytes) or a plain integer = a parameter count "
              "(float32, 4 bytes each); a whole number of parameters")
FAULT_HELP = ("inject a fault (repeatable): KIND:WHAT@WHEN, e.g. 'kill:node=3@t=20', "
              "'blackhole:link=2-5@round=3,for=10', 'collapse:link=0-1,factor=7@t=2,for=5' "
              "(kinds: kill, freeze, down, blackhole, collapse)")

# Every run option, once. Groups: wan, workload, schemes, progress, security, agents, output, cluster.
DECLARED: tuple[Opt, ...] = (
    # --- the WAN (what every agent must agree on) ---
    Opt("wan", "topology", "--topology", "internet2", TOPOLOGY_HELP, WAN),
    Opt("wan", "nodes", "--nodes", None, "cluster size (full-mesh topologies; default 9)", WAN, int),
    Opt("wan", "seed", "--seed", 1, "seed of rate draws, traces and compute draws", WAN, int),
    Opt("wan", "scale", "--scale", 0.05, "shrinks model bytes, chunk size, link delays and trace periods together "
        "(default 0.05)", WAN, float),
    Opt("wan", "dynamic", "--dynamic", False, "redraw every directed link's rate every --period s", WAN,
        action="store_true"),
    Opt("wan", "period_s", "--period", 180.0, "redraw period at full scale (default 180 s)", WAN, float),
    Opt("wan", "trace", "--trace", None, TRACE_HELP, WAN, metavar="SPEC"),
    Opt("wan", "trace_file", "--trace-file", None, "a computed trace (JSON, already scaled), as launchers hand "
        "their agents", WAN, metavar="PATH"),
    Opt("wan", "backend", "--backend", "app", "who shapes links: app (token buckets in the agents, default) or tc "
        "(the kernel: one network namespace per node, veth + htb per link; root only)", (RUN,),
        choices=("app", "tc")),
    # --- the workload ---
    Opt("workload", "model", "--model", "resnet50", "model name or parameter count (default resnet50; simulate: "
        "alexnet)", (*LAUNCHERS, SIMULATE, ADVISE)),
    Opt("workload", "rounds", "--rounds", 5, "measured rounds per scheme (default 5)", type=int),
    Opt("workload", "warmup", "--warmup", 1, "unmeasured rounds first, to learn the network (default 1)", type=int),
    Opt("workload", "compute_s", "--compute", 0.0, "compute seconds per round (default 0)", type=float),
    Opt("workload", "compute_model", "--compute-model", None, COMPUTE_HELP, metavar="SPEC"),
    Opt("workload", "chunk", "--chunk", None, CHUNK_HELP, (*LAUNCHERS, SIMULATE, ADVISE), metavar="SIZE"),
    Opt("workload", "rounds_by_scheme", "--rounds-by-scheme", {}, "measured rounds of some schemes, overriding "
        "--rounds for them: SCHEME=N,... (e.g. star=3,netstorm=10)", type=_per_scheme, metavar="SCHEME=N,..."),
    # --- schemes and planner options ---
    Opt("schemes", "schemes", "--schemes", None, f"comma-separated (default {','.join(DEFAULT_SCHEMES)}; with "
        f"--progress ssp, mcast-bsp or mcast-ssp: {','.join(SSP_SCHEMES)})", (*LAUNCHERS, SIMULATE, ADVISE), _schemes),
    Opt("schemes", "hub", "--hub", None, "star/ktree root (default: best measured node)",
        (*LAUNCHERS, SIMULATE, ADVISE), int),
    Opt("schemes", "k", "--k", 2, "ktree fan-out (default 2)", (*LAUNCHERS, SIMULATE, ADVISE), int),
    Opt("schemes", "roots", "--roots", None, "NetStorm: number of roots N (default: all nodes)", type=int),
    Opt("schemes", "aux_mode", "--aux-mode", "global_prune", "NetStorm: how auxiliary paths are chosen",
        choices=("global_prune", "per_pair_disjoint")),
    Opt("schemes", "reroot", "--netstorm-reroot", False, "NetStorm: let roots and shares move on later plans",
        action="store_true"),
    Opt("schemes", "both_directions", "--both-directions", False, "NetStorm: weigh tree edges by push and pull "
        "delay", action="store_true"),
    Opt("schemes", "update_time_s", "--update-time", 5.0, "UPDATE_TIME: re-plan at most this often, seconds at "
        "full scale (default 5)", type=float),
    Opt("schemes", "update_rate", "--update-rate", 0.1, "UPDATE_RATE: re-plan only if a link's rate moved by more "
        "than this (default 0.1)", type=float),
    Opt("schemes", "probe", "--probe", "on", "probe the links no plan keeps busy, so the view knows every link "
        "(on, default; off: passive samples only)", choices=("on", "off")),
    Opt("schemes", "probe_budget", "--probe-budget", 0.25, "share of each node's time it may spend probing "
        "(default 0.25)", type=float),
    # --- the progress model ---
    Opt("progress", "model", "--progress", "bsp", PROGRESS_HELP, (*LAUNCHERS, ADVISE), choices=PROGRESS),
    Opt("progress", "staleness", "--staleness", 2, "SSP's bound s (default 2)", type=int, metavar="S"),
    Opt("progress", "group", "--group", 2, "ready queue: workers per reduce (default 2)", type=int, metavar="P"),
    Opt("progress", "select", "--select", "selmcast", "SelMcast: who picks each multicast's receivers",
        choices=("selmcast", "orpheus", "all")),
    Opt("progress", "min_receivers", "--min-receivers", None, "SelMcast: p (default 0.3 x workers)", type=int,
        metavar="P"),
    Opt("progress", "sync_every", "--sync-every", 4, "SelMcast: consistency bound k: every pair at least once in "
        "k + 1 rounds; 'none': off (default 4)", type=_sync_every, metavar="K"),
    Opt("progress", "eta", "--eta", 0.75, "SelMcast: SSP stickiness (default 0.75)", type=float),
    Opt("progress", "caps_from", "--caps-from", "declared", "SelMcast: the ports' bandwidth as nodes declare it "
        "(default) or as the view measured it", choices=("declared", "measured")),
    # --- security (the secret itself is never an option: its file or $WANSYNC_SECRET) ---
    Opt("security", "secret_file", "--secret-file", None, "cluster secret (>= 16 bytes; chmod 600); default: "
        "$WANSYNC_SECRET for scheduler and agent, a fresh one per run for run and deploy", EVERY, metavar="FILE"),
    Opt("security", "insecure", "--insecure", False, "no cluster secret: anyone who can reach the ports may join "
        "(trusted networks only)", (SCHEDULER, AGENT), action="store_true"),
    Opt("security", "tls_cert", "--tls-cert", None, "TLS: this node's certificate (signed by --tls-ca)", EVERY,
        metavar="PEM"),
    Opt("security", "tls_key", "--tls-key", None, "TLS: its private key", EVERY, metavar="PEM"),
    Opt("security", "tls_ca", "--tls-ca", None, "TLS: CA that signs every node's certificate", EVERY,
        metavar="PEM"),
    # --- the agents ---
    Opt("agents", "loop", "--loop", DEFAULT_LOOP, "event loop: auto (default: uvloop, measured cheaper per GB on "
        "both backends), asyncio or uvloop", EVERY, choices=LOOPS),
    Opt("agents", "gc", "--agent-gc", "tuned", "garbage collector of every agent: tuned (startup objects frozen, "
        "young generation collected every 10,000 allocations) or Python's default", EVERY,
        choices=("tuned", "default"), dest="agent_gc"),
    Opt("agents", "hold_budget_mb", "--hold-budget-mb", 256.0, "memory for frames of rounds after the current one "
        "(default 256); over it they are refused unacknowledged and resent when their round begins", EVERY, float,
        metavar="MB"),
    Opt("agents", "primary_busy_bound", "--primary-busy-bound", DISPATCH.primary_busy_bound,
        "NetStorm's PRIMARY_BUSY_BOUND (chunks in transit)", EVERY, int),
    Opt("agents", "aux_queue_length", "--aux-queue-length", DISPATCH.aux_queue_length,
        "NetStorm's AUXILIARY_QUEUE_LENGTH", EVERY, int),
    Opt("agents", "probe_num", "--probe-num", DISPATCH.probe_num, "NetStorm's PROBE_CHUNK_NUM: probes per estimate",
        EVERY, int),
    Opt("agents", "probe_bytes", "--probe-bytes", None, "NetStorm's PROBE_CHUNK_SIZE in bytes (default 2 MB x "
        "--scale, or half a --chunk)", EVERY, int),
    Opt("agents", "shaping", "--shaping", "app", "what agents emulate: app (link rates and delays, default), "
        "delay-only (the kernel shapes rates: tc), none (a real WAN)", (AGENT,), choices=SHAPING),
    Opt("agents", "shaping", "--no-shaping", "app", "real WAN: do not emulate link rates or delays (= --shaping "
        "none)", (AGENT,), action="store_const", const="none", dest="shaping"),
    Opt("agents", "shaping", "--delay-only", "app", "the kernel shapes rates (tc backend): emulate only link delay "
        "and jitter, ignore the trace (= --shaping delay-only)", (AGENT,), action="store_const", const="delay-only",
        dest="shaping"),
    Opt("agents", "heartbeat_timeout_s", "--heartbeat-timeout", 1.5, "declare an agent lost after S seconds "
        "without a heartbeat (default 1.5; a killed agent is noticed at once, a frozen or cut-off one after S)",
        type=float, metavar="S"),
    Opt("agents", "scheduler_wait_s", "--scheduler-wait", 30.0, "if the scheduler goes away, agents wait this long "
        "for it to come back and register again (default 30)", EVERY, float, metavar="S"),
    # --- output, faults, dashboard ---
    Opt("output", "out", "--out", None, "JSON-lines results file", metavar="PATH"),
    Opt("output", "http", "--http", "127.0.0.1:0", "serve the live dashboard, JSON API and /metrics here "
        "(default 127.0.0.1:0, a free port)", metavar="HOST:PORT"),
    Opt("output", "no_http", "--no-http", False, "no dashboard, API or metrics server", action="store_true"),
    Opt("output", "faults", "--fault", (), FAULT_HELP, action="append", metavar="SPEC", dest="fault"),
    Opt("output", "scenario", "--scenario", None, "TOML file of [[faults]] tables with the fields of --fault",
        metavar="FILE"),
    Opt("agents", "handoff_dir", "--handoff-dir", None, "serve the hand-off channel a training script attaches by "
        "(wansync train sets it): a private directory (0700) holding node-N.sock; the run's token in "
        "$WANSYNC_HANDOFF_TOKEN", (AGENT,), metavar="DIR"),
    Opt("agents", "script_stall_s", "--script-stall", 60.0, "a training script that keeps a round waiting this long "
        "for its next step() (and 4x its slowest step so far) is dropped as hung: its node leaves the job until a "
        "script attaches again (default 60; docs/training-failures.md)", (AGENT, TRAIN, DEPLOY), float, metavar="S"),
    # --- training your own script (wansync train) ---
    Opt("train", "script", "--script", None, "the training script (wansync train SCRIPT [ARGS...])", (TRAIN,),
        metavar="SCRIPT"),
    Opt("train", "script", "--train", None, "train this script on the hosts (wansync.torch), as `wansync train` "
        "does here; arguments wansync does not know are the script's (docs/real-hosts.md)", (DEPLOY,),
        metavar="SCRIPT", dest="train_script"),
    Opt("train", "args", "--script-arg", (), "an argument of the script (repeatable; or after SCRIPT)",
        (TRAIN, DEPLOY), action="append", metavar="ARG", dest="script_arg"),
    Opt("train", "files", "--train-file", (), "a file or directory the script reads, copied beside it on every host "
        "(repeatable; it lands under its own name in the script's directory, the script's working directory)",
        (DEPLOY,), action="append", metavar="PATH", dest="train_file"),
    Opt("train", "packages", "--train-package", (), "a package the script imports beyond wansync[torch] (e.g. "
        "scikit-learn), put into the hosts' offline wheelhouse and installed (repeatable)", (DEPLOY,),
        action="append", metavar="REQ", dest="train_package"),
    Opt("train", "baseline", "--baseline", None, "also run the script with plain torch.distributed on Gloo on the "
        "same WAN (ddp; --backend tc only: nothing else shapes Gloo's bytes)", (TRAIN,), choices=("ddp",)),
    Opt("train", "target", "--target-accuracy", None, "time to this accuracy (what the script logs with "
        "wt.log(accuracy=...)); default: what the baseline reaches, else none", (TRAIN, DEPLOY), float, metavar="A"),
    Opt("train", "start", "--script-start", "fork", "how the scripts start beside agents on this host: fork (default: "
        "from one process that imported the script's installed top-level imports, such as torch, once per launcher; "
        "the application backend only) or exec (python SCRIPT per rank, as the tc backend and deploy always do)",
        (TRAIN,), choices=("fork", "exec")),
    Opt("train", "attach_timeout_s", "--attach-timeout", 300.0, "every rank's script must attach within S "
        "seconds (default 300)", (TRAIN, DEPLOY), float, metavar="S"),
    Opt("train", "run_timeout_s", "--run-timeout", 3600.0, "a scheme's scripts must end within S seconds "
        "(default 3600)", (TRAIN, DEPLOY), float, metavar="S"),
    # --- the cluster ---
    Opt("cluster", "name", "--cluster", "wansync", "cluster id agents give (must match the scheduler's; run and "
        "deploy draw a fresh one)", (SCHEDULER, AGENT)),
    Opt("cluster", "register_timeout_s", "--register-timeout", 300.0, "give up if not every node registered "
        "within S seconds (default 300)", (SCHEDULER,), float, metavar="S"),
)
GROUPS = ("wan", "workload", "schemes", "progress", "security", "agents", "output", "cluster", "train")


def _defaults(group: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for o in DECLARED:
        if o.group == group and o.name not in out:
            out[o.name] = copy.deepcopy(list(o.default) if isinstance(o.default, tuple) else o.default)
    return out


@dataclass
class Options:
    """A run's options, grouped; plain data (JSON) so it can be written, copied to hosts and read back."""

    wan: dict[str, Any] = field(default_factory=lambda: _defaults("wan"))
    workload: dict[str, Any] = field(default_factory=lambda: _defaults("workload"))
    schemes: dict[str, Any] = field(default_factory=lambda: _defaults("schemes"))
    progress: dict[str, Any] = field(default_factory=lambda: _defaults("progress"))
    security: dict[str, Any] = field(default_factory=lambda: _defaults("security"))
    agents: dict[str, Any] = field(default_factory=lambda: _defaults("agents"))
    output: dict[str, Any] = field(default_factory=lambda: _defaults("output"))
    cluster: dict[str, Any] = field(default_factory=lambda: _defaults("cluster"))
    train: dict[str, Any] = field(default_factory=lambda: _defaults("train"))

    # --- building -------------------------------------------------------------------------------------------
    @classmethod
    def make(cls, **values: Any) -> Options:
        """Defaults, with `group__name=value` or `name=value` (a name unique across groups) overrides:
        what benchmarks and tests use instead of a command line."""
        opts = cls()
        for key, value in values.items():
            group, _, name = key.rpartition("__")
            opts.set(group or _group_of(name), name, value)
        return opts

    @classmethod
    def from_args(cls, args: argparse.Namespace, base: Options | None = None) -> Options:
        """The options a parsed command line gives: `base` (defaults, or a file's) with every flag the
        command line set. Flags are declared with default SUPPRESS, so only those given are present."""
        opts = copy.deepcopy(base) if base is not None else cls()
        given = vars(args)
        for o in DECLARED:
            if o.key in given:
                value = given[o.key]
                opts.set(o.group, o.name, list(value) if o.action == "append" else value)
        return opts

    def set(self, group: str, name: str, value: Any) -> None:
        section = getattr(self, group, None) if group in GROUPS else None
        if section is None or name not in section:
            raise OptionsError(f"unknown option {group}.{name}")
        section[name] = value

    def replace(self, **values: Any) -> Options:
        """A copy with `group__name=value` overrides (a launcher's per-host copy, a scheme's variant)."""
        other = copy.deepcopy(self)
        for key, value in values.items():
            group, _, name = key.rpartition("__")
            other.set(group or _group_of(name), name, value)
        return other

    # --- the file -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **{g: copy.deepcopy(getattr(self, g)) for g in GROUPS}}

    @classmethod
    def from_dict(cls, data: Any, where: str = "options") -> Options:
        """Refuses what this version does not know: another schema, an unknown group or key."""
        if not isinstance(data, dict):
            raise OptionsError(f"{where}: expected a JSON object")
        if data.get("schema") != SCHEMA:
            raise OptionsError(f"{where}: schema {data.get('schema')!r}, this wansync reads schema {SCHEMA} "
                               "(written by another version?)")
        unknown = sorted(set(data) - {"schema", *GROUPS})
        if unknown:
            raise OptionsError(f"{where}: unknown group(s) {', '.join(unknown)}")
        opts = cls()
        for g in GROUPS:
            section = data.get(g, {})
            if not isinstance(section, dict):
                raise OptionsError(f"{where}: {g} must be an object")
            for name, value in section.items():
                if name not in getattr(opts, g):
                    raise OptionsError(f"{where}: unknown option {g}.{name}")
                getattr(opts, g)[name] = value
        return opts

    def write(self, path: Path) -> Path:
        """Mode 0600 from its first byte: it names the secret's file and TLS key, never the secret."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, indent=1, sort_keys=True)
        os.chmod(path, 0o600)
        return path

    @classmethod
    def read(cls, path: Path | str) -> Options:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise OptionsError(f"--options {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise OptionsError(f"--options {path}: not JSON ({exc})") from None
        return cls.from_dict(data, f"--options {path}")

    # --- derived ---------------------------------------------------------------------------------------------
    @property
    def scheme_list(self) -> list[str]:
        chosen = self.schemes["schemes"]
        if chosen:
            return list(chosen)
        return list(SSP_SCHEMES if self.progress["model"] in ONE_SOURCE_PROGRESS else DEFAULT_SCHEMES)

    def planner_options(self) -> dict[str, Any]:
        """What every planner is given (the planners take what they know)."""
        s = self.schemes
        opts: dict[str, Any] = {"k": s["k"]}
        opts.update({k: v for k, v in (("roots", s["roots"]), ("aux_mode", s["aux_mode"]), ("reroot", s["reroot"]),
                                       ("both_directions", s["both_directions"])) if v})
        if s["hub"] is not None:
            opts["hub"] = s["hub"]
        return opts

    def progress_options(self) -> dict[str, Any]:
        """SelMcast's options for --progress mcast-bsp / mcast-ssp (scheduler/progress/mcast.py)."""
        p = self.progress
        if p["model"] not in ("mcast-bsp", "mcast-ssp"):
            return {}
        return {"select": p["select"], "p": p["min_receivers"], "k": p["sync_every"], "eta": p["eta"],
                "seed": self.wan["seed"], "caps": p["caps_from"]}

    @property
    def http(self) -> str | None:
        return None if self.output["no_http"] else self.output["http"]

    def validate(self) -> Options:
        """The checks that need nothing but the values (the launcher's `runspec.resolve` builds the rest)."""
        self._check_types()
        w, p, a = self.workload, self.progress, self.agents
        checks = (
            (w["rounds"] >= 1 and all(n >= 1 for n in w["rounds_by_scheme"].values()), "--rounds must be >= 1"),
            (w["warmup"] >= 0, "--warmup must be >= 0"),
            (w["compute_s"] >= 0, "--compute must be >= 0"),
            (self.wan["scale"] > 0, "--scale must be > 0"),
            (self.wan["nodes"] is None or self.wan["nodes"] >= 2, "--nodes must be >= 2"),
            (self.wan["period_s"] > 0, "--period must be > 0"),
            (p["staleness"] >= 0, "--staleness must be >= 0"),
            (p["group"] >= 1, "--group must be >= 1"),
            (p["min_receivers"] is None or p["min_receivers"] >= 0, "--min-receivers must be >= 0"),
            (p["sync_every"] is None or p["sync_every"] >= 0, "--sync-every must be >= 0 or none"),
            (0 <= p["eta"] <= 1, "--eta must be in [0, 1]"),
            (a["hold_budget_mb"] > 0, "--hold-budget-mb must be > 0"),
            (a["primary_busy_bound"] >= 1, "--primary-busy-bound must be >= 1"),
            (a["aux_queue_length"] >= 0, "--aux-queue-length must be >= 0"),
            (a["probe_num"] >= 1, "--probe-num must be >= 1"),
            (a["probe_bytes"] is None or a["probe_bytes"] > 0, "--probe-bytes must be > 0"),
            (a["heartbeat_timeout_s"] > 0, "--heartbeat-timeout must be > 0"),
            (a["scheduler_wait_s"] >= 0, "--scheduler-wait must be >= 0"),
            (self.schemes["k"] >= 1, "--k must be >= 1"),
            (0 < self.schemes["probe_budget"] <= 1, "--probe-budget must be in (0, 1]"),
            (self.train["attach_timeout_s"] > 0 and self.train["run_timeout_s"] > 0,
             "--attach-timeout and --run-timeout must be > 0"),
            (self.train["target"] is None or 0 < self.train["target"] <= 1, "--target-accuracy must be in (0, 1]"),
            (self.schemes["roots"] is None or self.schemes["roots"] >= 1, "--roots must be >= 1"),
            (not (self.wan["trace"] is not None and self.wan["dynamic"]),
             "give --trace or --dynamic/--period (an alias of --trace redraw:PERIOD), not both"),
            (not (self.security["insecure"] and self.security["secret_file"]),
             "--insecure given, but a cluster secret file is configured too"),
        )
        for ok, why in checks:
            if not ok:
                raise OptionsError(why)
        return self

    def _check_types(self) -> None:
        """A file is checked as a command line is: each value of its option's type (or its choices)."""
        for o in DECLARED:
            v = getattr(self, o.group)[o.name]
            if not _type_ok(o, v):
                raise OptionsError(f"{o.flag}: {v!r} is not a valid value")
            if o.choices is not None and v is not None and v not in o.choices:
                raise OptionsError(f"{o.flag} must be one of {', '.join(o.choices)}, got {v!r}")



def _type_ok(o: Opt, v: Any) -> bool:
    if v is None:
        return o.default is None or o.type is _sync_every
    if o.action in ("store_true",):
        return isinstance(v, bool)
    if o.action == "append":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if o.type is _schemes:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if o.type is _per_scheme:
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(n, int) for k, n in v.items())
    if o.type in (int, _sync_every):
        return isinstance(v, int) and not isinstance(v, bool)
    if o.type is float:
        return isinstance(v, int | float) and not isinstance(v, bool)
    return isinstance(v, str)


def _group_of(name: str) -> str:
    groups = sorted({o.group for o in DECLARED if o.name == name})
    if len(groups) != 1:
        raise OptionsError(f"option {name!r} is {'ambiguous' if groups else 'unknown'}: say group__{name}")
    return groups[0]


def add_arguments(parser: argparse.ArgumentParser, command: str, *, overrides: dict[str, Any] | None = None) -> None:
    """Declare `command`'s run options on `parser`, in their groups, each with default SUPPRESS (so that
    `Options.from_args` knows which were given). `overrides` changes a help text (flag -> text)."""
    titles = {"wan": "the WAN", "workload": "the workload", "schemes": "schemes and planner options",
              "progress": "the progress model", "security": "security (TLS: all three or none)",
              "agents": "the agents", "output": "results, faults and the dashboard", "cluster": "the cluster",
              "train": "your training script"}
    sections = {g: parser.add_argument_group(titles[g]) for g in GROUPS
                if any(offers(o, command) for o in DECLARED if o.group == g)}
    parser.add_argument("--options", default=None, metavar="FILE",
                        help="read the run's options from this file (as launchers write it); flags given too "
                             "override it")
    for o in DECLARED:
        if not offers(o, command):
            continue
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": o.key,
                              "help": (overrides or {}).get(o.flag, o.help)}
        if o.action is not None:
            kw["action"] = o.action
            if o.action == "store_const":
                kw["const"] = o.const
        else:
            if o.type is not None:
                kw["type"] = o.type
            if o.choices is not None:
                kw["choices"] = o.choices
        if o.metavar is not None:
            kw["metavar"] = o.metavar
        sections[o.group].add_argument(o.flag, **kw)


def offers(o: Opt, command: str) -> bool:
    """Does `command` take option `o`? `train` takes every option of `run` and its own."""
    return command in o.commands or (command == TRAIN and RUN in o.commands)


def options_from(args: argparse.Namespace) -> Options:
    """A command's options: its --options file (if any), then the flags it was given; validated."""
    base = Options.read(args.options) if getattr(args, "options", None) else None
    return Options.from_args(args, base).validate()
