"""The agents' garbage-collector policy (agents/gcpolicy.py): what it changes, and that it refuses
what it does not know. The speed it buys is measured by the benchmarks, never asserted here."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from agents import gcpolicy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def restore_gc():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.unit
def test_tuned_freezes_what_exists_and_raises_the_young_threshold(restore_gc):
    gc.unfreeze()
    kept = [object() for _ in range(10)]  # noqa: F841 - alive across the freeze
    gcpolicy.apply("tuned")
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == gcpolicy.THRESHOLDS and gcpolicy.THRESHOLDS[0] > 700


@pytest.mark.unit
def test_default_leaves_python_alone(restore_gc):
    gc.unfreeze()
    before = gc.get_threshold()
    gcpolicy.apply("default")
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


@pytest.mark.unit
def test_an_unknown_policy_is_refused(restore_gc):
    before = gc.get_threshold()
    with pytest.raises(ValueError, match="tuned, default"):
        gcpolicy.apply("aggressive")
    assert gc.get_threshold() == before


@pytest.mark.loopback
def test_the_agent_command_line_refuses_an_unknown_policy():
    out = subprocess.run([sys.executable, "-m", "wansync.cli", "agent", "--node", "0", "--scheduler", "127.0.0.1:1",
                          "--cluster", "c", "--agent-gc", "aggressive"], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 2 and "--agent-gc" in out.stderr and "aggressive" in out.stderr
