#!/usr/bin/env bash
# Install wansync with its test extras into .venv and run the whole suite (README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-system-deps.sh
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test]"
.venv/bin/ruff check .
exec .venv/bin/python -m pytest -q "$@"
