"""QuickPollReplayBuffer: verl's sync sampler with a configurable poll interval; bad settings are errors."""

from __future__ import annotations

import pytest
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from mgrpo_verl.trainer.sampler import QuickPollReplayBuffer

BASE = dict(trainer_config={}, max_off_policy_threshold=8, max_off_policy_strategy="drop")


def make(mode: str = "sync", **sampler_kwargs):
    return QuickPollReplayBuffer(trainer_mode=mode, sampler_kwargs=sampler_kwargs, **BASE)


def test_settings_reach_verls_sampler():
    buf = make(poll_interval=0.05, train_batch_size=8, gen_batch_size=None, filter_groups=False)
    assert isinstance(buf, ReplayBuffer)
    assert buf.poll_interval == 0.05
    assert buf.train_batch_size == 8 and buf.gen_batch_size == 8  # gen batch defaults to the train batch
    assert buf.filter_groups_metric is None


def test_defaults_to_verls_interval():
    assert make().poll_interval == 2.0


@pytest.mark.parametrize(
    "mode, kwargs, message",
    [
        ("sync", {"poll": 0.1}, r"unknown sampler_kwargs \['poll'\]"),
        ("async", {}, "trainer_mode='async'"),
        ("sync", {"filter_groups": True}, "DAPO group filtering"),
        ("sync", {"poll_interval": 0}, "poll_interval must be > 0"),
    ],
)
def test_bad_settings_are_clear_errors(mode, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(mode, **kwargs)
