"""`wansync deploy` against real SSH servers: stand-in hosts are network namespaces running Debian's sshd
(emulation/standin.py), with a throwaway client key, host keys and known_hosts made here.

The whole flow runs over real SSH: the offline install from the wheelhouse (each host has its own
workdir, so it really runs), the secret (0600, never on a command line), the scheduler on the first
host, agents, --shape tc on the hosts' NICs, a remote SIGKILL mid-run, results and logs collected,
and nothing left behind. Per-destination classification is read from the kernel's class counters.

Skipped, with the reason, only where network namespaces cannot be made at all (not root, or a
container without CAP_SYS_ADMIN). Where they can, a missing sshd, ip or tc FAILS every test here:
CI must not pass without testing deploy against real sshd (tests/conftest.py prints the count).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.exact import assert_results_exact
from helpers.waiting import until_sync

from emulation import standin
from emulation.nicshape import NicShaper, ShapeError, check_replaceable, class_bytes
from emulation.tc import CLONE_NEWNET
from wansync.inventory import InventoryError, load, parse_hosts

WANSYNC = [sys.executable, "-m", "wansync.cli"]
N_HOSTS = 3
RUN = ["--topology", "hetero", "--nodes", str(N_HOSTS), "--scale", "0.01", "--rounds", "2"]


def _netns_works() -> str | None:
    probe = ("import ctypes, os\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             f"print(0 if libc.unshare({CLONE_NEWNET}) == 0 else os.strerror(ctypes.get_errno()))")
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    out = p.stdout.strip()
    return None if out == "0" else f"unshare(CLONE_NEWNET) failed: {out or p.stderr.strip()[-200:]}"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    why = _netns_works()
    return f"network namespaces do not work here ({why})" if why else None


SKIP = _skip_reason()
BROKEN = None if SKIP else standin.unavailable()  # root and netns work: a missing sshd is a failure
needs_hosts = pytest.mark.skipif(SKIP is not None, reason=f"stand-in hosts: {SKIP}")
# a deploy builds a wheelhouse, installs on every host and runs over SSH: each test bounds its own
# commands (180-300 s); pytest's default 120 s would cut a slow but healthy deploy on a busy machine
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[standin.StandinHosts]:
    yield from standin_hosts(tmp_path_factory, N_HOSTS)


def standin_hosts(tmp_path_factory: pytest.TempPathFactory, n: int) -> Iterator[standin.StandinHosts]:
    """n stand-in hosts, set up; torn down when the generator is closed, and their disks removed (an install
    prefix with torch is about 1 GB, and pytest keeps its last temporary directories)."""
    if BROKEN is not None:
        pytest.fail(f"root and network namespaces work here, yet stand-in hosts cannot run: {BROKEN}", pytrace=False)
    root = _host_disks(tmp_path_factory)
    try:
        h = standin.StandinHosts(n, root)
        h.setup()
    except standin.StandinError as exc:
        pytest.fail(f"stand-in hosts cannot run: sshd did not start: {exc}", pytrace=False)
    yield h
    h.teardown()
    shutil.rmtree(root, ignore_errors=True)


SHM = Path("/dev/shm")


def _host_disks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in hosts' disks: in memory where /dev/shm is a tmpfs, else under pytest's base directory.
    Three parallel installs of wansync with torch (~1 GB each) took 67 s on this 2-core machine's disk and
    55 s in memory; what a test checks is the install, not the disk."""
    if os.path.ismount(SHM) and os.access(SHM, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="wansync-standin-", dir=SHM))
    return tmp_path_factory.mktemp("standin")


def inventory(hosts: standin.StandinHosts, path: Path, **overrides: str) -> Path:
    lines = ["[defaults]", 'user = "root"', f'identity = "{hosts.client_key}"', ""]
    for i, h in enumerate(hosts.hosts):
        entry = {"host": h.address, "name": h.name, "workdir": str(h.workdir)}
        entry.update({k.removeprefix(f"h{i}_"): v for k, v in overrides.items() if k.startswith(f"h{i}_")})
        lines += ["[[hosts]]"] + [f'{k} = "{v}"' for k, v in entry.items()] + [""]
    path.write_text("\n".join(lines))
    return path


