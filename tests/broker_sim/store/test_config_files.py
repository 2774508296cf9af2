"""Config files: RocketMQ shapes, atomic replace with .bak, fallback, typed errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_sim.store import ConfigFileError
from broker_sim.store import config_files as cf


def test_shapes_and_round_trips(tmp_path: Path) -> None:
    cf.save_topics(tmp_path, {"T": cf.topic_config("T", 4)}, cf.data_version(1, 2))
    raw = json.loads((tmp_path / "topics.json").read_text())
    assert raw["topicConfigTable"]["T"]["writeQueueNums"] == 4 and raw["dataVersion"]["counter"] == 2
    assert cf.load_topics(tmp_path)["T"]["perm"] == 6
    cf.save_subscription_groups(tmp_path, {"G": cf.subscription_group_config("G")})
    assert cf.load_subscription_groups(tmp_path)["G"]["retryMaxTimes"] == 16
    cf.save_consumer_offsets(tmp_path, {"T@G": {0: 12, 1: 7}})
    assert json.loads((tmp_path / "consumerOffset.json").read_text()) == {
        "offsetTable": {"T@G": {"0": 12, "1": 7}}
    }
    assert cf.load_consumer_offsets(tmp_path) == {"T@G": {0: 12, 1: 7}}
    cf.save_delay_offsets(tmp_path, {3: 42, 1: 0})
    assert cf.load_delay_offsets(tmp_path) == {1: 0, 3: 42}


def test_missing_files_are_empty(tmp_path: Path) -> None:
    assert cf.load_topics(tmp_path) == {} and cf.load_consumer_offsets(tmp_path) == {}


def test_previous_version_kept_as_bak_and_used_as_fallback(tmp_path: Path) -> None:
    cf.save_consumer_offsets(tmp_path, {"T@G": {0: 1}})
    cf.save_consumer_offsets(tmp_path, {"T@G": {0: 2}})
    assert json.loads((tmp_path / "consumerOffset.json.bak").read_text())["offsetTable"]["T@G"]["0"] == 1
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable": {"T@G": {"0": ')  # torn
    assert cf.load_consumer_offsets(tmp_path) == {"T@G": {0: 1}}
    (tmp_path / "consumerOffset.json").unlink()
    assert cf.load_consumer_offsets(tmp_path) == {"T@G": {0: 1}}


def test_fastjson_unquoted_integer_keys(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").write_text('{"offsetTable":{"T@G":{0:12,1:7}}}')
    assert cf.load_consumer_offsets(tmp_path) == {"T@G": {0: 12, 1: 7}}


def test_unreadable_file_and_bak_raise_typed_error(tmp_path: Path) -> None:
    (tmp_path / "topics.json").write_text("{nope")
    (tmp_path / "topics.json.bak").write_text("")
    with pytest.raises(ConfigFileError):
        cf.load_topics(tmp_path)
    (tmp_path / "delayOffset.json").write_text('{"offsetTable": {"x": 1}}')
    with pytest.raises(ConfigFileError):
        cf.load_delay_offsets(tmp_path)
    (tmp_path / "subscriptionGroup.json").write_text("[1, 2]")
    with pytest.raises(ConfigFileError):
        cf.load_subscription_groups(tmp_path)
