"""The four markers every test carries (pyproject.toml registers them; docs/getting-started.md "Tests" says how to run
each), and where tests/conftest.py keeps what was collected so that tests/test_markers.py can check."""

from __future__ import annotations

import pytest

MARKERS = {
    "unit": "no sockets, no processes: pure code, fake clocks and transports, the simulator",
    "loopback": "real TCP on 127.0.0.1 or real processes (agents, wansync run)",
    "root": "needs root: network namespaces, veth, tc (the kernel backend, stand-in hosts)",
    "sshd": "wansync deploy against sshd in stand-in hosts",
}
# node id -> names of its markers, for every test collected (before -m deselects any)
COLLECTED = pytest.StashKey[dict[str, set[str]]]()
