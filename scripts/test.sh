#!/usr/bin/env bash
# Install wansync with its test extras into .venv and run the whole suite (README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]"
# bytecode now: every agent process imports these, and PYTHONDONTWRITEBYTECODE would make each compile them
.venv/bin/python -m compileall -q -j 0 agents core emulation overlay scheduler sim wansync >/dev/null
.venv/bin/ruff check .
# two workers: most tests wait on agents, links and child processes, so a 2-core machine runs two at once
# (the suite holds under load: the suite-under-load check); whole files per worker, the root ones on one
# worker (tests/conftest.py's scheduler)
exec .venv/bin/python -m pytest -q -n 2 "$@"
