"""`profile = "trial"` (issue 59, point 3): the one setting that makes an erasure's receipt come in minutes on one
machine, where the defaults keep a replaced block's objects two hours; and the quickstart says so up front, with
figures that are the configuration's own."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from shale.config import ShaleConfig, load_config
from shale.config.model import granted_delete_delay
from shale.config.profiles import PROFILES, apply_profile
from shale.errors import ConfigError

QUICKSTART = Path(__file__).resolve().parents[3] / "docs" / "QUICKSTART.md"


def _receipt_wait(config: ShaleConfig) -> float:
    """The longest wait, in seconds, from an erasure's rewrite (no --delete-delay) to its replaced objects being
    gone: their delete delay, then the leader's next maintenance pass."""
    delay = granted_delete_delay(0, config.erasure_delay_floor, config.block.delete_delay)
    return delay + config.metastore.maintenance_interval


def test_on_defaults_the_receipt_waits_about_two_hours_and_on_the_trial_profile_minutes() -> None:
    assert 2 * 3600 <= _receipt_wait(load_config(None, env={})) < 2.1 * 3600
    trial = load_config(None, env={}, overrides=["profile=trial"])
    assert _receipt_wait(trial) <= 90  # "about a minute and a half"
    assert trial.erasure_delay_floor <= trial.block.delete_delay
    # Readers of the bucket index refuse one older than max_stale_period: the leader rewrites it sooner.
    assert trial.bucket_index.rewrite_interval + trial.bucket_index.debounce < trial.bucket_index.max_stale_period


def test_a_key_set_explicitly_keeps_its_value_under_the_profile() -> None:
    config = load_config(None, env={"SHALE_BLOCK__DELETE_DELAY": "10m"}, overrides=["profile=trial"])
    assert config.block.delete_delay == 600
    assert config.bucket_index.max_stale_period == 60  # the profile's
    file_config = ShaleConfig.model_validate({"profile": "trial", "block": {"sync_delay": "5s"}})
    assert (file_config.block.sync_delay, file_config.block.delete_delay) == (5, 60)


def test_the_default_profile_changes_nothing_and_an_unknown_one_is_refused() -> None:
    assert load_config(None, env={}, overrides=["profile=default"]) == load_config(None, env={})
    with pytest.raises(ConfigError, match="profile"):
        load_config(None, env={}, overrides=["profile=fast"])
    assert apply_profile({"profile": "fast"}) == {"profile": "fast"}


def test_the_profiles_are_the_ones_the_model_accepts() -> None:
    assert set(typing.get_args(ShaleConfig.model_fields["profile"].annotation)) == set(PROFILES)


def test_the_quickstart_says_up_front_how_long_the_receipt_takes_and_the_one_setting_for_a_trial() -> None:
    opening = QUICKSTART.read_text().split("\n## ", 1)[0]
    assert "about two hours" in opening
    assert re.search(r'^profile = "trial"', opening, re.MULTILINE), "the setting, as written in shale.toml"
    assert "about a minute and a half" in opening
    assert "protects readers" in opening
    assert "`block.delete_delay`, 2 hours by default" in opening
    defaults = load_config(None, env={})
    assert defaults.block.delete_delay == 2 * 3600
    assert defaults.metastore.maintenance_interval == 30
    assert "every 30 s" in opening
