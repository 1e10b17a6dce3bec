"""What a live round pays outside link transfer, as constants of this data plane.

A link's bytes are the simulator's main business; on dense meshes with many roots and small chunks
the rest shows too (a round of 20 KB chunks moves each in about a millisecond):

- the barrier's replies: the scheduler answers a round's topology requests one agent after the
  other once everybody asked, and a round runs from the first agent's start, so the k-th agent to
  hear starts about k x `start_skew_s` later;
- an agent's round setup (`setup_s`): its contribution in, its roles from the plan, held frames
  replayed, before its first chunk is on the wire;
- a chunk's handling at every node it crosses (`hop_s`): its last byte read, summed in, the next
  transfer queued, cut into segments and pieces and written by the wire clock (overlay/delayline.py:
  at most FLUSH_GRAIN_S late). Store-and-forward steps pay it each time, so a tree's links idle for
  it between chunks when the pipeline is shallow; a relay (cut-through) pays it per segment;
- an acknowledgement's handling (`ack_s`): it only matters where a sender counts chunks in transit
  (NetStorm's auxiliary dispatch).

Each constant is measured by a microbenchmark of the data plane (`python scripts/bench/capacity.py
--parts dataplane`: chains of real agent processes carrying one small chunk over links too fast to
matter, and the spread of the agents' start times), never fitted to the round times the simulator is
judged on. It does not model CPU starvation: a starved run is the fidelity guard's business.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WanCosts:
    start_skew_s: float = 0.0  # per agent, in the order the barrier's replies reach them
    setup_s: float = 0.0  # from an agent's start to its first chunk on the wire
    hop_s: float = 0.0  # from a chunk complete (or ready) at a node to its first byte on the next link
    ack_s: float = 0.0  # an ack's handling, on top of the two link delays

    def start_offsets(self, n: int) -> list[float]:
        """When each of n participants (in id order) begins sending, from the round's start."""
        return [k * self.start_skew_s + self.setup_s for k in range(n)]


NONE = WanCosts()
# Measured on the project's 2-core machine, load average 1-3 (python scripts/bench/capacity.py --parts
# dataplane, three runs, medians: chains of 3 and 8 agents, a 4 KB chunk over 1 Gbit/s links without
# delay: handling 0.57-0.75 ms per hop, start skew 0.16-0.24 ms per agent, setup below what the chains
# resolve; a busy 100 Mbit/s link's pieces written 0.17-0.22 ms after they were due (the wire clock)).
MEASURED = WanCosts(start_skew_s=0.0002, setup_s=0.0, hop_s=0.0009, ack_s=0.0009)
