#!/usr/bin/env bash
# Install wansync into .venv and run the main job on built-in defaults (README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e .
exec .venv/bin/wansync run "$@"
