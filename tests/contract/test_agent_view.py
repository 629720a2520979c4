"""The attributes verl's four step methods use on ``self``, against what ``AgentView`` routes.

``MultiAgentTrainer._update_agent`` calls verl's ``_balance_batch``, ``_compute_old_log_prob``,
``_compute_ref_log_prob`` and ``_update_actor`` on an ``AgentView`` (mgrpo_verl/trainer/per_agent.py).
If verl starts reading another attribute there, or writing one, these tests fail: decide whether it
differs per model (add it to AGENT_VIEW_ROUTED and set it in AgentView) or not (AGENT_VIEW_SHARED).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from mgrpo_verl.trainer.agents import AgentRuntime
from mgrpo_verl.trainer.per_agent import (
    AGENT_STEP_METHODS,
    AGENT_VIEW_METHODS,
    AGENT_VIEW_ROUTED,
    AGENT_VIEW_SHARED,
    AgentView,
    MultiAgentTrainer,
)


def _self_uses(method_name: str, seen: set[str] | None = None) -> tuple[set[str], set[str], set[str]]:
    """(attributes read, attributes written, methods called) on ``self`` by a PPOTrainer method and,
    transitively, by the PPOTrainer methods it reaches through ``self``."""
    seen = set() if seen is None else seen
    seen.add(method_name)
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(PPOTrainer, method_name))))
    reads, writes, methods = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                writes.add(node.attr)
            elif inspect.isfunction(inspect.getattr_static(PPOTrainer, node.attr, None)):
                methods.add(node.attr)
            else:
                reads.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "getattr", "vars"):
            if node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                writes.add(f"<{node.func.id}(self, ...)>")  # dynamic access: the lists cannot be checked
    for name in sorted(methods - seen):
        r, w, m = _self_uses(name, seen)
        reads |= r
        writes |= w
        methods |= m
    return reads, writes, methods


def test_verl_step_methods_read_only_the_attributes_the_view_knows():
    reads, writes, methods = set(), set(), set()
    for name in AGENT_STEP_METHODS:
        r, w, m = _self_uses(name)
        reads |= r
        writes |= w
        methods |= m
    # use_reference_policy is routed for our own code (the chain decides on it), not read by verl here
    assert reads == (set(AGENT_VIEW_ROUTED) - {"use_reference_policy"}) | set(AGENT_VIEW_SHARED)
    assert methods == set(AGENT_VIEW_METHODS)
    assert not writes


def test_our_trainer_overrides_none_of_the_methods_the_view_binds():
    # the view binds the trainer class's methods; an override in our subclass would need its own check
    for name in (*AGENT_STEP_METHODS, *AGENT_VIEW_METHODS):
        assert getattr(MultiAgentTrainer, name) is getattr(PPOTrainer, name), name


def _view():
    trainer = object.__new__(MultiAgentTrainer)
    trainer.config = OmegaConf.create({"trainer": {"critic_warmup": 0}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}, "rollout": {"n": 1}}})
    trainer.use_critic, trainer.global_steps, trainer.ref_in_actor = False, 5, False
    trainer.tokenizer, trainer.actor_rollout_wg, trainer.ref_policy_wg = "trainer-tok", "trainer-wg", "trainer-wg"
    trainer.use_reference_policy = False
    agent_cfg = OmegaConf.create({"trainer": {"critic_warmup": 0}, "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 3}, "rollout": {"n": 1}}})
    rt = AgentRuntime(name="sub", trainable=True, config=agent_cfg, plays=("sub",), worker_group="sub-wg",
                      tokenizer="sub-tok", use_reference_policy=True)
    return trainer, AgentView(trainer, rt)


def test_view_routes_the_agent_attributes_and_binds_methods_to_itself():
    trainer, view = _view()
    assert (view.config.actor_rollout_ref.actor.ppo_mini_batch_size, view.actor_rollout_wg, view.ref_policy_wg,
            view.tokenizer, view.use_reference_policy) == (3, "sub-wg", "sub-wg", "sub-tok", True)
    assert (view.global_steps, view.use_critic, view.ref_in_actor) == (5, False, False)
    # verl's helper called through the view sees the agent's mini-batch: lcm(dp 2, 3) = 6, not lcm(2, 4) = 4
    assert view._get_required_batch_multiple(2) == 6
    assert trainer._get_required_batch_multiple(2) == 4
    assert view.trainer_mode == "sync"  # properties too
    # the trainer itself is untouched
    assert (trainer.tokenizer, trainer.actor_rollout_wg, trainer.use_reference_policy) == ("trainer-tok", "trainer-wg", False)


def test_view_refuses_writes():
    trainer, view = _view()
    with pytest.raises(AttributeError, match=r"set self\.global_steps"):
        view.global_steps = 6
    with pytest.raises(AttributeError, match=r"set self\.tokenizer"):
        view.tokenizer = SimpleNamespace()
    assert trainer.global_steps == 5
