"""Quotas hold when several front ends share one namespace catalog (``shardbus serve --frontends M``).

Each front end refuses early by its own count of entities, which may be a moment old; the catalog's write
transaction counts again, so two creates racing through two front ends never overshoot a quota together.
"""

from __future__ import annotations

import threading

import pytest

import shardbus
from shardbus.store.catalog import Catalog, Limit


def test_the_catalog_refuses_an_insert_past_a_limit_whatever_its_writer_saw(tmp_path):
    a = Catalog(tmp_path / "catalog.db")
    b = Catalog(tmp_path / "catalog.db")  # another front end's connection
    most = Limit(2, "two at most")
    a.insert(1, "queue", None, "one", {}, limits=[most])
    b.insert(2, "queue", None, "two", {}, limits=[most])
    with pytest.raises(shardbus.QuotaExceeded, match="two at most"):
        a.insert(3, "queue", None, "three", {}, limits=[most])
    # children count per parent; a partitioned-only limit counts partitioned entities only
    a.insert(4, "subscription", 2, "s", {}, limits=[Limit(1, "one subscription")])
    with pytest.raises(shardbus.QuotaExceeded, match="one subscription"):
        b.insert(5, "subscription", 2, "t", {}, limits=[Limit(1, "one subscription")])
    a.delete([1, 4, 2])
    partitioned = Limit(1, "one partitioned", partitioned_only=True)
    a.insert(6, "queue", None, "p1", {"enable_partitioning": True}, limits=[partitioned])
    b.insert(7, "queue", None, "plain", {"enable_partitioning": False}, limits=[Limit(3, "three")])
    with pytest.raises(shardbus.QuotaExceeded, match="one partitioned"):
        b.insert(8, "queue", None, "p2", {"enable_partitioning": True}, limits=[Limit(3, "three"), partitioned])
    assert sorted(e.name for e in b.entries()) == ["p1", "plain"]
    # rules
    a.put_rule(6, "r1", {}, Limit(1, "one rule"))
    with pytest.raises(shardbus.QuotaExceeded, match="one rule"):
        b.put_rule(6, "r2", {}, Limit(1, "one rule"))
    a.close()
    b.close()


def test_creates_racing_through_two_namespaces_on_one_catalog_never_pass_the_entity_quota(open_ns):
    first = open_ns(quotas={"max_entities": 3})
    second = open_ns()  # the quotas are the namespace's, kept in its catalog
    assert second.quotas.max_entities == 3
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def create(ns: shardbus.Namespace, prefix: str) -> None:
        for i in range(4):
            barrier.wait()
            try:
                ns.create_queue(f"{prefix}{i}")
                outcomes.append("created")
            except shardbus.QuotaExceeded:
                outcomes.append("quota")

    threads = [threading.Thread(target=create, args=(ns, p)) for ns, p in ((first, "a"), (second, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes.count("created") == 3 and outcomes.count("quota") == 5
    assert len(first.list_queues()) == len(second.list_queues()) == 3
