"""MAGRPO's cooperative rollout: n agents act together at every turn and share one joint reward.

``CooperativeLoop`` (verl agent loop ``magrpo_coop``) expands one task's whole joint-action tree in one run
(so verl's ``rollout.n`` is 1): at each node every agent writes G completions on its own model, the task scores
each joint action and may give feedback for the next turn, and every (node, agent) becomes a row. verl's loops
generate one trajectory per sample. The steps, the rows' fields and the errors: ``docs/magrpo.md``, "The
cooperative rollout".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any
from uuid import uuid4


from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils import normalize_token_ids

from mgrpo_verl.algorithms.config import MAGRPOConfig
from mgrpo_verl.config.schema import CooperationConfig, load_multi_agent
from mgrpo_verl.envs import coop_tasks
from mgrpo_verl.envs.coop_tasks import COOP_LOOP_NAME, CoopReward, CoopTask, Turn

# the module, not its names: importing it first triggers this module's registration mid-way (plugin.py)
from mgrpo_verl.agent_loops import common
from mgrpo_verl.rowmeta import NODE_META, ROW_META, NodeMeta, RowMeta

logger = logging.getLogger(__name__)

AGENT_LOOP_NAME = COOP_LOOP_NAME

#: ``reward_extra_info`` key: 1.0 on the rows of a joint action whose reward failed (raised, was not
#: finite, or took longer than :data:`REWARD_TIMEOUT_S`) and was scored 0; its mean is the failure rate.
REWARD_ERRORS = "reward/errors"

#: ``reward_extra_info`` key: 1.0 on a row whose own completion failed (raised, or took longer than
#: ``multi_agent.cooperation.timeout_s``) and was the empty text; its mean is the failure rate.
GENERATION_ERRORS = "generation/errors"

#: Seconds one joint reward may take (the coding reward's sandbox stops its programs well before).
REWARD_TIMEOUT_S = 120.0


def _settings(config: Any) -> tuple[MAGRPOConfig, CooperationConfig]:
    """The loop's sections of the trainer config, typed once per loop worker (``common.per_config``)."""
    ma = load_multi_agent(config)
    ma.tree_width()  # required here, whatever multi_agent.algorithm says
    return ma.magrpo, ma.cooperation


def _end_token(tokenizer: Any) -> int:
    """The token a failed completion's row holds: the tokenizer's EOS, else its pad token, else 0."""
    for token in (tokenizer.eos_token_id, tokenizer.pad_token_id):
        if isinstance(token, int):
            return token
    return 0


@dataclass
class _Node:
    node_id: str
    turn: int
    history: dict[str, list[Turn]]  # per agent (all agents see the same turns)


