"""Several hosts on one machine: two test hosts made with network namespaces (``ip netns``) and veth pairs to a
bridge in the root namespace (a private 10.x /24), a worker on each (``ip netns exec HOST python -m
shardbus.cluster.worker --listen <host ip>:0 --metadata DSN``), PostgreSQL and the front end in the root namespace.
Partitions are placed on both hosts, traffic flows through the official SDK, and when one host's worker is killed
the other host takes its partitions over from PostgreSQL without losing anything acknowledged.

Needs root and ``ip netns``; skips with the reason otherwise. Only loopback and the test hosts' addresses are ever
used; the namespaces, links and the throwaway PostgreSQL cluster are always removed.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from test_pg_takeover import CLUSTER_KEY, WorkerProc, run_takeover, unavailable

from pg_server import ServerUnavailable, scratch_database
from pg_server import start as start_pg
from pg_server import stop as stop_pg
from shardbus.server import Broker

pytestmark = pytest.mark.timeout(120)


@dataclass
class HostNet:
    subnet: ipaddress.IPv4Network
    bridge: str
    gateway: str  # the bridge's address in the root namespace
    hosts: dict[str, str] = field(default_factory=dict)  # namespace -> its address


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=10)


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.x.0/24 that no interface of this machine uses."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for _ in range(50):
        subnet = ipaddress.IPv4Network(f"10.213.{secrets.randbelow(250) + 1}.0/24")
        prefix = str(subnet.network_address).rpartition(".")[0]
        if f" {prefix}." not in used:
            return subnet
    raise RuntimeError("no free 10.213.x.0/24 subnet")


@pytest.fixture
def test_hosts() -> Iterator[HostNet]:
    if os.geteuid() != 0:
        pytest.skip("making network namespaces (ip netns add) needs root")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    tag = secrets.token_hex(2)
    subnet = _free_subnet()
    addresses = list(subnet.hosts())
    net = HostNet(subnet, f"sbbr{tag}", str(addresses[0]))
    made_namespaces: list[str] = []
    try:
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot make a bridge for test hosts: {exc.stderr.strip()}")
        _ip("addr", "add", f"{net.gateway}/{subnet.prefixlen}", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for i in (1, 2):
            namespace, outside, inside = f"sbh{tag}{i}", f"sbv{tag}{i}", f"sbp{tag}{i}"
            try:
                _ip("netns", "add", namespace)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"ip netns add is unavailable here: {exc.stderr.strip()}")
            made_namespaces.append(namespace)
            address = str(addresses[10 + i])
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", outside, "master", net.bridge, "up")
            _ip("link", "set", inside, "netns", namespace)
            _ip("-n", namespace, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            net.hosts[namespace] = address
        yield net
    finally:
        for namespace in made_namespaces:  # deleting a namespace deletes its veth pair too
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", net.bridge], capture_output=True, check=False)


@pytest.fixture
def bridge_pg(test_hosts: HostNet) -> Iterator[str]:
    """A throwaway PostgreSQL cluster listening on loopback and the bridge, trusting the test hosts' subnet."""
    directory = tempfile.mkdtemp(prefix="shardbus-pg-")
    try:
        dsn = start_pg(directory, listen=(test_hosts.gateway, "127.0.0.1"), trust=(str(test_hosts.subnet),))
    except (ServerUnavailable, subprocess.TimeoutExpired) as exc:
        stop_pg(directory)
        unavailable(f"no PostgreSQL server for the test hosts ({exc})")
    try:
        with scratch_database(dsn) as db:
            yield db
    finally:
        stop_pg(directory)


def test_partitions_on_two_hosts_and_takeover_across_hosts(test_hosts, bridge_pg, tmp_path):
    (one, one_ip), (two, two_ip) = test_hosts.hosts.items()
    workers = [
        WorkerProc("host-one", bridge_pg, listen=f"{one_ip}:0", netns=one),
        WorkerProc("host-two", bridge_pg, listen=f"{two_ip}:0", netns=two),
    ]
    broker = None
    try:
        assert workers[0].address.startswith(f"{one_ip}:") and workers[1].address.startswith(f"{two_ip}:")
        broker = Broker(data_dir=tmp_path / "data", port=0, key=CLUSTER_KEY, metadata=bridge_pg).start()
        # the front end (root namespace) found both hosts through the metadata store, at their own addresses
        live = broker.cluster.live
        assert {name: host for name, (host, _) in live.items()} == {"host-one": one_ip, "host-two": two_ip}
        run_takeover(broker, workers[0], workers[1])
    finally:
        if broker is not None:
            broker.stop()
        for w in workers:
            w.stop()
