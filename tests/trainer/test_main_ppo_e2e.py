"""End to end on CPU: ``python -m mgrpo_verl.main_ppo --config-name single_agent`` (verl's v1 trainer, our platform and rollout).

One test, two runs, because each run pays ~60 s of Ray / TransferQueue / worker start-up:

1. two GRPO steps with the reference policy (KL loss), validation before training and after step 2,
   a checkpoint after every step, the Hugging Face weights saved with it;
2. the same command with ``total_training_steps=3``: verl's ``resume_mode=auto`` must continue at step 3.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

# full: verl's own trainer also completes steps in CI in the GPU campaign's dry run (stock main_ppo, T3, .venv-vllm);
# our trainer's KL, weight-sync fingerprints, probability agreement and resume: test_multi_agent_e2e.py, in CI
pytestmark = [pytest.mark.slow, pytest.mark.full]

# verl logs the largest |p_rollout - p_actor| over response tokens, where p_rollout comes from our HF
# rollout server and p_actor from the FSDP2 actor's recomputation with the same weights. Both run the same
# float32 model, so they agree to ~1e-5; 1e-3 leaves room for batching differences (padding, sdpa).
PROB_TOLERANCE = 1e-3

COMMON = (
    "trainer.save_freq=1",
    "trainer.test_freq=2",
    "trainer.val_before_train=true",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    # the rollout server logs a fingerprint of the weights it holds after every sync
    "+actor_rollout_ref.rollout.engine_kwargs.hf.fingerprint_weights=true",
)


# A dense reward (vowel share of the first 16 characters): every batch of a random tiny model gets
# rewards that differ between samples, hence non-zero advantages and a real update in step 1. The echo
# task's reward is zero for most early samples, which would make "the weights moved" a matter of luck.
DENSE_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return sum(c in "aeiouAEIOU" for c in solution_str[:16]) / 16
"""


def _fingerprint(model_dir: str) -> str:
    from mgrpo_verl.hf_rollout.engine import weights_fingerprint

    return weights_fingerprint(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))


def _logprobs(model_dir: str, input_ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids).logits[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def test_train_validate_checkpoint_resume_on_cpu(main_ppo, monkeypatch, tmp_path):
    reward = tmp_path / "dense_reward.py"
    reward.write_text(DENSE_REWARD)
    common = (*COMMON, f"reward.custom_reward_function.path={reward}")
    first = main_ppo("first", "trainer.total_training_steps=2", *common, config="single_agent")
    assert first.returncode == 0, first.log[-6000:]
    assert first.steps() == [1, 2]
    summary = [line for line in first.log.splitlines() if line.startswith("mgrpo_verl: ")]
    assert summary and "2 steps (step 1 to 2)" in summary[-1], summary
    # while it ran: what was starting, then a line per step with its reward (launcher/step_progress.py)
    assert summary[0].startswith("mgrpo_verl: starting Ray"), summary
    assert [line.split()[2] for line in summary if line.startswith("mgrpo_verl: step ")] == ["1/2", "2/2"], summary
    assert all("  reward " in line for line in summary if line.startswith("mgrpo_verl: step ")), summary

    # validation ran before training (step 0) and at the test_freq step
    val_keys = [k for k in first.at(0) if k.startswith("val-core/")]
    assert val_keys and val_keys[0] in first.at(2)
    # the reference policy ran: a KL loss was computed, and it is > 0 once the actor moved (step 2)
    assert "actor/kl_loss" in first.at(1) and first.at(2)["actor/kl_loss"] > 0
    for step in (1, 2):
        assert 0 < first.at(step)["critic/score/mean"] < 1  # the dense reward varies
        assert math.isfinite(first.at(step)["actor/pg_loss"])
        assert first.at(step)["training/rollout_probs_diff_max"] < PROB_TOLERANCE

    # The actor's weights changed: the step-1 checkpoint scores text differently from the initial model.
    from mgrpo_verl.envs.builtin import model_paths

    ckpt = main_ppo.checkpoints
    monkeypatch.setenv("MGRPO_VERL_CACHE", str(main_ppo.cache))  # the model the runs built
    initial_dir = model_paths("tiny").model_dir
    step_dirs = {step: str(ckpt / f"global_step_{step}" / "actor" / "huggingface") for step in (1, 2)}
    ids = torch.randint(0, 1000, (4, 24), generator=torch.Generator().manual_seed(0))
    moved = (_logprobs(initial_dir, ids) - _logprobs(step_dirs[1], ids)).abs().max().item()
    assert moved > 1e-2, moved

    # ...and reached the rollout server: after each step's sync the server held exactly the weights the
    # actor saved at that step (sha256 fingerprints of all parameters, logged by the server).
    synced = re.findall(r"HF rollout replica 0: .*weight_version=(\d+), global_steps=(\S+), fingerprint=(\w+)", first.log)
    fingerprints = {fp for _, _, fp in synced}
    assert len(synced) >= 3, synced  # initial sync + one per step
    for step, directory in step_dirs.items():
        assert _fingerprint(directory) in fingerprints, (step, synced)
    assert _fingerprint(initial_dir) in fingerprints  # the first sync pushes the initial weights

    second = main_ppo("second", "trainer.total_training_steps=3", *common, config="single_agent")
    assert second.returncode == 0, second.log[-6000:]
    # a fresh start would have run steps 1, 2, 3: resuming from global_step_2 runs step 3 only
    assert second.steps() == [3], second.steps()
    assert (ckpt / "global_step_3" / "actor").is_dir()
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"

    # nothing written into the user's home (Ray temp dir, auth token, caches)
    assert [p.name for p in main_ppo.home.iterdir()] == []
