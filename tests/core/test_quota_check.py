"""The one quota check (registry/quotas.py) that the namespace and the Config.json importer both use."""

from __future__ import annotations

import pytest

import shardbus
from shardbus.model.tiers import Quotas, Tier
from shardbus.registry.quotas import QuotaBreach, quota_breach


def test_a_count_at_the_quota_fits_and_one_more_breaks_it():
    quotas = Quotas(
        max_entities=3, max_partitioned_entities=2, max_subscriptions_per_topic=4, max_rules_per_subscription=5
    )
    assert quota_breach(quotas, entities=3, partitioned=2, subscriptions=4, rules=5) is None
    assert quota_breach(quotas, entities=4) == QuotaBreach("max_entities", 3, 4)
    assert quota_breach(quotas, partitioned=3) == QuotaBreach("max_partitioned_entities", 2, 3)
    assert quota_breach(quotas, subscriptions=5) == QuotaBreach("max_subscriptions_per_topic", 4, 5)
    assert quota_breach(quotas, rules=6) == QuotaBreach("max_rules_per_subscription", 5, 6)


def test_premium_has_no_quota_on_partitioned_entities():
    assert quota_breach(Quotas.for_tier(Tier.PREMIUM), partitioned=10**6) is None


def test_the_namespace_and_the_config_refuse_the_same_count(tmp_path):
    quotas = {"max_entities": 2}
    with shardbus.Namespace.open(tmp_path / "a", quotas=quotas, maintenance=False) as ns:
        ns.create_queue("q1")
        ns.create_queue("q2")
        with pytest.raises(shardbus.QuotaExceeded, match=r"queues and topics \(2\)"):
            ns.create_queue("q3")
    from shardbus.config import ConfigError, apply_config, load_config

    config = {
        "UserConfig": {
            "Namespaces": [{"Name": "sbemulatorns", "Queues": [{"Name": f"q{i}", "Properties": {}} for i in range(3)]}]
        }
    }
    with shardbus.Namespace.open(tmp_path / "b", quotas=quotas, maintenance=False) as ns:
        with pytest.raises(ConfigError, match="its quota is 2"):
            apply_config(ns, load_config(config)[0])
        assert ns.list_queues() == []  # refused up front: nothing half-applied
