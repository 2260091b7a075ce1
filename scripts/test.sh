#!/usr/bin/env bash
# Install everything (into .venv) and run the whole test suite: lint, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip==25.3
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench

# Debian's packages the suite drives, installed when missing (as root or with sudo; the tests that need one skip
# without it, or fail under CI): Chromium for the explorer's browser tests (tests/explorer; Playwright drives it
# through its executable path, no browser is ever downloaded), and PostgreSQL for the postgres store tests unless
# a DSN is given from outside.
packages=()
[ -x /usr/bin/chromium ] || packages+=(chromium)
if [ -z "${SHARDBUS_TEST_POSTGRES_DSN:-}" ] && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    packages+=(postgresql)
fi
if [ "${#packages[@]}" != 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo -n"
    { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null; } ||
        echo "test.sh: could not install ${packages[*]}" >&2
fi

# A throwaway PostgreSQL cluster on 127.0.0.1 for this run only (tests/pg_server.py). A DSN given from outside is
# used as it is.
if [ -z "${SHARDBUS_TEST_POSTGRES_DSN:-}" ]; then
    pg_dir=$(mktemp -d)
    trap '.venv/bin/python tests/pg_server.py stop "$pg_dir" || true' EXIT  # keeps pytest's exit status
    if pg_dsn=$(.venv/bin/python tests/pg_server.py start "$pg_dir"); then
        export SHARDBUS_TEST_POSTGRES_DSN="$pg_dsn"
    fi
fi

if [ "$#" != 0 ]; then
    status=0
    .venv/bin/pytest -q -p no:cacheprovider "$@" || status=$?
    exit "$status"  # not exec: the EXIT trap stops PostgreSQL
fi

# The whole run is two passes at once (most tests wait on sockets, timers and fsync, so two share 2 cores well):
# every suite with partition brokers in the test process, and the core and AMQP suites once more with every
# partition broker in one of two worker processes (tests/conftest.py): remote partitions must behave exactly like
# local ones. The store adapter tests touch no partition broker, so they run in the first pass only.
workers_log=$(mktemp)
SHARDBUS_TEST_WORKERS=2 .venv/bin/pytest -q -p no:cacheprovider tests/core tests/endpoint \
    --deselect tests/endpoint/test_bench_smoke.py --deselect tests/endpoint/test_scale_bench_smoke.py \
    --deselect tests/endpoint/test_connections_bench_smoke.py --deselect tests/core/test_backlog_bench_smoke.py \
    --deselect tests/endpoint/test_soak_smoke.py \
    --deselect tests/core/test_store_adapters.py >"$workers_log" 2>&1 &
workers_pid=$!
embedded=0
.venv/bin/pytest -q -p no:cacheprovider --durations=20 || embedded=$?
remote=0
wait "$workers_pid" || remote=$?
echo "--- second pass: core and AMQP suites with SHARDBUS_TEST_WORKERS=2 ---"
cat "$workers_log"
rm -f "$workers_log"
[ "$embedded" = 0 ] && [ "$remote" = 0 ]
