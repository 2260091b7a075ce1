#!/usr/bin/env bash
# Install everything (into .venv) and run the whole test suite: lint, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip==25.3
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/ruff check src tests bench
exec .venv/bin/pytest -q -p no:cacheprovider "$@"
