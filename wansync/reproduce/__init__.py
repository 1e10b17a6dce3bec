"""`wansync reproduce PAPER`: each paper's experiments run per (cell, seed) through the project's own
benchmark functions and simulator, every run kept as one JSON line, summarized with an order-statistic
interval across seeds (issue 37, docs/reproduce.md)."""
