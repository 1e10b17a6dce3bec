"""What tests share, so that no test file imports another (tests/conftest.py puts tests/ on sys.path and
wires the fixtures of helpers/fixtures.py):

- secret.py: the one cluster secret every authenticated test cluster uses (and a wrong one).
- cluster.py: the one cluster harness — a scheduler in this process and its agents, in this process or
  as `wansync agent` processes — and LocalNet, agents' data planes alone (no scheduler).
- exact.py: the exact sums results are compared with, computed here, never by the product.
- waiting.py: wait for events with generous deadlines, never for time.
- wire.py: an in-memory stand-in for the overlay under one chunk engine; raw TCP peers for attackers.
- frames.py: chunk headers, a fake transport and a recording handler for the frame codec.
- topologies.py: small hand-made topologies (lines, a big switch with one binding downlink).
- shares.py: byte shares of concurrent tasks, measured only while both were backlogged.
- processes.py: find the `wansync agent` processes a test's launcher started.
- fixtures.py: pytest fixtures over the above.
"""
