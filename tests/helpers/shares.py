"""Byte shares of two concurrent tasks at a receiver, judged only over an interval in which both were
backlogged. The agents record, for each task, the other tasks' bytes at its first byte and at its end
(TaskRecord.beside). A share read over an interval where one of them had not begun yet (a start a
loaded machine delays by tens of milliseconds) measures the start skew, not the sharing: so the other
task must already have delivered bytes when the measured one's first byte came, and must still run
when the measured one ends (it ends later)."""

from __future__ import annotations

from typing import Any


def shares_at(rec_first: Any, other_task: int, node: int) -> tuple[int, int]:
    """(bytes of the first-done task, bytes of the other) delivered at `node` while both were received."""
    at_first, at_end = rec_first.beside[node][other_task]
    return rec_first.bytes, at_end - at_first


def backlogged_shares(rec_first: Any, rec_other: Any, node: int) -> tuple[int, int]:
    """shares_at, over an interval where both tasks were backlogged at `node`: from the first-done task's
    first byte (the other had delivered some already) to its last (the other was not over yet)."""
    at_first, _ = rec_first.beside[node][rec_other.task]
    assert at_first > 0, ("the other task had delivered nothing when this one's first byte came: "
                          "start it first and this one once its bytes arrive")
    assert rec_first.t_end < rec_other.t_end, "the other task ended first: it was not backlogged throughout"
    return shares_at(rec_first, rec_other.task, node)
