"""End to end on CPU: two agents as LoRA adapters on one tiny base, through ``python -m mgrpo_verl.main_ppo``.

Both agents play the same base model (main: rank 4, alpha 16, every linear layer; sub: rank 4, alpha 8, q/v
projections only: verl's own ``model.lora_*`` keys, per agent). Two runs:

1. 2 steps, validation before training and after step 2, a checkpoint per step;
2. the same command to step 3: resumes from ``global_step_2``;

with a KL loss against each agent's base (its actor with the adapter off).

Checked: one HF rollout server serves both agents (adapter-only syncs, each under its agent's name); the
base weights the server holds stay bit-identical to the model folder's at every sync; each agent's rollout
log-probs equal its actor's (``rollout_probs_diff_max`` < 1e-5: generation used that agent's adapter and no other);
the checkpoint's adapters differ between the agents and from their initialisation, its base tensors equal
the model folder's; the resumed run serves exactly the adapters saved at step 2; the export writes each
agent as a merged HF model.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from e2e import dense_scorer

pytestmark = pytest.mark.slow

LORA = (
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=16",
    # the sub-agent is an adapter on the main agent's base, with settings of its own
    "multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}",
    "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
    "+multi_agent.agents.sub.actor_rollout_ref.model.lora_alpha=8",
    "+multi_agent.agents.sub.actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
    "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
    "trainer.test_freq=2",
    # a KL loss: each agent's reference is its own actor with the adapter off (verl's ref_in_actor, per agent)
    "actor_rollout_ref.actor.use_kl_loss=true",
)

SYNC = re.compile(r"HF rollout replica (\d+): adapter '(\w+)', (\d+) tensors .*global_steps=(\S+), "
                  r"base_fingerprint=(\w+), adapter_fingerprint=(\w+)")


def _syncs(log: str) -> list[tuple]:
    """(replica, adapter, tensors, global_steps, base fingerprint, adapter fingerprint) of every adapter sync."""
    return [(int(r), a, int(n), s, b, f) for r, a, n, s, b, f in SYNC.findall(log)]


def test_two_adapters_on_one_base_train_checkpoint_resume_export(main_ppo, tmp_path):
    from mgrpo_verl.hf_rollout.engine import weights_fingerprint
    from mgrpo_verl.trainer.lora_export import export, load_actor_state

    scorer = dense_scorer(tmp_path)
    common = (*LORA, f"multi_agent.delegation.scorer={scorer}")

    first = main_ppo("lora", "trainer.total_training_steps=2", "trainer.save_freq=1", *common)
    assert first.returncode == 0, first.log[-6000:]
    assert first.steps() == [1, 2]
    assert any(k.startswith("val-core/") for k in first.at(0)) and any(k.startswith("val-core/") for k in first.at(2))
    # one rollout server for both agents
    assert len(re.findall(r"hf_server_\d+_\d+ ready: model=", first.log)) == 1, first.log[-4000:]
    syncs = _syncs(first.log)
    # every sync sends one agent's adapter only (2 layers x 7 linear layers x (A, B) for main; x 2 for sub), to replica 0
    assert {(r, a, n) for r, a, n, *_ in syncs} == {(0, "main", 28), (0, "sub", 8)}
    assert [a for _, a, *_ in syncs].count("main") == 3 and [a for _, a, *_ in syncs].count("sub") == 3  # start, step 1, 2

    step2 = tmp_path / "ckpt" / "global_step_2"
    manifest = json.loads((step2 / "agents.json").read_text())
    base_path = manifest["main"]["model"]
    assert manifest["sub"]["model"] == base_path
    assert manifest["main"]["lora"]["lora_alpha"] == 16 and manifest["main"]["lora"]["target_modules"] == "all-linear"
    assert manifest["sub"]["lora"]["lora_alpha"] == 8 and manifest["sub"]["lora"]["target_modules"] == ["q_proj", "v_proj"]
    from transformers import AutoModelForCausalLM

    base_fp = weights_fingerprint(AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32))
    assert {b for *_, b, _ in syncs} == {base_fp}  # the served base never changed

    for step in (1, 2):
        m = first.at(step)
        for agent in ("main", "sub"):
            assert m[f"agent/{agent}/actor/grad_norm"] > 0
            assert math.isfinite(m[f"agent/{agent}/actor/pg_loss"])
            # the rollout's log-probs are the actor's own: generated with this agent's adapter, no other. Synced: 1e-9.
            # When the main agent's turns named no adapter (served by the bare base, fixed 2026-11-26), main showed
            # 3.6e-4 at step 2 and 5.6e-4 at step 3, correlation 0.77 / 0.67, while sub stayed at 1e-9 and 1.0
            assert m[f"agent/{agent}/training/rollout_probs_diff_max"] < 1e-5, (agent, step)
            assert m[f"agent/{agent}/training/rollout_actor_probs_pearson_corr"] > 0.999, (agent, step)
            assert math.isfinite(m[f"agent/{agent}/actor/kl_loss"])
    for agent in ("main", "sub"):  # after one update the adapter moved the policy away from the base
        assert first.at(2)[f"agent/{agent}/actor/kl_loss"] > 0

    states = {(a, s): load_actor_state(str(tmp_path / "ckpt" / f"global_step_{s}" / "agents" / a / "actor"))
              for a in ("main", "sub") for s in (1, 2)}
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    main_b, sub_b = states[("main", 2)][key], states[("sub", 2)][key]
    assert main_b.shape == sub_b.shape and not torch.equal(main_b, sub_b)  # same shape, trained apart
    assert sub_b.abs().sum() > 0 and not torch.equal(states[("sub", 1)][key], sub_b)  # B starts at 0 and moves
    # the base tensors: identical in both agents' checkpoints (a layer is a peft base_layer only where adapted)
    bases = [{k.replace(".base_layer.", "."): v for k, v in states[(a, 2)].items() if "lora_" not in k} for a in ("main", "sub")]
    assert bases[0].keys() == bases[1].keys() and len(bases[0]) == 27
    for name, value in bases[0].items():
        assert torch.equal(value, bases[1][name]), name

    second = main_ppo("resume", "trainer.total_training_steps=3", *common)
    assert second.returncode == 0, second.log[-6000:]
    assert second.steps() == [3]
    resumed = _syncs(second.log)
    for agent in ("main", "sub"):
        saved = [f for _, a, _, _, _, f in syncs if a == agent][-1]  # pushed after step 2, as checkpointed
        served = [f for _, a, _, _, _, f in resumed if a == agent][0]  # pushed at the resumed run's start
        assert served == saved, agent
    assert {b for *_, b, _ in resumed} == {base_fp}

    reports = export(str(step2), str(tmp_path / "export"))
    assert [r["agent"] for r in reports] == ["main", "sub"]
    merged = {r["agent"]: AutoModelForCausalLM.from_pretrained(r["path"], dtype=torch.float32) for r in reports}
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    q = "model.layers.0.self_attn.q_proj.weight"
    weights = {n: dict(m.named_parameters())[q] for n, m in merged.items()}
    assert not torch.equal(weights["main"], weights["sub"])
    assert not torch.equal(weights["main"], dict(base.named_parameters())[q])
    o = "model.layers.0.self_attn.o_proj.weight"  # not a target of sub's adapter: sub's merged model keeps the base's
    assert torch.equal(dict(merged["sub"].named_parameters())[o], dict(base.named_parameters())[o])


@pytest.mark.full  # a LoRA agent beside a full one: LoRA training runs end to end in test_two_adapters_on_one_base_... and in .venv-vllm
def test_full_main_with_a_lora_sub_agent(main_ppo, tmp_path):
    """A mixed set-up: the main agent a full model, the sub-agent an adapter on its own base (the default
    sub model): two engines, the main one synced with full weights, the sub one with the adapter only."""
    scorer = dense_scorer(tmp_path)
    run = main_ppo("mixed", "trainer.total_training_steps=1", "trainer.save_freq=-1", "trainer.val_before_train=false",
                   "trainer.test_freq=-1", "+multi_agent.agents.sub.actor_rollout_ref.model.lora_rank=4",
                   "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
                   f"multi_agent.delegation.scorer={scorer}")
    assert run.returncode == 0, run.log[-6000:]
    assert run.steps() == [1]
    assert len(re.findall(r"hf_server_\d+_\d+ ready: model=", run.log)) == 2
    syncs = _syncs(run.log)
    assert {(r, a, n) for r, a, n, *_ in syncs} == {(1, "sub", 28)}  # sub's adapter, to its own replica 1 only
    assert len({b for *_, b, _ in syncs}) == 1
    full = re.findall(r"HF rollout replica 0: (\d+) tensors .*fingerprint=(\w+)", run.log)  # the main model: full weights
    assert len(full) == 2 and len({fp for _, fp in full}) == 2  # start and after step 1: the weights changed
    m = run.at(1)
    for agent in ("main", "sub"):
        assert m[f"agent/{agent}/actor/grad_norm"] > 0
        assert m[f"agent/{agent}/training/rollout_probs_diff_max"] < 1e-5, agent


@pytest.mark.full  # MAGRPO and adapters each run end to end in CI (test_magrpo_e2e, the test above)
def test_magrpo_agents_as_adapters_on_one_base(main_ppo):
    """MAGRPO (writing collaboration, joint reward) with both agents as adapters on one base: one engine, each
    agent's adapter synced alone, each trained on its own rows with the joint advantages, and each agent's rollout
    generated with its own adapter (the engine's token probabilities of an agent equal its actor's)."""
    run = main_ppo("magrpo_lora", "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
                   "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=16",
                   "multi_agent.agents.details.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}",
                   "multi_agent.agents.details.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
                   "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true", config="magrpo_trainer")
    assert run.returncode == 0, run.log[-6000:]
    assert run.steps() == [1, 2]
    assert len(re.findall(r"hf_server_\d+_\d+ ready: model=", run.log)) == 1, run.log[-4000:]
    assert {(r, a, n) for r, a, n, *_ in _syncs(run.log)} == {(0, "summary", 28), (0, "details", 28)}
    for step in (1, 2):
        m = run.at(step)
        assert m["agent/summary/score/mean"] == pytest.approx(m["agent/details/score/mean"])  # the joint reward
        for agent in ("summary", "details"):
            assert m[f"agent/{agent}/rows"] == 16 and m[f"agent/{agent}/update_rows"] == 16
            assert m[f"agent/{agent}/training/rollout_probs_diff_max"] < 1e-5, (agent, step)
    # tiny random models write token strings that share no word with the article: topical relevance 0, joint reward
    # 0 (the writing reward's relevance factor, issue 29 item 7), so the updates run on zero advantages; as in
    # test_magrpo_e2e only finiteness is checked here (learning from non-zero joint rewards: test_cooperative_loop)
    assert all(math.isfinite(run.at(s)[f"agent/{a}/actor/grad_norm"]) for s in (1, 2) for a in ("summary", "details"))