@register(AGENT_LOOP_NAME)
class CooperativeLoop(AgentLoopBase):
    """MAGRPO's cooperative rollout (``docs/magrpo.md``, "The cooperative rollout")."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.magrpo, self.cooperation = common.per_config(self.config, _settings)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        task = coop_tasks.task_for(kwargs.get("data_source"))
        item = kwargs["reward_model"]["ground_truth"]
        agents = {name: common.resolve_agent(self, name, self.cooperation.response_tokens) for name in task.agents}
        prefix = f"{kwargs.get('uid', uuid4().hex)}/{kwargs.get('session_id', 0)}"
        seeds = common.trajectory_seeds(self, kwargs)
        origin = common.trajectory_origin(kwargs)
        s = self.cooperation

        rows: list[tuple[_Node, str, list[int], common.Generation, CoopReward]] = []
        failed = 0
        frontier = [_Node("", -1, {a: [] for a in task.agents})]  # the task itself: the roots' parent
        leaves: list[float] = []
        while frontier:
            expansions = await asyncio.gather(*(self._expand(task, item, agents, node, sampling_params, seeds)
                                                for node in frontier))
            next_frontier = []
            for children, n_failed in expansions:
                failed += n_failed
                for child, per_agent, outcome in children:
                    for name in task.agents:
                        prompt_ids, gen = per_agent[name]
                        rows.append((child, name, prompt_ids, gen, outcome))
                    last_turn = child.turn + 1 >= s.num_turns
                    done = s.termination_threshold is not None and outcome.reward >= s.termination_threshold
                    if last_turn or done:
                        leaves.append(outcome.reward)
                    else:
                        next_frontier.append(child)
            frontier = next_frontier

        acc = sum(leaves) / len(leaves) if leaves else 0.0
        out = []
        for node, name, prompt_ids, gen, outcome in rows:
            parent_id = node.node_id.rsplit(".", 1)[0] if "." in node.node_id else ""
            response, mask, log_probs = gen.token_ids, [1] * len(gen.token_ids), gen.log_probs
            if not response:  # failed or empty: one masked end token (verl's row puts its reward on the last one)
                response, mask, log_probs = [_end_token(agents[name].tokenizer)], [0], [0.0]
            info = {k: float(outcome.info.get(k, 0.0)) for k in (*task.info_keys, REWARD_ERRORS)}
            info[GENERATION_ERRORS] = float(gen is common.FAILED_GENERATION)
            out.append(
                AgentLoopOutput(
                    prompt_ids=prompt_ids,
                    response_ids=response,
                    response_mask=mask,
                    response_logprobs=log_probs,
                    reward_score=float(outcome.reward),
                    num_turns=2,
                    metrics=AgentLoopMetrics(generate_sequences=gen.seconds),
                    extra_fields={
                        **gen.extra_fields,
                        NODE_META: NodeMeta(node.node_id, parent_id, node.turn).write(),
                        ROW_META: RowMeta(name, f"{prefix}/{node.node_id}/{name}", "", float(outcome.reward), calls=0,
                                          failed_calls=failed, origin=origin).write(),
                        "reward_extra_info": {"acc": acc, **info},
                    },
                )
            )
        return out

    async def _expand(self, task: CoopTask, item: Any, agents: dict[str, common.AgentHandle], node: _Node,
                      sampling_params, seeds: common.SeedStream):
        """The children of ``node``: G completions per agent (completion ``g`` of agent ``a`` seeded by the
        branch ``{node}/{a}/{g}`` of ``seeds``), joined, scored."""
        s = self.magrpo
        prompts = {}
        for name, agent in agents.items():
            messages = task.messages(item, name, node.history[name])
            tokenized = agent.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, **self.apply_chat_template_kwargs
            )
            prompts[name] = normalize_token_ids(tokenized)[-agent.prompt_length :]
        calls = [(name, g) for name in agents for g in range(s.num_generations)]
        results = await asyncio.gather(
            *(self._complete(agents[name], prompts[name],
                             seeds.child(f"{node.node_id}/{name}/{g}").params(sampling_params))
              for name, g in calls)
        )
        by_agent: dict[str, list[common.Generation]] = {name: [] for name in agents}
        n_failed = 0
        for (name, _), gen in zip(calls, results):
            if gen is None:
                n_failed += 1
                gen = common.FAILED_GENERATION
            by_agent[name].append(gen)
        names = list(agents)
        if s.joint_mode == "aligned":
            combos = [tuple(g for _ in names) for g in range(s.num_generations)]
        else:
            combos = list(itertools.product(range(s.num_generations), repeat=len(names)))
        children = []
        for k, combo in enumerate(combos):
            node_id = f"{node.node_id}.{k}" if node.node_id else str(k)
            texts = {
                name: agents[name].tokenizer.decode(by_agent[name][g].token_ids, skip_special_tokens=True)
                for name, g in zip(names, combo)
            }
            outcome = await self._reward(task, item, texts)
            turn = Turn(texts, outcome.feedback)
            child = _Node(node_id, node.turn + 1, {name: node.history[name] + [turn] for name in names})
            per_agent = {name: (prompts[name], by_agent[name][g]) for name, g in zip(names, combo)}
            children.append((child, per_agent, outcome))
        return children, n_failed

    async def _reward(self, task: CoopTask, item: Any, texts: dict[str, str]) -> CoopReward:
        """The task's reward of one joint action, off the event loop (it may run code in a sandbox). One
        that raises, returns a non-finite reward or takes more than :data:`REWARD_TIMEOUT_S` is 0 with
        ``info[REWARD_ERRORS] = 1`` (logged): model output must never end the agent loop."""
        try:
            outcome = await asyncio.wait_for(asyncio.to_thread(task.reward, item, texts), timeout=REWARD_TIMEOUT_S)
            if not math.isfinite(float(outcome.reward)):
                raise ValueError(f"the reward is {outcome.reward!r}")
            return outcome
        except Exception as exc:
            logger.warning("the joint reward could not be computed, scored 0: %s: %.500s", type(exc).__name__, exc)
            return CoopReward(0.0, {REWARD_ERRORS: 1.0}, f"the reward could not be computed ({type(exc).__name__})")

    async def _complete(self, agent: common.AgentHandle, prompt_ids: list[int],
                        sampling_params) -> common.Generation | None:
        try:
            return await asyncio.wait_for(
                common.generate(agent.client, uuid4().hex, prompt_ids, sampling_params, agent.response_tokens),
                timeout=self.cooperation.timeout_s,  # None: no limit
            )
        except Exception as exc:  # a failed generation is an empty completion, counted
            logger.warning("agent %r generation failed: %r", agent.name, exc)
            return None
