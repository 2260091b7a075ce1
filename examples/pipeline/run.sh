#!/usr/bin/env bash
# One command: install, start a local shardbus with the pipeline's entities, feed it orders, run the Spark job,
# print what arrived. ORDERS (default 20000) and PORT (default 5673) can be set in the environment.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip==25.3
.venv/bin/python -m pip install -q -e '.[examples]'
PORT="${PORT:-5673}"
WORK="$(mktemp -d)"
CONN="Endpoint=sb://localhost:${PORT};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
.venv/bin/shardbus serve --port "$PORT" --data-dir "$WORK/data" --config examples/pipeline/config.json &
BROKER=$!
trap 'kill $BROKER; wait $BROKER 2>/dev/null || true' EXIT
.venv/bin/python - "$PORT" <<'PY'
import socket, sys, time
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        break
    except OSError:
        time.sleep(0.1)
PY
.venv/bin/python examples/pipeline/generator.py --connection-string "$CONN" --count "${ORDERS:-20000}"
.venv/bin/python examples/pipeline/job.py --connection-string "$CONN" --output "$WORK/out"
.venv/bin/python examples/pipeline/alerts.py --connection-string "$CONN"
echo "Parquet output: $WORK/out"
