"""torch is an extra: without it, every `wansync` command but the scripts' own `wansync.torch` loads.
`wansync deploy` once imported torch through the launcher's environment names (3.8 s per command, and an
ImportError where the extra is not installed). Each command's module is imported here in a fresh
process in which `import torch` fails, as on a machine without the extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.loopback  # real processes

BLOCK = "import sys; sys.modules['torch'] = None\n"  # `import torch` now raises ImportError


def _without_torch(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["run", "train", "deploy", "scheduler", "agent", "emu", "plot", "simulate",
                                     "advise", "reproduce"])
def test_every_command_loads_without_torch(command: str) -> None:
    p = _without_torch(f"sys.argv = ['wansync', {command!r}, '--help']\nfrom wansync.cli import main\nmain()")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "usage: wansync" in p.stdout


def test_the_launchers_modules_import_without_torch_and_wansync_torch_says_what_to_install() -> None:
    p = _without_torch("import wansync.deploy, wansync.train, agents.agent, scheduler.service; print('loaded')")
    assert p.returncode == 0 and "loaded" in p.stdout, p.stderr[-2000:]
    p = _without_torch("import wansync.torch")
    assert p.returncode != 0 and "wansync.torch needs PyTorch" in p.stderr, p.stderr[-2000:]
