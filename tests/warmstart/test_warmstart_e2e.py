"""``python -m mgrpo_verl.warmstart`` end to end on the tiny models, two SFT steps per agent: verl's SFT
trainer runs on CPU (one child process per run, our platform), leaves Hugging Face checkpoints that load with
their tokenizer, the evaluation runs through the rollout loop, and a second call is served from the cache, until a
published file is damaged. About 20 s on 2 cores (three SFT start-ups), so not marked slow."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from mgrpo_verl.platform.ray_session import patched_environ
from mgrpo_verl.warmstart import build, demos, sft
from mgrpo_verl.warmstart.__main__ import main as cli_main
from mgrpo_verl.warmstart.__main__ import parse_args

ARGS = ["--n-train", "8", "--n-val", "4", "--steps", "2", "--main-restart-steps", "2", "--sub-steps", "2", "--batch-size", "4",
        "--n-eval", "2"]


def test_sft_command_end_to_end_then_cached(tmp_path, cache_dir, tiny_paths, capsys, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.utils import hf_tokenizer

    root = tmp_path / "warmstart"
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        cli_main(["--task", "relay_tools", "--out", str(root), *ARGS])
        captured = capsys.readouterr()
        out = captured.out
        # every SFT run showed its progress, ending on its last step with verl's loss of it
        for name in ("main", "main_restart", "sub"):
            [final] = [line for line in captured.err.splitlines() if line.startswith(f"warm start: {name} SFT 2/2 steps [100%]")]
            assert "  loss " in final, final
        [published] = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("relay_tools-")]
        manifest = json.loads((published / "manifest.json").read_text())

        # one SFT run per agent, its loss recorded by verl's file logger: the main agent from its default base
        # (tiny_init01), the sub-agent (by default) from the main agent's fine-tuned checkpoint
        base = {"main": build._base_model(build.WarmStartSpec().main_model)[0], "sub": str(published / "main")}
        for agent in demos.AGENTS:
            info = manifest["agents"][agent]
            assert info["base_model"] == base[agent] and info["checkpoint"] == str(published / agent)
            assert info["sft_steps"] == 2 and info["restart_steps"] == (2 if agent == "main" else 0)
            assert info["first_loss"] > 0 and info["final_loss"] > 0 and info["val_loss"] > 0
            assert (published / "logs" / f"sft_{agent}.log").is_file()
            # the main agent's warm restart: a second verl SFT run, its steps appended to the first run's metrics
            if agent == "main":
                assert (published / "logs" / "sft_main_restart.log").is_file()
                # the first run at a constant lr, the restart decaying to 0 (verl prints its optimiser config)
                assert "'lr_scheduler_type': 'constant'" in (published / "logs" / "sft_main.log").read_text()
                assert "'lr_scheduler_type': 'cosine'" in (published / "logs" / "sft_main_restart.log").read_text()
                steps = [json.loads(line)["step"] for line in (published / "logs" / "sft_main_metrics.jsonl").read_text().splitlines()
                         if "train/loss" in json.loads(line)["data"]]
                assert steps == [1, 2, 1, 2]
            ckpt = published / agent
            for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
                assert (ckpt / name).is_file(), name
            # the weights moved away from the base model's
            tuned, before = load_file(ckpt / "model.safetensors"), load_file(f"{base[agent]}/model.safetensors")
            assert tuned.keys() == before.keys()
            assert any(not torch.equal(tuned[k], before[k]) for k in tuned)
            # config.json as the base model's where verl's writer changes it without changing the model
            config, base_config = (json.loads((d / "config.json").read_text()) for d in (ckpt, Path(base[agent])))
            assert config["dtype"] == base_config["dtype"] == "float32" and "attn_implementation" not in config
            model = AutoModelForCausalLM.from_pretrained(str(ckpt))
            assert next(model.parameters()).dtype == torch.float32
            # the checkpoint's own tokenizer (what main_ppo loads when only model.path is given) tokenises the
            # demonstrations exactly as the base tokenizer, chat template included
            own, reference = hf_tokenizer(str(ckpt)), AutoTokenizer.from_pretrained(tiny_paths.tokenizer_dir)
            episode = demos.demos_for("relay_tools").episodes(1, 0, "val")[0]
            kwargs = {"tools": episode.tools[agent], "tokenize": True, "return_dict": False}
            assert own.apply_chat_template(episode.messages[agent], **kwargs) == reference.apply_chat_template(
                episode.messages[agent], **kwargs
            )

        # the evaluation ran through the rollout loop, greedy and sampled
        assert [r["temperature"] for r in manifest["evaluation"]] == [0.0, 1.0]
        assert all(r["episodes"] == 2 and 0 <= r["exact"] <= 1 and 0 <= r["main_parse"] <= 1 for r in manifest["evaluation"])
        # what to run next
        assert f"actor_rollout_ref.model.path={published / 'main'}" in out
        assert f"multi_agent.agents.sub.actor_rollout_ref.model.path={published / 'sub'}" in out
        assert not (published / "sft").exists()  # only the published checkpoints are kept

        # a second call with the same inputs is served from the cache, nothing trained
        def refuse(*args, **kwargs):
            raise AssertionError("trained again")

        monkeypatch.setattr(sft, "train", refuse)
        start = time.monotonic()
        cli_main(["--task", "relay_tools", "--out", str(root), *ARGS])
        assert time.monotonic() - start < 10
        assert "cached at" in capsys.readouterr().out
        # other inputs, another key
        spec, _ = parse_args(["--out", str(root), *ARGS])
        assert build.cached(spec, root).directory == published
        other, _ = parse_args(["--out", str(root), *ARGS, "--lr", "0.01"])
        assert build.cached(other, root) is None

        # the manifest records every published file; a truncated weights file is refused, naming the file, not
        # handed to RL
        weights = published / "main" / "model.safetensors"
        assert manifest["files"]["main/model.safetensors"]["size"] == weights.stat().st_size
        assert {"sub/model.safetensors", "main/tokenizer.json", "data/main/train.parquet"} <= set(manifest["files"])
        weights.write_bytes(weights.read_bytes()[:1000])
        with pytest.raises(build.WarmStartCorrupt, match=f"{weights} has 1000 bytes"):
            cli_main(["--task", "relay_tools", "--out", str(root), *ARGS])
