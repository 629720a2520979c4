"""End to end: stock ``python -m verl.trainer.main_ppo`` runs two GRPO steps on CPU.

Everything verl-side is stock; what makes it work on CPU is ours: the CPU platform, the CPU engine
registration and the process-group patch (mgrpo_verl.platform, loaded by the ``verl.plugins`` entry point
in every process), the HF rollout replica (mgrpo_verl.hf_rollout) and the tiny model builder
(mgrpo_verl.models.tiny). Ray runs on 16 logical CPUs and 1 logical GPU in a private temp dir.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

# full: stock verl's main_ppo also runs on CPU in CI, in the GPU campaign's dry run (tests/experiments/test_gpu_campaign.py, T3)
pytestmark = [pytest.mark.slow, pytest.mark.full]

# Registers the HF rollout in every process through verl's VERL_USE_EXTERNAL_MODULES hook (harmless if
# our plugin already does it: registration is idempotent).
ROLLOUT_SHIM = "from mgrpo_verl.hf_rollout import register\n\nregister()\n"


def _write_data(directory: Path) -> tuple[str, str]:
    import random

    import pandas as pd

    rng = random.Random(0)

    def rows(n: int, split: str) -> pd.DataFrame:
        out = []
        for i in range(n):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            out.append(
                {
                    "data_source": "openai/gsm8k",  # verl's built-in rule reward ("#### <answer>")
                    "prompt": [
                        {"role": "user", "content": f'What is {a} + {b}? Output the final answer after "####".'}
                    ],
                    "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                    "extra_info": {"split": split, "index": i},
                }
            )
        return pd.DataFrame(out)

    train, val = directory / "train.parquet", directory / "val.parquet"
    rows(16, "train").to_parquet(train)
    rows(4, "test").to_parquet(val)
    return str(train), str(val)


def main_ppo_overrides(model_dir: str, tokenizer_dir: str, train: str, val: str) -> list[str]:
    """The Hydra overrides of a 2-step GRPO run on CPU (everything else is verl's default)."""
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=16",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.model.tokenizer_path={tokenizer_dir}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # verl defaults to flash_attention_2
        "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP1 hard-codes sync_module_states / cuda device strings
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_training_steps=2",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "ray_kwargs.ray_init.num_cpus=16",
        "+ray_kwargs.ray_init.num_gpus=1",
    ]


def test_main_ppo_two_grpo_steps_on_cpu(tmp_path, monkeypatch):
    from mgrpo_verl.models import tiny
    from mgrpo_verl.platform.ray_session import private_temp_dir, ray_cpu_env

    monkeypatch.setenv("MGRPO_VERL_CACHE", str(tmp_path / "cache"))
    model_dir, tokenizer_dir = tiny.build_tiny_model()
    train, val = _write_data(tmp_path)
    (tmp_path / "_mgrpo_e2e_rollout.py").write_text(ROLLOUT_SHIM)
    home = tmp_path / "home"
    home.mkdir()

    with private_temp_dir() as ray_tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_ADDRESS")}
        env.update(ray_cpu_env(ray_tmp))
        env.update(
            HOME=str(home),
            HF_HOME=str(tmp_path / "hf"),  # verl loads parquet with `datasets`, which caches under HF_HOME
            PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
            VERL_USE_EXTERNAL_MODULES="_mgrpo_e2e_rollout",
            TOKENIZERS_PARALLELISM="false",
            MGRPO_VERL_DEVICE="cpu",
        )
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "verl.trainer.main_ppo", *main_ppo_overrides(model_dir, tokenizer_dir, train, val)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        elapsed = time.monotonic() - start
    log = proc.stdout + proc.stderr
    (tmp_path / "main_ppo.log").write_text(log)
    assert proc.returncode == 0, f"main_ppo failed after {elapsed:.0f} s; log tail:\n{log[-8000:]}"
    steps = re.findall(r"step:(\d+) - .*?timing_s/step:([0-9.]+)", log)
    assert [s for s, _ in steps] == ["1", "2"], log[-8000:]
    for needle in ("Duplicate device type", "No engine registered", "Falling back to 'nvidia'"):
        assert needle not in log
    assert [str(p.relative_to(home)) for p in home.rglob("*")] == [], "files written to $HOME"
    print(f"main_ppo: {elapsed:.0f} s wall, step times {[float(t) for _, t in steps]} s")
