"""Export the LoRA agents of a checkpoint, each as a merged Hugging Face model (docs/lora.md).

    python -m mgrpo_verl.trainer.lora_export <ckpt>/global_step_N <out dir> [--agents main sub]

For every LoRA agent saved in the step folder (``agents.json`` names its base ``model`` and its ``lora``
settings), the base is loaded from its model path, the agent's adapter from its actor checkpoint
(``agents/<name>/actor/model_world_size_W_rank_R.pt``, verl's FSDP checkpoint), and ``peft``'s
``merge_and_unload`` writes ``<out>/<name>/`` (weights, config, tokenizer): a plain model any HF / vLLM
loader opens. Before merging, the base tensors in the checkpoint are compared with the model path's, bit for
bit: a LoRA agent's base is frozen, so any difference means the checkpoint belongs to another base.

Differs from verl's ``model_merger``, which merges one actor at a time and needs the LoRA config from its
command line: here the agents' own settings come from ``agents.json`` and every agent is exported at once.
Agents without LoRA are left out (verl's ``model_merger`` exports them). Tested with one worker per agent
(CPU); with several ranks each ``Shard(0)`` tensor is concatenated from the ranks' files in rank order.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
from typing import Any

import torch


def _local(value: Any) -> torch.Tensor:
    return value.to_local() if hasattr(value, "to_local") else value


def load_actor_state(actor_dir: str) -> dict[str, torch.Tensor]:
    """The full model state dict of one agent's FSDP actor checkpoint, on CPU."""
    files = glob.glob(os.path.join(actor_dir, "model_world_size_*_rank_*.pt"))
    if not files:
        raise FileNotFoundError(f"{actor_dir}: no model_world_size_*_rank_*.pt (verl's FSDP actor checkpoint)")
    by_rank = {int(re.search(r"_rank_(\d+)\.pt$", f).group(1)): f for f in files}
    world = int(re.search(r"model_world_size_(\d+)_", files[0]).group(1))
    if sorted(by_rank) != list(range(world)):
        raise FileNotFoundError(f"{actor_dir}: ranks {sorted(by_rank)} saved, expected 0..{world - 1}")
    shards = [torch.load(by_rank[r], map_location="cpu", weights_only=False) for r in range(world)]
    state = {}
    for key, value in shards[0].items():
        sharded = hasattr(value, "placements") and any(getattr(p, "dim", None) == 0 for p in value.placements)
        state[key] = torch.cat([_local(s[key]) for s in shards], dim=0) if sharded and world > 1 else _local(value)
    return state


def lora_settings(model_config: Any) -> dict[str, Any] | None:
    """The LoRA settings of one agent's ``actor_rollout_ref.model`` (verl's keys) for ``agents.json``; ``None``
    without LoRA."""
    from omegaconf import OmegaConf

    get = model_config.get
    rank = get("lora_rank", 0) or 0
    if rank <= 0:
        return None
    plain = {k: get(k, None) for k in ("lora_alpha", "target_modules", "exclude_modules", "target_parameters")}
    plain = {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in plain.items()}
    return {"lora_rank": int(rank), **plain}


def _peft_config(lora: dict[str, Any]):
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", r=lora["lora_rank"], lora_alpha=lora["lora_alpha"],
                      target_modules=lora.get("target_modules"), exclude_modules=lora.get("exclude_modules"),
                      target_parameters=lora.get("target_parameters"), bias="none")


def export_agent(step_dir: str, name: str, entry: dict, out_dir: str) -> dict[str, Any]:
    """Merge one LoRA agent's adapter into its base and save it under ``out_dir``; returns a report."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    actor = os.path.join(step_dir, "agents", name, "actor")
    state = load_actor_state(actor)
    dtype = next(v.dtype for k, v in state.items() if "lora_" not in k)
    base = AutoModelForCausalLM.from_pretrained(entry["model"], dtype=dtype)
    model = get_peft_model(base, _peft_config(entry["lora"]))
    own = model.state_dict()
    lora = {k: v for k, v in state.items() if "lora_" in k}
    missing = sorted(k for k in own if "lora_" in k and k not in lora)
    unknown = sorted(k for k in state if k not in own)
    if missing or unknown:
        raise ValueError(f"agent {name!r}: the checkpoint's adapter does not match its lora settings {entry['lora']} "
                         f"(missing {missing[:3]}, unknown {unknown[:3]})")
    changed = [k for k, v in state.items() if "lora_" not in k and not torch.equal(v, own[k])]
    if changed:
        raise ValueError(f"agent {name!r}: {len(changed)} base tensor(s) in {actor} differ from {entry['model']}, e.g. "
                         f"{changed[:3]}: this checkpoint was not trained on that base")
    model.load_state_dict(lora, strict=False)
    merged = model.merge_and_unload()
    target = os.path.join(out_dir, name)
    if os.path.exists(target):
        shutil.rmtree(target)
    merged.save_pretrained(target)
    hf = os.path.join(actor, "huggingface")
    if os.path.isdir(hf) and os.path.exists(os.path.join(hf, "tokenizer_config.json")):
        AutoTokenizer.from_pretrained(hf).save_pretrained(target)
    return {"agent": name, "path": target, "adapter_tensors": len(lora), "base_tensors_checked": len(state) - len(lora)}


def export(step_dir: str, out_dir: str, agents: list[str] | None = None) -> list[dict[str, Any]]:
    """Every LoRA agent of ``step_dir`` (or those named) as a merged HF model under ``out_dir/<agent>``."""
    with open(os.path.join(step_dir, "agents.json")) as f:
        manifest = json.load(f)
    names = agents or [n for n, e in manifest.items() if e.get("lora") and e.get("trainable")]
    bad = [n for n in names if n not in manifest or not manifest[n].get("lora")]
    if bad:
        known = [n for n, e in manifest.items() if e.get("lora")]
        raise ValueError(f"{step_dir}: {bad} are not LoRA agents of this checkpoint; LoRA agents: {known}")
    if not names:
        raise ValueError(f"{step_dir}: no trained LoRA agent (agents.json has no 'lora' entry)")
    return [export_agent(step_dir, n, manifest[n], out_dir) for n in names]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step_dir", help="a complete <default_local_dir>/global_step_N folder")
    parser.add_argument("out_dir")
    parser.add_argument("--agents", nargs="*", default=None, help="default: every trained LoRA agent")
    args = parser.parse_args(argv)
    for report in export(args.step_dir, args.out_dir, args.agents):
        print(json.dumps(report))


if __name__ == "__main__":
    main()