def deploy(hosts: standin.StandinHosts, tmp: Path, *args: str, inv: Path | None = None,
           known: Path | None = None) -> list[str]:
    return WANSYNC + ["deploy", "--inventory", str(inv or inventory(hosts, tmp / "hosts.toml")), "--known-hosts",
                      str(known or hosts.known_hosts), "--out", str(tmp / "out"), *args]


def left_behind(hosts: standin.StandinHosts) -> dict[str, list]:
    """What is still on the hosts: processes other than their sshd, htb classes, run-dir files."""
    sshd = {h.sshd.pid for h in hosts.hosts if h.sshd is not None}

    def others() -> list[str]:
        found = []
        for i in range(len(hosts.hosts)):
            for pid in hosts.pids(i):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if pid not in sshd and "sshd" not in cmd:
                    found.append(f"h{i}: {pid} {cmd[:100]}")
        return found
    try:  # the launcher has exited; what it ended may take a moment to be reaped
        until_sync(lambda: not others(), "processes on the stand-in hosts to end", timeout=15)
    except AssertionError:
        pass
    classes = [f"h{i}: {line}" for i in range(len(hosts.hosts))
               for line in subprocess.run(hosts.exec_prefix(i) + ["tc", "class", "show", "dev", "eth0"],
                                          capture_output=True, text=True).stdout.splitlines() if line.strip()]
    files = [str(p) for h in hosts.hosts if (h.workdir / "runs").exists() for p in (h.workdir / "runs").rglob("*")]
    return {"processes": others(), "tc_classes": classes, "run_dir_files": files}


