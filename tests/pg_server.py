"""A throwaway PostgreSQL cluster for the store tests (Debian's server binaries, no system service).

``start(directory)`` runs initdb and starts a server that listens on 127.0.0.1 (a free port) and a unix socket
inside ``directory``, trusts local connections and returns a DSN; ``stop(directory)`` stops it and removes the
directory. initdb refuses to run as root, so as root everything runs as the ``postgres`` user (which Debian's
package creates) and ``directory`` is handed to it.

Also a command line, which scripts/test.sh uses so the shell script and the pytest fixture share one recipe:

    python tests/pg_server.py start DIR   # prints the DSN
    python tests/pg_server.py stop DIR
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

PG_USER = "postgres"


class ServerUnavailable(Exception):
    """No cluster could be started (no binaries, no postgres user, initdb or pg_ctl failed)."""


def find_bindir() -> Path | None:
    """Directory holding initdb and pg_ctl: the newest Debian version first, then whatever PATH has."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for candidate in candidates:
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", PG_USER, "--", *cmd]
    return ["su", "-s", "/bin/sh", PG_USER, "-c", " ".join(f"'{c}'" for c in cmd)]


def _run(cmd: list[str], timeout: float) -> None:
    proc = subprocess.run(_as_server_user(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ServerUnavailable(f"{Path(cmd[0]).name} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def start(directory: Path | str, listen: tuple[str, ...] = ("127.0.0.1",), trust: tuple[str, ...] = ()) -> str:
    """Create and start a cluster in ``directory`` (created if missing); return its DSN (on the first ``listen``
    address). ``trust``: more networks (CIDR) whose clients may connect without a password, for test hosts in
    network namespaces."""
    bindir = find_bindir()
    if bindir is None:
        raise ServerUnavailable("no PostgreSQL server binaries (initdb, pg_ctl); install Debian's 'postgresql'")
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam(PG_USER)
        except KeyError as exc:
            raise ServerUnavailable(f"running as root and there is no '{PG_USER}' user to run initdb") from exc
        os.chown(base, user.pw_uid, user.pw_gid)
    base.chmod(0o700)
    data = base / "data"
    _run([str(bindir / "initdb"), "-D", str(data), "-U", PG_USER, "--auth=trust", "-E", "UTF8", "--no-locale",
          "--no-sync"], timeout=120)  # fmt: skip
    if trust:
        with open(data / "pg_hba.conf", "a") as hba:
            hba.writelines(f"host all all {network} trust\n" for network in trust)
    last: ServerUnavailable | None = None
    for _ in range(3):  # the free port may be taken between probing and binding: try another
        port = _free_port()
        options = f"-p {port} -c listen_addresses={','.join(listen)} -c unix_socket_directories={base}"
        try:
            _run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "server.log"), "-w", "-t", "60",
                  "-o", options, "start"], timeout=90)  # fmt: skip
        except ServerUnavailable as exc:
            last = exc
            continue
        (base / "port").write_text(str(port))
        return f"host={listen[0]} port={port} user={PG_USER} dbname=postgres"
    log = base / "server.log"
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise ServerUnavailable(f"pg_ctl start failed: {last}\n{tail}")


def stop(directory: Path | str) -> None:
    """Stop the cluster in ``directory`` (if it runs) and remove the directory."""
    base = Path(directory)
    bindir = find_bindir()
    if bindir is not None and (base / "data" / "postmaster.pid").exists():
        try:
            _run([str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "-w", "stop"], timeout=60)
        except (ServerUnavailable, subprocess.TimeoutExpired) as exc:
            print(f"pg_server: stop failed: {exc}", file=sys.stderr)
    shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    """A new, empty database on the server of ``dsn`` for one test (its own ``shardbus`` schema, leases and
    registry); yields its DSN and drops it afterwards, disconnecting whoever is still connected."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    name = f"sbtest_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(**{**conninfo_to_dict(dsn), "dbname": name})
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: pg_server.py start|stop DIR", file=sys.stderr)
        return 2
    if argv[0] == "stop":
        stop(argv[1])
        return 0
    try:
        print(start(argv[1]))
    except (ServerUnavailable, subprocess.TimeoutExpired) as exc:
        print(f"pg_server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
