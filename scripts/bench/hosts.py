"""`wansync deploy` against real SSH servers: 4 stand-in hosts (network namespaces running Debian's sshd,
emulation/standin.py), the whole flow over SSH, one agent's host process killed mid-run.

What it does: builds the hosts (throwaway client key, host keys, known_hosts; each host its own
workdir, so the offline install really runs), deploys `--schemes ring,netstorm --rounds 3 --shape tc`
with `--fault kill:node=3@round=2,scheme=ring` (a SIGKILL sent over SSH to node 3's agent process on
its host; the scheduler handles it as a lost agent and goes on with three; the agent is NOT
restarted), reads every stand-in NIC's htb class counters while the run goes (each peer's bytes in
its own class), then judges the results directory and what is left on the hosts after teardown.

shaped_rate_error_pct: after the run, the very classes `--shape tc` builds (emulation/nicshape.py) on
host 0's NIC towards hosts 1 and 2, at the topology's rates of links 0->1 and 0->2, carry one bulk
TCP flow each at once for --seconds; the worst |goodput - rate| / rate.

Prints a table, then one JSON line last (the check ../shared/checks/hosts reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from emulation.nicshape import NicShaper, class_bytes  # noqa: E402
from emulation.standin import StandinHosts  # noqa: E402
from emulation.topology import build  # noqa: E402

RECV = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5301)); s.listen()
print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); n = 0; t0 = t1 = None
while k := c.recv_into(buf):
    t1 = time.monotonic(); t0 = t0 or t1; n += k
print(n, (t1 or 0) - (t0 or 0), flush=True)
"""
SEND = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5301), timeout=10); data = b"x" * (1 << 16)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s.sendall(data)
s.close()
"""


def inventory(hosts: StandinHosts, path: Path) -> Path:
    lines = ["[defaults]", 'user = "root"', f'identity = "{hosts.client_key}"', ""]
    for h in hosts.hosts:
        lines += ["[[hosts]]", f'host = "{h.address}"', f'name = "{h.name}"', f'workdir = "{h.workdir}"', ""]
    path.write_text("\n".join(lines))
    return path


def poll_classes(hosts: StandinHosts, stop: threading.Event, seen: dict[str, dict[str, int]]) -> None:
    """Every 0.2 s each host's class counters; keeps the highest seen (teardown removes them)."""
    while not stop.is_set():
        for i, h in enumerate(hosts.hosts):
            out = subprocess.run(hosts.exec_prefix(i) + ["tc", "-s", "class", "show", "dev", "eth0"],
                                 capture_output=True, text=True).stdout
            for cid, n in class_bytes(out).items():
                seen.setdefault(h.name, {})[cid] = max(n, seen.get(h.name, {}).get(cid, 0))
        stop.wait(0.2)


def left_behind(hosts: StandinHosts, sshd_pids: list[int]) -> dict[str, int]:
    """Processes (other than each host's sshd), htb classes on the NICs, files in the run dirs."""
    deadline = time.monotonic() + 15  # sshd's per-connection processes leave as the sessions close
    while True:
        procs = sum(len([p for p in hosts.pids(i) if p not in sshd_pids and _is_not_sshd(p)])
                    for i in range(len(hosts.hosts)))
        if procs == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    classes = sum(len([x for x in subprocess.run(hosts.exec_prefix(i) + ["tc", "class", "show", "dev", "eth0"],
                                                 capture_output=True, text=True).stdout.splitlines() if x.strip()])
                  for i in range(len(hosts.hosts)))
    files = sum(len(list((h.workdir / "runs").rglob("*"))) if (h.workdir / "runs").exists() else 0
                for h in hosts.hosts)
    return {"processes": procs, "tc_classes": classes, "run_dir_files": files}