class Watch:
    """While a deploy runs: every process's command line on the hosts, the secret file's mode, and the
    dashboard URL it prints (fetched once)."""

    def __init__(self, hosts: standin.StandinHosts, proc: subprocess.Popen, secret: str) -> None:
        self.hosts, self.proc, self.secret = hosts, proc, secret
        self.cmdlines: set[str] = set()
        self.secret_modes: set[int] = set()
        self.key_modes: set[int] = set()
        self.rates: set[tuple[str, str]] = set()  # (classid, htb rate) seen on h0's NIC
        self.stderr: list[str] = []
        self.dashboard: dict | None = None
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._read, daemon=True),
                        threading.Thread(target=self._poll, daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            m = re.search(r"dashboard: (http://\S+/)", line)
            if m and self.dashboard is None:
                try:
                    with urllib.request.urlopen(m.group(1) + "api/cluster", timeout=10) as r:
                        self.dashboard = json.loads(r.read())
                except OSError as exc:
                    self.dashboard = {"error": str(exc)}

    def _poll(self) -> None:
        while not self.stop.is_set():
            for i, h in enumerate(self.hosts.hosts):
                for pid in self.hosts.pids(i):
                    try:
                        self.cmdlines.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
                    except OSError:
                        pass
                for name, modes in (("secret", self.secret_modes), ("tls/key.pem", self.key_modes)):
                    for f in (h.workdir / "runs").glob(f"*/{name}") if (h.workdir / "runs").exists() else ():
                        try:
                            modes.add(stat.S_IMODE(f.stat().st_mode))
                        except OSError:
                            pass
            show = subprocess.run(self.hosts.exec_prefix(0) + ["tc", "class", "show", "dev", "eth0"],
                                  capture_output=True, text=True).stdout
            self.rates |= set(re.findall(r"class htb (\S+) .*?rate (\S+)", show))
            self.stop.wait(0.05)

    def agents(self) -> set[int]:
        """The nodes whose agent process was seen."""
        return {int(m.group(1)) for c in list(self.cmdlines) if "wansync.cli agent" in c
                for m in [re.search(r"--node (\d+)", c)] if m}

    def finish(self, timeout: float = 240) -> str:
        hung = False
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            hung = True
        finally:
            self.end()
        self.stop.set()
        for t in self.threads:
            t.join(10)
        err = "".join(self.stderr)
        # a launcher that never ended fails with what it printed, so a stall in CI can be read from the log
        assert not hung, f"deploy still running after {timeout:.0f} s; its stderr ended:\n{err[-6000:]}"
        return err

    def end(self) -> None:
        """A test that failed before the launcher exited still leaves nothing running: Ctrl-C, then kill."""
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_deploy_whole_flow_over_real_ssh(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    """Install, secret, scheduler on h0, agents, tc shaping, a remote SIGKILL of node 2's agent in
    round 1 of ring, results + logs collected, exact rounds, nothing left behind."""
    from helpers.tls import self_signed_cryptography as _self_signed_cryptography

    secret = "s3cret-" + secrets.token_hex(16)
    sf = tmp_path / "secret"
    sf.write_text(secret)
    sf.chmod(0o600)
    tls = _self_signed_cryptography(tmp_path)  # one CA-signed (self-signed CA) certificate for every node
    cmd = deploy(hosts, tmp_path, *RUN, "--schemes", "ring,netstorm", "--shape", "tc", "--secret-file", str(sf),
                 "--fault", "kill:node=2@round=1,scheme=ring", "--http", "127.0.0.1:0",
                 "--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = Watch(hosts, proc, secret)
    err = watch.finish()
    out = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, f"deploy failed ({proc.returncode}):\n{err[-3000:]}\n{out[-2000:]}"
    # the install really ran on every host, into its own prefix, from the offline wheelhouse
    for h in hosts.hosts:
        facts = json.loads((tmp_path / "out" / "logs" / f"{h.name}.json").read_text())
        assert facts["install"] == "installed", facts
        assert (h.workdir / "venv" / ".wansync-build").exists()
        assert facts["shaped"] is not None and facts["shaped"]["dev"] == "eth0", facts
    # the agents and scheduler ran, the secret stayed off every command line and was 0600 on disk
    assert watch.agents() == set(range(N_HOSTS)), watch.cmdlines
    assert any("wansync.cli scheduler" in c for c in watch.cmdlines)
    assert not [c for c in watch.cmdlines if secret in c], "the cluster secret appeared on a command line"
    assert watch.secret_modes == {0o600}, f"secret file modes seen: {watch.secret_modes}"
    assert watch.key_modes == {0o600}, f"TLS key modes seen: {watch.key_modes}"
    # every process read the run's options from its host's copy, not from flags rebuilt field by field
    procs = [c for c in watch.cmdlines if "wansync.cli agent" in c or "wansync.cli scheduler" in c]
    assert procs and all("--options" in c and "--tls-ca" not in c and "--topology" not in c for c in procs), procs
    assert watch.dashboard is not None and "error" not in watch.dashboard, watch.dashboard
    # results: every round exact (judged here from the plans in the file), every host's records and logs
    res = tmp_path / "out" / "results.jsonl"
    assert assert_results_exact(res) >= 6
    recs = [json.loads(x) for x in res.read_text().splitlines()]
    agent_recs = {r["node"]: r for r in recs if r["type"] == "agent"}
    assert sorted(agent_recs) == list(range(N_HOSTS))
    for n, r in agent_recs.items():  # --advertise: the host's address, not the 0.0.0.0 it listens on
        assert r["host"] == hosts.hosts[n].address and r["port"] == 7071, r
        assert r["clock_offset_s"] is not None and r["clock_error_s"] is not None, r
    measured = [r for r in recs if r["type"] == "task" and not r["warmup"]]
    assert {r["scheme"] for r in measured} == {"ring", "netstorm"} and len(measured) == 4
    kills = [r for r in recs if r["type"] == "fault" and r["action"] == "inject"]
    assert kills and "error" not in kills[0], kills
    assert any(r["type"] == "event" and r["kind"] == "agent_lost" and r["data"]["node"] == 2 for r in recs)
    assert "host h2 (node 2): agent ended" in err and "SIGKILL" in err, err[-2000:]
    for h in hosts.hosts:
        assert (tmp_path / "out" / "logs" / f"{h.name}-agent-{h.name[1:]}.log").exists()
    assert (tmp_path / "out" / "logs" / "h0-scheduler.log").exists()
    assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_each_peer_has_its_own_class(hosts: standin.StandinHosts) -> None:
    """The classes --shape tc builds: bytes to h1 land in h1's class only, bytes to h2 in h2's, and
    nothing beats a class's rate (an upper bound: a shaper is never beaten, however loaded the machine)."""
    rates = {hosts.hosts[1].address: 40.0, hosts.hosts[2].address: 20.0}
    shaper = NicShaper("eth0", dict(rates))
    subprocess.run(hosts.exec_prefix(0) + ["tc", "-batch", "-"], input="\n".join(shaper.setup()) + "\n", text=True,
                   check=True, capture_output=True)
    try:
        before = class_bytes(_classes(hosts, 0))
        sent = {1: 3_000_000, 2: 1_000_000}
        took = {}
        for j, n in sent.items():
            took[j] = _send(hosts, 0, j, n)
        after = class_bytes(_classes(hosts, 0))
        for j, n in sent.items():
            cid = shaper.classids[hosts.hosts[j].address]
            got = after[cid] - before.get(cid, 0)
            assert n <= got <= n * 1.1 + 20_000, f"class {cid} (to h{j}) carried {got} bytes for {n} sent"
            # in `took` s a class passes at most its rate's bytes, its bucket (2 ms) and the one packet htb lets
            # past an empty bucket (it charges a packet once sent): with GSO on the veth, up to 64 KiB, which on a
            # loaded machine took 1 MB to h2 to 21.0 Mbit/s for 20
            allowed = rates[hosts.hosts[j].address] * 1e6 / 8 * took[j] * 1.05 + GSO_MAX
            assert n <= allowed, f"to h{j}: {n * 8 / took[j] / 1e6:.1f} Mb/s beat its class ({n} bytes > {allowed:.0f})"
    finally:
        subprocess.run(hosts.exec_prefix(0) + ["tc", "-batch", "-"], input="\n".join(shaper.teardown()) + "\n",
                       text=True, capture_output=True)
    assert class_bytes(_classes(hosts, 0)) == {}


GSO_MAX = 65_536  # the largest packet a veth with GSO hands its qdisc


def _classes(hosts: standin.StandinHosts, i: int) -> str:
    return subprocess.run(hosts.exec_prefix(i) + ["tc", "-s", "class", "show", "dev", "eth0"], capture_output=True,
                          text=True, check=True).stdout


SINK = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5302)); s.listen()
print("ready", flush=True)
c, _ = s.accept(); n = 0
while k := c.recv(1 << 16):
    n += len(k)
print(n, flush=True)
"""
SOURCE = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5302), timeout=30); t = time.monotonic()
s.sendall(b"x" * int(sys.argv[2])); s.shutdown(socket.SHUT_WR); s.recv(1); print(time.monotonic() - t, flush=True)
"""


def _send(hosts: standin.StandinHosts, src: int, dst: int, nbytes: int) -> float:
    """nbytes over TCP from host src to host dst; seconds until the receiver had them all."""
    sink = subprocess.Popen(hosts.exec_prefix(dst) + [sys.executable, "-c", SINK, hosts.hosts[dst].address],
                            stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
    src_p = subprocess.run(hosts.exec_prefix(src) + [sys.executable, "-c", SOURCE, hosts.hosts[dst].address,
                                                      str(nbytes)], capture_output=True, text=True, timeout=120)
    assert int(sink.communicate(timeout=60)[0].strip()) == nbytes
    return float(src_p.stdout.strip())


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_scheduler_here_and_installed_hosts_not_reinstalled(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    """--scheduler-here: the scheduler in the launcher, agents over SSH dial it on the bridge; hosts that
    hold this build already are not installed again."""
    cmd = deploy(hosts, tmp_path, *RUN, "--schemes", "ring", "--scheduler-here", "--no-http")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert assert_results_exact(tmp_path / "out" / "results.jsonl") >= 2
    installs = {json.loads((tmp_path / "out" / "logs" / f"{h.name}.json").read_text())["install"]
                for h in hosts.hosts}
    assert installs in ({"up to date"}, {"installed"}, {"installed", "up to date"})
    assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_deploy_hands_every_process_the_whole_options(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    """The bug this replaced: the scheduler on the first host got a command line rebuilt field by field
    and lost --progress, --staleness and more (deploy --progress ssp ran BSP). Now the scheduler there
    reads the options file; every run option given here is in what it recorded, and the jobs ran SSP."""
    given = {"progress": ("--progress", "ssp", "ssp"), "staleness": ("--staleness", "1", 1),
             "gc": ("--agent-gc", "default", "default"), "hold_budget_mb": ("--hold-budget-mb", "64", 64.0),
             "primary_busy_bound": ("--primary-busy-bound", "3", 3), "eta": ("--eta", "0.5", 0.5),
             "heartbeat_timeout_s": ("--heartbeat-timeout", "4", 4.0), "compute_model": (
                 "--compute-model", "constant:0.01", "constant:0.01")}
    argv = [x for flag, value, _ in given.values() for x in (flag, value)]
    cmd = deploy(hosts, tmp_path, *RUN, "--schemes", "mcast", "--no-http", *argv)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    [run] = [r for r in recs if r["type"] == "run"]
    seen = {name: value for group in run["options"].values() if isinstance(group, dict)
            for name, value in group.items()}
    seen["progress"] = run["options"]["progress"]["model"]
    for name, (flag, _, want) in given.items():
        assert seen[name] == want, f"{flag}: the scheduler on h0 recorded {seen[name]!r}, not {want!r}"
    jobs = [r for r in recs if r["type"] == "job"]
    assert jobs and all(j["progress"] == "ssp" and j["scheme"] == "mcast" for j in jobs), jobs
    assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}


def _fails(cmd: list[str], *needles: str) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert p.returncode != 0, f"expected a failure, got exit 0:\n{p.stderr[-2000:]}"
    for n in needles:
        assert n in p.stderr, f"{n!r} not in:\n{p.stderr[-2000:]}"
    return p.stderr


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_clear_errors_name_the_host(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    """Unreachable host, auth failure, unknown and changed host keys, missing Python: one line each,
    naming the host; nothing is started anywhere."""
    h1 = hosts.hosts[1]
    # unreachable: nothing listens on the bridge's own address, port 22
    inv = inventory(hosts, tmp_path / "a.toml", h1_host=hosts.gateway, h1_name="gw")
    _fails(deploy(hosts, tmp_path, *RUN, inv=inv), "host gw", "cannot reach its SSH server")
    # a key the hosts do not know
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    inv = inventory(hosts, tmp_path / "b.toml", h1_identity=str(other))
    _fails(deploy(hosts, tmp_path, *RUN, inv=inv), f"host {h1.name}", "SSH authentication failed")
    # known_hosts without the hosts: refused, unless --accept-new-host-keys (then written down)
    empty = tmp_path / "known_empty"
    empty.write_text("")
    _fails(deploy(hosts, tmp_path, *RUN, known=empty), "host h0", "host key not trusted")
    # a host whose key changed: refused even with --accept-new-host-keys
    wrong = tmp_path / "known_wrong"
    lines = hosts.known_hosts.read_text().splitlines()
    fake = Path(str(other) + ".pub").read_text().split()
    wrong.write_text("\n".join(lines[:1] + [f"{h1.address} {fake[0]} {fake[1]}"] + lines[2:]) + "\n")
    _fails(deploy(hosts, tmp_path, *RUN, "--accept-new-host-keys", known=wrong), f"host {h1.name}", "CHANGED")
    # no such Python on a host
    inv = inventory(hosts, tmp_path / "c.toml", h1_python="python3.99")
    _fails(deploy(hosts, tmp_path, *RUN, inv=inv), f"host {h1.name}", "no Python", "python3.99")
    assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_accept_new_host_keys_writes_known_hosts(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    from wansync.inventory import HostSpec
    from wansync.remote import Remote

    known = tmp_path / "known"
    import asyncio

    async def connect() -> None:
        r = Remote(HostSpec(hosts.hosts[0].address, user="root", identity=str(hosts.client_key)), known_hosts=known,
                   accept_new=True)
        await r.connect()
        r.close()
        r2 = Remote(HostSpec(hosts.hosts[0].address, user="root", identity=str(hosts.client_key)), known_hosts=known)
        await r2.connect()  # now known: the strict check passes
        r2.close()
    asyncio.run(connect())
    assert hosts.hosts[0].address in known.read_text()


def _block(hosts: standin.StandinHosts, i: int, port: int) -> subprocess.Popen:
    """A listener on host i's port, as another program holding it would be: it holds the port until
    its stdin closes (or it is killed)."""
    p = subprocess.Popen(hosts.exec_prefix(i) + [sys.executable, "-c",
                         "import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
                         "socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen();"
                         " print('ready', flush=True); sys.stdin.read()", str(port)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_port_in_use_and_a_clean_after_a_dead_launcher(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    """A host whose agent port, or the scheduler's, is taken: the run fails naming it. Then a dead
    launcher's leftovers (a process, the NIC's shaping, the run dir) are removed by `--clean`."""
    h1 = hosts.hosts[1]
    for i, port, needles in ((1, 7071, (f"host {h1.name}", "in use")),
                             (0, 7070, ("host h0", "scheduler did not start", "in use"))):
        blocker = _block(hosts, i, port)
        try:
            _fails(deploy(hosts, tmp_path, *RUN, "--schemes", "ring", "--no-http"), *needles)
        finally:
            blocker.kill()
            blocker.wait()
        assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}
    # a launcher that died: its run dir, an agent-like process with its pid file, the NIC shaped
    run = h1.workdir / "runs" / f"{socket.gethostname()}-999999999-dead00"
    run.mkdir(parents=True)
    sleeper = subprocess.Popen(hosts.exec_prefix(1) + ["sleep", "600"])
    (run / "agent-1.pid").write_text(f"{sleeper.pid}\n")
    shaper = NicShaper("eth0", {hosts.hosts[0].address: 10.0})
    subprocess.run(hosts.exec_prefix(1) + ["tc", "-batch", "-"], input="\n".join(shaper.setup()) + "\n", text=True,
                   check=True)
    (run / "shape.json").write_text(json.dumps(shaper.to_json()))
    p = subprocess.run(WANSYNC + ["deploy", "--clean", "--inventory", str(inventory(hosts, tmp_path / "i.toml")),
                                  "--known-hosts", str(hosts.known_hosts)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "removed run" in p.stderr and "shaping of eth0" in p.stderr, p.stderr
    assert sleeper.wait(10) == -9
    assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}


@pytest.mark.root
@pytest.mark.sshd
@needs_hosts
def test_ctrl_c_tears_everything_down(hosts: standin.StandinHosts, tmp_path: Path) -> None:
    """--shape tc follows the trace (the classes' rates change at the trace's step), then Ctrl-C
    (SIGINT) mid-run: processes ended, shaping removed, run dirs deleted, logs collected."""
    cmd = deploy(hosts, tmp_path, "--topology", "hetero", "--nodes", str(N_HOSTS), "--scale", "0.01", "--rounds",
                 "100000", "--schemes", "ring", "--shape", "tc", "--no-http", "--trace", "steps:100=0.5")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = Watch(hosts, proc, "-")
    try:
        _wait_for_trace_step(watch)
    except BaseException:
        watch.end()
        raise
    proc.send_signal(2)
    err = watch.finish(timeout=90)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert (tmp_path / "out" / "results.jsonl").exists() and (tmp_path / "out" / "logs" / "h1-agent-1.log").exists()
    assert left_behind(hosts) == {"processes": [], "tc_classes": [], "run_dir_files": []}


def _wait_for_trace_step(watch: Watch) -> None:
    until_sync(lambda: len(watch.agents()) == N_HOSTS and any("ring round 1:" in x for x in watch.stderr),
               "rounds running on every host", timeout=120)
    # the step at 100 s x 0.01 = 1 s after the job's start halves every link: each class shows two rates
    until_sync(lambda: len({cid for cid, _ in watch.rates}) == N_HOSTS - 1
               and all(len({r for c, r in watch.rates if c == cid}) >= 2 for cid, _ in watch.rates),
               "h0's classes to change rate at the trace's step", timeout=60)


# --- no namespaces needed -------------------------------------------------------------------------------------
@pytest.mark.unit
def test_inventory_and_host_lists(tmp_path: Path) -> None:
    specs = parse_hosts("alice@h1,h2:2222,bob@[fe80::1]:23")
    assert [(s.user, s.host, s.port) for s in specs] == [("alice", "h1", 22), (None, "h2", 2222),
                                                          ("bob", "fe80::1", 23)]
    inv = tmp_path / "i.toml"
    inv.write_text('[defaults]\nuser = "u"\nagent_port = 9000\n[[hosts]]\nhost = "a"\n[[hosts]]\nhost = "a"\n'
                   'agent_port = 9001\n')
    a, b = load(inv)
    assert (a.user, a.agent_port, b.agent_port) == ("u", 9000, 9001)
    assert a.name != b.name  # two agents on one machine are told apart
    for bad, why in (('[[hosts]]\nhost = "a"\nport = "x"\n', "port"), ('[[hosts]]\nhots = "a"\n', "unknown field"),
                     ('[[hosts]]\nhost = "a; rm -rf /"\n', "characters"), ("[defaults]\n", "at least one")):
        inv.write_text(bad)
        with pytest.raises(InventoryError, match=why):
            load(inv)


@pytest.mark.unit
def test_nic_shaper_commands() -> None:
    s = NicShaper("eth0", {"10.0.0.3": 20.0, "10.0.0.2": 40.0}, mtu=1500)
    cmds = s.setup()
    assert cmds[0] == "qdisc replace dev eth0 root handle 1: htb default 0"  # unclassified traffic: unshaped
    assert s.classids == {"10.0.0.2": "1:10", "10.0.0.3": "1:11"}
    assert any("match ip dst 10.0.0.2/32 flowid 1:10" in c for c in cmds)
    assert any("match ip dst 10.0.0.3/32 flowid 1:11" in c for c in cmds)
    assert s.change({"10.0.0.3": 5.0})[0].startswith("class change dev eth0 parent 1: classid 1:11 htb rate ")
    assert s.teardown() == ["qdisc del dev eth0 root"]
    with pytest.raises(ShapeError, match="not an IP"):
        NicShaper("eth0", {"peer.example": 1.0})
    with pytest.raises(ShapeError, match="interface name"):
        NicShaper("eth0; reboot", {"10.0.0.2": 1.0})
    check_replaceable("qdisc fq_codel 0: root refcnt 2 limit 10240p\n", "eth0")
    with pytest.raises(ShapeError, match="already has a htb"):
        check_replaceable("qdisc htb 1: root refcnt 2 r2q 10 default 0\n", "eth0")
    assert class_bytes(" class htb 1:10 root leaf 10: prio 0 rate 41Mbit\n  Sent 1234 bytes 5 pkt (dropped 0)\n"
                       "class htb 1:11 root leaf 11: prio 0\n Sent 99 bytes 1 pkt\n") == {"1:10": 1234, "1:11": 99}
