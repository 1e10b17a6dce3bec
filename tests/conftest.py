import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
from helpers.fixtures import cluster_of, recording_wire, secret  # noqa: E402, F401  (fixtures for every test)
from helpers.markers import COLLECTED  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    """Keep every collected test's markers before -m deselects any (tests/test_markers.py checks them)."""
    config.stash[COLLECTED] = {item.nodeid: {m.name for m in item.iter_markers()} for item in items}


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    """Say how many kernel (tc backend) and stand-in host (sshd) tests ran, or why they were skipped:
    CI logs must show it."""
    for path, label in (("tests/test_tc.py", "tc backend"), ("tests/test_hosts.py", "stand-in host (sshd)")):
        _summary(terminalreporter, path, label)


def _summary(terminalreporter, path: str, label: str) -> None:  # noqa: ANN001
    counts: dict[str, int] = {}
    reasons: set[str] = set()
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            if getattr(rep, "nodeid", "").startswith(path) and rep.when in ("call", "setup"):
                if outcome == "passed" and rep.when == "setup":
                    continue
                counts[outcome] = counts.get(outcome, 0) + 1
                if outcome == "skipped" and isinstance(rep.longrepr, tuple):
                    reasons.add(str(rep.longrepr[2]))
                elif outcome == "error" and "cannot run" in str(rep.longrepr):
                    reasons.add(str(rep.longrepr).strip().splitlines()[-1].removeprefix("Failed: "))
    if counts:
        line = ", ".join(f"{n} {k}" for k, n in counts.items())
        why = f" ({'; '.join(sorted(reasons))})" if reasons else ""
        terminalreporter.write_line(f"{label} tests: {line}{why}")