def _is_not_sshd(pid: int) -> bool:
    try:
        return "sshd" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def calibrate(hosts: StandinHosts, rates: dict[int, float], seconds: float) -> list[dict]:
    """Host 0's NIC shaped as deploy shapes it; one bulk flow to each peer at once; goodput vs rate."""
    shaper = NicShaper("eth0", {hosts.hosts[j].address: r for j, r in rates.items()})
    subprocess.run(hosts.exec_prefix(0) + ["tc", "-batch", "-"], input="\n".join(shaper.setup()) + "\n", text=True,
                   check=True, capture_output=True)
    try:
        recvs = {}
        for j in rates:
            p = subprocess.Popen(hosts.exec_prefix(j) + [sys.executable, "-c", RECV, hosts.hosts[j].address],
                                 stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            recvs[j] = p
        sends = [subprocess.Popen(hosts.exec_prefix(0) + [sys.executable, "-c", SEND, hosts.hosts[j].address,
                                                          str(seconds)]) for j in rates]
        for p in sends:
            p.wait(seconds + 30)
        out = []
        for j, p in recvs.items():
            n, dt = p.communicate(timeout=30)[0].split()
            goodput = int(n) * 8 / float(dt) / 1e6
            out.append({"peer": hosts.hosts[j].name, "rate_mbps": rates[j], "goodput_mbps": goodput,
                        "error_pct": abs(goodput - rates[j]) / rates[j] * 100})
        return out
    finally:
        subprocess.run(hosts.exec_prefix(0) + ["tc", "-batch", "-"], input="\n".join(shaper.teardown()) + "\n",
                       text=True, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the check's size (<= 5 min with a first install)")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--scale", type=float, default=None, help="default 0.01 quick, 0.05 full")
    ap.add_argument("--seconds", type=float, default=3.0, help="calibration flow length")
    ap.add_argument("--keep", type=Path, default=None, help="keep the results directory here")
    args = ap.parse_args()
    scale = args.scale or (0.01 if args.quick else 0.05)
    topology = "hetero"
    topo = build(topology, args.hosts, seed=1)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wansync-hosts-") as tmp, StandinHosts(args.hosts, Path(tmp)) as hosts:
        sshd_pids = [h.sshd.pid for h in hosts.hosts if h.sshd is not None]
        out = args.keep or Path(tmp) / "out"
        inv = inventory(hosts, Path(tmp) / "h.toml")
        cmd = [sys.executable, "-m", "wansync.cli", "deploy", "--inventory", str(inv),
               "--known-hosts", str(hosts.known_hosts), "--topology", topology, "--nodes", str(args.hosts),
               "--scale", str(scale), "--schemes", "ring,netstorm", "--rounds", "3", "--shape", "tc",
               "--fault", "kill:node=3@round=2,scheme=ring", "--out", str(out), "--no-http"]
        stop, seen = threading.Event(), {}
        poller = threading.Thread(target=poll_classes, args=(hosts, stop, seen), daemon=True)
        poller.start()
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=270)
        deploy_s = time.monotonic() - t0
        stop.set()
        poller.join()
        sys.stderr.write(p.stderr[-3000:])
        print(p.stdout[-4000:])
        left = left_behind(hosts, sshd_pids)
        records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] \
            if (out / "results.jsonl").exists() else []
        rounds = [r for r in records if r.get("type") == "task"]  # a round is the everyone-reduce task
        measured = [r for r in rounds if not r["warmup"]]
        ok = [r for r in measured if r["ok"] and r["digests_agree"] and r["versions_agree"]]
        wrong = [r for r in rounds if not r.get("aborted")
                 and not (r["ok"] and r["digests_agree"] and r["versions_agree"])]
        agents = {r["node"]: r for r in records if r.get("type") == "agent"}
        logs = out / "logs"
        per_host = {i: (i in agents and (logs / f"h{i}-agent-{i}.log").exists() and (logs / f"h{i}.json").exists())
                    for i in range(args.hosts)}
        kills = [r for r in records if r.get("type") == "fault" and r.get("action") == "inject"]
        lost = [r for r in records if r.get("type") == "event" and r.get("kind") == "agent_lost"]
        install = [json.loads((logs / f"h{i}.json").read_text())["install"] if (logs / f"h{i}.json").exists()
                   else None for i in range(args.hosts)]
        addrs = [h.address for h in hosts.hosts]
        hosts_by_addr = {h.address: h.name for h in hosts.hosts}
        cal = calibrate(hosts, {1: topo.links[(0, 1)].rate_mbps, 2: topo.links[(0, 2)].rate_mbps}, args.seconds)

    print(f"deploy to {args.hosts} sshd namespaces: exit {p.returncode} in {deploy_s:.1f} s (installs: "
          f"{', '.join(str(x) for x in install)}); load average {os.getloadavg()[0]:.2f}")
    print(f"{'host':>5} {'agent record':>12} {'clock offset s':>15} {'log':>4}  per-destination class bytes (run)")
    for i in range(args.hosts):
        a = agents.get(i, {})
        off = a.get("clock_offset_s")
        names = {cid: hosts_by_addr[a] for a, cid in NicShaper("eth0", {a: 1.0 for a in hosts_by_addr
                                                                     if a != addrs[i]}).classids.items()}
        classes = ", ".join(f"->{names.get(cid, cid)} {n / 1e6:.2f} MB"
                            for cid, n in sorted(seen.get(f"h{i}", {}).items()))
        print(f"{'h' + str(i):>5} {'yes' if i in agents else 'NO':>12} {'-' if off is None else f'{off:+.6f}':>15} "
              f"{'yes' if per_host[i] else 'NO':>4}  {classes}")
    faults = "; ".join(f"{k['kind']} node {k.get('node')} {k.get('error') or 'done'}" for k in kills) or "none"
    print(f"rounds: {len(ok)} measured exact, {len(wrong)} wrong; fault: {faults}; agents lost: {len(lost)} "
          "(not restarted)")
    for c in cal:
        print(f"shaped h0->{c['peer']}: {c['goodput_mbps']:.2f} Mb/s goodput for {c['rate_mbps']:.2f} configured "
              f"({c['error_pct']:.2f}%)")
    print(f"left behind: {left}")
    summary = {
        "hosts": len([i for i in range(args.hosts) if i in agents]),
        "deploy_exit": p.returncode, "deploy_s": round(deploy_s, 1), "installs": install,
        "rounds_ok": len(ok), "rounds_wrong": len(wrong), "rounds_total": len(rounds),
        "killed": [k.get("node") for k in kills if not k.get("error")], "agents_lost": len(lost),
        "killed_agent_restarted": False,
        "results_collected": bool(per_host) and all(per_host.values()),
        "clock_offsets_recorded": len(agents) == args.hosts and all(a.get("clock_offset_s") is not None
                                                                   for a in agents.values()),
        "class_bytes": seen,
        "left_behind": sum(left.values()), "left_behind_detail": left,
        "shaped_rate_error_pct": round(max(c["error_pct"] for c in cal), 2), "calibration": cal,
        "scale": scale, "load_avg": round(os.getloadavg()[0], 2), "elapsed_s": round(time.monotonic() - t_start, 1),
    }
    print(json.dumps(summary))
    return 0 if p.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
