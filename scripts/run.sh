#!/usr/bin/env bash
# Install wansync into .venv and run the main job on built-in defaults (README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e .
# bytecode now: every agent process imports these, and PYTHONDONTWRITEBYTECODE would make each compile them
.venv/bin/python -m compileall -q -j 0 agents core emulation overlay scheduler sim wansync >/dev/null
exec .venv/bin/wansync run "$@"
