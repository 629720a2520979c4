"""The warm start, end to end and cached: demonstrations -> verl SFT of each agent -> held-out evaluation.

:func:`warm_start` writes the task's demonstrations (:mod:`mgrpo_verl.warmstart.demos`), one dataset per
agent, fine-tunes each agent's base model on its own dataset with verl's SFT trainer
(:mod:`mgrpo_verl.warmstart.sft`), evaluates the pair on held-out samples through the rollout's own loop
(:mod:`mgrpo_verl.warmstart.evaluate`) and publishes, atomically::

    <root>/<task>-<key>/
        manifest.json        inputs, model paths, SFT losses and times, evaluation figures
        main/, sub/          Hugging Face checkpoints (model + tokenizer): give them to main_ppo
        data/<agent>/{train,val}.parquet
        logs/                the SFT runs' logs and verl's per-step metrics

``<key>`` hashes every input (:class:`WarmStartSpec`, the base models' cache folders, :data:`VERSION`), so a
second call with the same inputs returns the published result at once (a file lock makes concurrent callers
wait for the first), like the built-in models of :mod:`mgrpo_verl.models.tiny`. ``<root>`` defaults to
``<cache_root>/warmstart``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from mgrpo_verl.warmstart import demos, sft

#: Bump when the demonstrations, the SFT recipe or the evaluation change: part of every cache key.
VERSION = "1"

#: The RL settings the demonstrations fit (prompt and response lengths in tokens of the tiny tokenizer:
#: prompts with the tool block are about 360 (main) and 345 (sub) tokens, a tool call 35-40 (main), 22 (sub)).
RL_OVERRIDES = (
    "data.max_prompt_length=512",
    "data.max_response_length=128",
    "multi_agent.delegation.sub_response_tokens=48",
    "multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path="
    "${mgrpo_config_file:tools/relay_sub_tools.yaml}",
)


@dataclass(frozen=True)
class WarmStartSpec:
    """Every input of a warm start (the cache key hashes all of it)."""

    task: str = "relay_tools"
    #: base models per agent: a built-in model name (mgrpo_verl.envs.builtin.MODELS) or a model directory
    main_model: str = "tiny"
    sub_model: str = "tiny_sub"
    n_train: int = 256
    n_val: int = 32
    data_seed: int = 0
    sft: sft.SFTSettings = field(default_factory=sft.SFTSettings)
    #: held-out evaluation episodes per temperature (0: no evaluation)
    n_eval: int = 64
    device: str = "cpu"


@dataclass(frozen=True)
class WarmStart:
    """A published warm start."""

    directory: Path
    main: Path
    sub: Path
    manifest: dict[str, Any]

    def main_ppo_overrides(self) -> list[str]:
        """Hydra overrides of ``python -m mgrpo_verl.main_ppo`` that start RL from these checkpoints."""
        return list(self.manifest["main_ppo_overrides"])

    def main_ppo_command(self) -> str:
        """The shell command (quoted) of :meth:`main_ppo_overrides`."""
        import shlex

        return " \\\n    ".join(["python -m mgrpo_verl.main_ppo", *map(shlex.quote, self.main_ppo_overrides())])


def _base_model(name_or_path: str) -> tuple[str, str]:
    """(model dir, tokenizer dir) of a built-in model name or a model directory (its own tokenizer)."""
    from mgrpo_verl.envs.builtin import MODELS, model_paths

    if name_or_path in MODELS:
        paths = model_paths(name_or_path)
        return paths.model_dir, paths.tokenizer_dir
    path = Path(name_or_path).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"{name_or_path!r} is neither a built-in model ({', '.join(MODELS)}) nor a model directory")
    return str(path), str(path)


def default_root() -> Path:
    from mgrpo_verl.models.tiny import cache_root

    return cache_root() / "warmstart"


def cache_key(spec: WarmStartSpec, bases: dict[str, tuple[str, str]]) -> str:
    from mgrpo_verl.models.tiny import _key

    payload = {"v": VERSION, "spec": asdict(spec), "bases": {a: [Path(p).name for p in bases[a]] for a in bases}}
    return _key(payload)


def cached(spec: WarmStartSpec, root: Optional[str | Path] = None) -> Optional[WarmStart]:
    """The published warm start of ``spec`` under ``root``, or ``None`` when there is none yet."""
    bases = {"main": _base_model(spec.main_model), "sub": _base_model(spec.sub_model)}
    target = Path(root or default_root()) / f"{spec.task}-{cache_key(spec, bases)}"
    return _published(target)


def _published(target: Path) -> Optional[WarmStart]:
    manifest = target / "manifest.json"
    if not manifest.is_file():
        return None
    return WarmStart(target, target / "main", target / "sub", json.loads(manifest.read_text()))


def warm_start(spec: WarmStartSpec = WarmStartSpec(), root: Optional[str | Path] = None, log=print) -> WarmStart:
    """The warm start of ``spec``: the published one when it exists, else built and published now."""
    from mgrpo_verl.models.tiny import _build_once

    if spec.task not in demos.TASKS:  # before anything is built
        raise ValueError(f"no demonstrations for task {spec.task!r}; tasks with demonstrations: {sorted(demos.TASKS)}")
    bases = {"main": _base_model(spec.main_model), "sub": _base_model(spec.sub_model)}
    root = Path(root or default_root())
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{spec.task}-{cache_key(spec, bases)}"
    found = _published(target)
    if found is not None:
        log(f"warm start: cached at {target}")
        return found
    _build_once(target, lambda tmp: _build(spec, bases, tmp, target, log))
    result = _published(target)
    assert result is not None
    return result


def _build(spec: WarmStartSpec, bases: dict[str, tuple[str, str]], tmp: Path, target: Path, log) -> None:
    """Build everything into ``tmp`` (renamed to ``target`` by the caller); paths in the manifest are final."""
    start = time.monotonic()
    log(f"warm start: demonstrations of {spec.task} ({spec.n_train} train / {spec.n_val} val) -> {tmp / 'data'}")
    data = demos.write_sft_datasets(tmp / "data", spec.task, spec.n_train, spec.n_val, spec.data_seed)
    (tmp / "logs").mkdir()
    agents: dict[str, Any] = {}
    for agent in demos.AGENTS:
        model_dir, tokenizer_dir = bases[agent]
        run_dir = tmp / "sft" / agent
        log(f"warm start: verl SFT of {agent} ({spec.sft.steps} steps, batch {spec.sft.batch_size}, lr {spec.sft.lr}) ...")
        checkpoint, seconds = sft.train(
            model_dir, tokenizer_dir, data[agent]["train"], data[agent]["val"], run_dir, spec.sft,
            tmp / "logs" / f"sft_{agent}.log", spec.device,
        )  # fmt: skip
        sft.publish(checkpoint, tmp / agent, model_dir)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        (tmp / "logs" / f"sft_{agent}_metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text())
        losses = [m["data"]["train/loss"] for m in metrics if "train/loss" in m.get("data", {})]
        val = [m["data"]["val/loss"] for m in metrics if "val/loss" in m.get("data", {})]
        agents[agent] = {
            "base_model": model_dir,
            "tokenizer": tokenizer_dir,
            "checkpoint": str(target / agent),
            "sft_seconds": round(seconds, 1),
            "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None,
            "val_loss": val[-1] if val else None,
        }
        log(f"warm start: {agent} done in {seconds:.0f} s, train loss {agents[agent]['first_loss']} -> "
            f"{agents[agent]['final_loss']}, val loss {agents[agent]['val_loss']}")  # fmt: skip
    if not spec.sft.save_every:
        import shutil

        shutil.rmtree(tmp / "sft")  # the published copies are all that is needed
    evaluation = []
    if spec.n_eval > 0:
        from mgrpo_verl.warmstart.evaluate import evaluate

        log(f"warm start: held-out evaluation, {spec.n_eval} episodes per temperature ...")
        results = evaluate(str(tmp / "main"), str(tmp / "sub"), str(tmp / "main"), n=spec.n_eval, seed=spec.data_seed)
        evaluation = [r.as_dict() for r in results]
        for r in evaluation:
            log(f"warm start: T={r['temperature']}: exact {r['exact']:.3f}, main parse {r['main_parse']:.3f}, "
                f"sub parse {r['sub_parse']:.3f}, sub exact {r['sub_exact']:.3f}; p(right digit) main "
                f"{r['main_digit_prob']:.3f}, sub {r['sub_digit_prob']:.3f}")  # fmt: skip
    manifest = {
        "version": VERSION,
        "spec": asdict(spec),
        "directory": str(target),
        "agents": agents,
        "evaluation": evaluation,
        "seconds": round(time.monotonic() - start, 1),
        "main_ppo_overrides": [
            f"mgrpo_verl.task={spec.task}",
            f"actor_rollout_ref.model.path={target / 'main'}",
            f"multi_agent.agents.sub.actor_rollout_ref.model.path={target / 'sub'}",
            *RL_OVERRIDES,
        ],
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
