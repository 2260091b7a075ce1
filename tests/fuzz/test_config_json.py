"""Config.json with made-up changes to the emulator's own sample (values of other types at any path, keys removed,
unknown keys added, text that is not JSON): ``load_config`` either reads it or raises ``ConfigError`` whose message
starts with where the problem is; what it reads applies to a namespace or is refused as a whole with a domain error
(nothing half-created); nothing else is ever raised."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardbus
from shardbus.config import ConfigError, apply_config, load_config
from shardbus.model.errors import ShardbusError

SAMPLE = json.loads((Path(__file__).parent.parent / "core" / "data" / "emulator_config.json").read_text())
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.floats(allow_nan=False),
        st.text(max_size=12),
        st.sampled_from(["PT1M", "P1D", "Premium", "Basic", "Sql", "Correlation", "Active", "1024", "-1", ""]),
    ),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
    max_leaves=6,
)


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*path, i))
    return found


PATHS = _paths(SAMPLE)[1:]


def _mutate(data: st.DataObject) -> Any:
    config = copy.deepcopy(SAMPLE)
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        path = data.draw(st.sampled_from(PATHS), label="path")
        parent = config
        try:
            for step in path[:-1]:
                parent = parent[step]
            last = path[-1]
            op = data.draw(st.sampled_from(["replace", "remove", "add"]), label="op")
            if op == "replace":
                parent[last] = data.draw(json_values, label="value")
            elif op == "remove":
                del parent[last]
            elif isinstance(parent, dict):
                parent[data.draw(st.text(max_size=10), label="key")] = data.draw(json_values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change moved the path away
    return config


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_mutated_configs_load_or_are_refused_with_their_path(data):
    config = _mutate(data)
    try:
        load_config(config)
    except ConfigError as exc:
        assert str(exc).startswith("UserConfig") or "Config" in str(exc), str(exc)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_configs_that_load_apply_or_change_nothing(tmp_path_factory, data):
    config = _mutate(data)
    try:
        namespaces = load_config(config)
    except ConfigError:
        return
    for ns_config in namespaces:
        ns = shardbus.Namespace(tmp_path_factory.mktemp("cfg"), name=ns_config.name, tier=ns_config.tier)
        try:
            try:
                apply_config(ns, ns_config)
            except ShardbusError:
                assert ns.list_queues() == [] and ns.list_topics() == []  # refused as a whole
        finally:
            ns.close()


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"UserConfig": 1}', "\ufeff{}", '{"UserConfig": {}}'])
def test_text_that_is_not_a_config(tmp_path, text):
    path = tmp_path / "Config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError):
        load_config(path)
