"""Each multi-agent loop types the ``multi_agent`` section once per loop worker, not once per rollout.

verl builds a new loop object for every trajectory from the same trainer config object (``_run_agent_loop``
in verl's ``agent_loop.py``); a loop's settings are memoised per config object (``common.per_config``), so
``load_multi_agent`` runs once for two loops built from one config, and again for a new config object."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from mgrpo_verl.agent_loops import common, cooperative, tool_parser
from mgrpo_verl.agent_loops.testing import build_agent_loop
from mgrpo_verl.config import schema
from mgrpo_verl.envs import relay


class Manager:
    """A server manager the loops are built with (never asked to generate here)."""

    def for_agent(self, name):
        return self

    async def generate(self, **kwargs):
        raise AssertionError("not generating")


def _rollout(**extra):
    return {"prompt_length": 256, "response_length": 64, **extra}


def _relay():
    return OmegaConf.create({"actor_rollout_ref": {"model": {"path": "/m"}, "rollout": _rollout()}, "data": {},
                             "multi_agent": {"main": "main", "delegation": {"timeout_s": 5}}})


def _tools():
    multi_turn = {"max_assistant_turns": 4, "max_user_turns": None, "max_parallel_calls": 2, "max_tool_response_length": 256,
                  "tool_response_truncate_side": "right", "format": tool_parser.FORMAT}
    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": "/m"}, "rollout": _rollout(full_determinism=False, multi_turn=multi_turn)},
        "data": {}, "multi_agent": {"main": "main", "delegation": {"timeout_s": 5, "sub_response_tokens": 16}},
    })


def _coop():
    return OmegaConf.create({
        "actor_rollout_ref": {"model": {"path": "/m"}, "rollout": _rollout()}, "data": {},
        "multi_agent": {"magrpo": {"num_generations": 2}, "cooperation": {"num_turns": 1, "response_tokens": 4}},
    })


LOOPS = {
    "relay": ("mgrpo_relay", _relay),
    "tool_delegation": (relay.TOOLS_AGENT_LOOP_NAME, _tools),
    "cooperative": (cooperative.AGENT_LOOP_NAME, _coop),
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_two_loops_of_one_config_type_the_section_once(monkeypatch, tokenizer, name):
    loads: list = []
    real = schema.load_multi_agent

    def counted(config):
        loads.append(config)
        return real(config)

    monkeypatch.setattr(common, "load_multi_agent", counted)
    monkeypatch.setattr(cooperative, "load_multi_agent", counted)
    agent_loop, make = LOOPS[name]
    config = make()
    first = build_agent_loop(agent_loop, config, Manager(), tokenizer)
    second = build_agent_loop(agent_loop, config, Manager(), tokenizer)
    assert first is not second and len(loads) == 1
    build_agent_loop(agent_loop, make(), Manager(), tokenizer)  # an equal config, but another object
    assert len(loads) == 2
