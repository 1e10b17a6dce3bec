"""What the agents' own CPU costs per chunk and per byte: for plans and forecasts that must fit the cores
the agents share.

Measured with scripts/bench/capacity.py on the project's 2-core machine (CREW meshes, application
backend): 0.5 ms per chunk crossing one link on a quiet machine (both its ends: headers, pieces, acks,
wake-ups; 1-2 ms on a loaded one) and 2 s per GB crossing a link (copies, sums). Agents that need more
than CPU_BUDGET of their machine's cores queue behind each other (lag, run-queue waits, books): the
fidelity guard judges such runs invalid (wansync/guard.py), and chunk-cutting planners cut coarser
instead (scheduler/planners/cpufit.py).
"""

CPU_S_PER_CHUNK_HOP = 0.0005
CPU_S_PER_GB = 2.0
CPU_BUDGET = 0.75
