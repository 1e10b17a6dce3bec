"""`wansync deploy --train` on three stand-in hosts (network namespaces running sshd, emulation/standin.py):
does the README's example (examples/train_digits.py, a few steps) reach the target accuracy there?

`deploy_trained()` is what scripts/bench/torchpartial.py reports as `deploy_trained`. The hosts' install
prefixes live in ~/.cache/wansync/standin-train/ (a host with the same build and packages is not installed
again: the first call installs torch and scikit-learn from the offline wheelhouse, about 1.2 GB a host, later
ones only run),
the hosts themselves are made and removed per call. Needs root (network namespaces); without it the
answer is False and the reason is printed.

    sudo .venv/bin/python scripts/bench/deploytrain.py      # prints one JSON line
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from emulation.standin import StandinError, StandinHosts, unavailable  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_digits.py"
PREFIXES = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wansync" / "standin-train"
HOSTS = 3
TARGET = 0.75
STEPS = 60


def _inventory(hosts: StandinHosts, path: Path) -> Path:
    lines = ["[defaults]", 'user = "root"', f'identity = "{hosts.client_key}"', ""]
    for h in hosts.hosts:
        lines += ["[[hosts]]", f'host = "{h.address}"', f'name = "{h.name}"',
                  f'workdir = "{PREFIXES / h.name}"', ""]
    path.write_text("\n".join(lines))
    return path


def run(budget_s: float = 120.0, target: float = TARGET) -> dict:
    """One `deploy --train` on stand-in hosts within `budget_s`: what it reached, how long it took."""
    why = "not root: stand-in hosts need network namespaces" if os.geteuid() != 0 else unavailable()
    if why is not None:
        return {"trained": False, "why": why}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wansync-deploytrain-") as tmp:
        tmpd = Path(tmp)
        try:
            hosts = StandinHosts(HOSTS, tmpd / "hosts")
            hosts.setup()
        except StandinError as exc:
            return {"trained": False, "why": f"stand-in hosts: {exc}"}
        try:
            inv = _inventory(hosts, tmpd / "h.toml")
            cmd = [sys.executable, "-m", "wansync.cli", "deploy", "--inventory", str(inv),
                   "--known-hosts", str(hosts.known_hosts), "--out", str(tmpd / "out"), "--topology", "uniform:200",
                   "--schemes", "ring", "--no-http", "--train", str(EXAMPLE), "--train-package", "scikit-learn",
                   "--steps", str(STEPS), "--eval-every", "10", "--hidden", "64", "--lr", "0.1"]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, budget_s - 10), env=env)
            except subprocess.TimeoutExpired:
                return {"trained": False, "why": f"over the budget of {budget_s:.0f} s",
                        "seconds": time.monotonic() - t0}
            res = tmpd / "out" / "results.jsonl"
            recs = [json.loads(x) for x in res.read_text().splitlines()] if res.exists() else []
            runs = [r for r in recs if r.get("type") == "train_run"]
            acc = runs[-1]["final_accuracy"] if runs else None
            ok = p.returncode == 0 and acc is not None and acc >= target and runs[-1]["syncs_wrong"] == 0
            out = {"trained": bool(ok), "final_accuracy": acc, "target": target, "rc": p.returncode,
                   "seconds": round(time.monotonic() - t0, 1)}
            if not ok:
                out["why"] = p.stderr.strip()[-600:]
            return out
        finally:
            hosts.teardown()


def deploy_trained(budget_s: float = 120.0) -> bool:
    """Did the stand-in hosts' `deploy --train` run reach the target accuracy (within `budget_s`)?"""
    r = run(budget_s)
    if not r["trained"]:
        print(f"deploy_trained: no ({r.get('why', '')})", file=sys.stderr)
    return bool(r["trained"])


if __name__ == "__main__":
    print(json.dumps(run()))
