#!/usr/bin/env bash
# Install shardbus (into .venv) and start the broker on its embedded default: SQLite under ./shardbus-data.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip==25.3
.venv/bin/python -m pip install -q .
exec .venv/bin/shardbus serve "$@"
