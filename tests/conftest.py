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


# the files with root tests: under pytest-xdist (scripts/test.sh runs two workers) they run one after another
# on one worker, because each builds stand-in hosts (a torch install each) or namespaces shaped by the
# machine's own kernel; tests/test_markers.py checks that every root test is in one of them
ROOT_FILES = ("tests/test_tc.py", "tests/test_hosts.py", "tests/test_deploy_train.py", "tests/test_train_cli.py")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it (-p no:xdist) nothing calls it
def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001, ANN201
    """Files go to workers whole (module fixtures are set up once), the root files together as one unit.
    (xdist's own `loadgroup` does not group on pytest 9.2: it renames items through an attribute pytest
    no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class FilesRootTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "root" if path in ROOT_FILES else path
    return FilesRootTogether(config, log)


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
