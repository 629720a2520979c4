"""OmegaConf resolvers used by our YAML, so that one file serves CPU and GPU machines.

Each resolver is a pure function of its arguments and of what the machine has; none mutates the config.
They are registered by :func:`register_resolvers` before Hydra composes the config, and the driver
resolves the config once before Ray starts (so Ray workers never need them).

- ``mgrpo_device:<mode>``: ``cpu`` when mode is ``cpu``, or ``auto`` and the CPU platform is active; else
  verl's device (``cuda``);
- ``mgrpo_if_cpu:<mode>,<a>,<b>``: ``a`` on CPU, ``b`` otherwise (rollout ``hf`` / ``vllm``, remove-padding
  ``false`` / ``true``, Ray's logical CPUs and GPUs / ``null`` = detect);
- ``mgrpo_attn:<mode>``: Hugging Face attention: ``sdpa`` on CPU; on accelerators ``flash_attention_2`` when
  ``flash_attn`` imports, else ``sdpa`` (logged once);
- ``mgrpo_task_file:<task>,<split>``: path of a built-in task's parquet file (written once into the cache);
- ``mgrpo_model:<name>``: directory of a built-in model (built once into the cache);
- ``mgrpo_tokenizer:<name>,<model path>``: the built-in model's tokenizer directory when ``model path`` is
  that model, else ``null`` (verl then uses the model's own);
- ``mgrpo_config_file:<relative path>``: absolute path of a file shipped in ``mgrpo_verl/config/``;
- ``mgrpo_warmstart:<task>,<agent>[,<settings>]``: directory of ``agent``'s warm-started checkpoint for a task
  (``mgrpo_verl/warmstart``: demonstrations + verl's SFT trainer, built once into the cache, minutes on CPU);
  ``settings`` is a mapping of :class:`mgrpo_verl.warmstart.WarmStartSpec` / ``SFTSettings`` fields, ``null``
  values meaning the defaults (the ``task=relay_tools`` preset passes ``mgrpo_verl.warmstart``).

Also here, because the config layer owns it and it must be importable without verl's trainer: the table of
our trainer modes (:data:`TRAINER_MODES`) and the rule that turns ``multi_agent.decoupled.role`` into one
(:func:`trainer_mode`).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

DEVICE_MODES = ("auto", "cpu", "accelerator")

TRAINER_MODES: dict[Optional[str], str] = {
    None: "mgrpo",  # one process trains every agent: MultiAgentTrainer (trainer/per_agent.py)
    "main": "mgrpo_decoupled_main",  # DecoupledMainTrainer (trainer/decoupled.py)
    "sub": "mgrpo_decoupled_sub",  # DecoupledSubTrainer (trainer/decoupled.py)
}
"""``multi_agent.decoupled.role`` -> the ``trainer.v1.trainer_mode`` (verl's trainer registry) that runs it."""

logger = logging.getLogger(__name__)


def uses_cpu(mode: str) -> bool:
    """Whether a run with ``mgrpo_verl.device=mode`` trains on the CPU platform."""
    if mode not in DEVICE_MODES:
        raise ValueError(f"mgrpo_verl.device must be one of {DEVICE_MODES}, got {mode!r}")
    if mode != "auto":
        return mode == "cpu"
    from mgrpo_verl.platform import cpu_platform_active

    return cpu_platform_active()


def trainer_mode(role: Optional[str], configured: str) -> str:
    """The trainer mode of a multi-agent run whose ``multi_agent.decoupled.role`` is ``role`` and whose
    ``trainer.v1.trainer_mode`` is ``configured``: ``TRAINER_MODES[role]``. Users set only the role, so
    ``configured`` is ``"mgrpo"`` (the YAML's) or already that mode; any other value contradicts the role
    (or is one of verl's single-model modes) and raises ``ValueError``."""
    if role not in TRAINER_MODES:
        raise ValueError(f"multi_agent.decoupled.role must be null, 'main' or 'sub', got {role!r}")
    expected = TRAINER_MODES[role]
    if configured not in (TRAINER_MODES[None], expected):
        raise ValueError(
            f"trainer.v1.trainer_mode={configured!r} contradicts multi_agent.decoupled.role={role!r}, which runs "
            f"the trainer mode {expected!r}: set only the role and leave trainer.v1.trainer_mode at "
            f"{TRAINER_MODES[None]!r} (the role picks the mode)"
        )
    return expected


def _device(mode: str) -> str:
    if uses_cpu(mode):
        return "cpu"
    from verl.utils.device import get_device_name

    return get_device_name()


@functools.lru_cache(maxsize=None)
def flash_attn_importable() -> bool:
    """Whether ``import flash_attn`` works here (once per process). A real import, not a spec lookup:
    a flash-attn built for another torch or CUDA fails only when its extension loads."""
    try:
        import flash_attn  # noqa: F401
    except ImportError as error:
        logger.warning("mgrpo_verl: flash-attn is not importable (%s): attention falls back to sdpa", error)
        return False
    return True


def _attention(mode: str) -> str:
    """verl defaults to ``flash_attention_2``, which needs the optional flash-attn package (PyPI has source
    distributions only, so GPU images often lack it); ``sdpa`` is torch's own and works everywhere."""
    if uses_cpu(mode):
        return "sdpa"
    return "flash_attention_2" if flash_attn_importable() else "sdpa"


def _task_file(task: str, split: str) -> str:
    from mgrpo_verl.envs.builtin import task_files

    train, val = task_files(task)
    return str({"train": train, "val": val}[split])


def _model(name: str) -> str:
    from mgrpo_verl.envs.builtin import model_paths

    return model_paths(name).model_dir


def _tokenizer(name: str, model_path: str) -> Optional[str]:
    from mgrpo_verl.envs.builtin import model_paths

    built = model_paths(name)
    return built.tokenizer_dir if str(model_path) == built.model_dir else None


def _config_file(relative: str) -> str:
    """Absolute path of a file shipped in ``mgrpo_verl/config/`` (e.g. ``tools/relay_sub_tools.yaml``)."""
    path = Path(__file__).resolve().parent / relative
    if not path.is_file():
        raise ValueError(f"mgrpo_config_file: no file {relative!r} in {path.parent}")
    return str(path)


def _warmstart(task: str, agent: str, settings=None) -> str:
    """Directory of ``agent``'s checkpoint in the warm start of ``task`` (built on first use, then cached)."""
    import sys

    from mgrpo_verl.warmstart.build import spec_from_settings, warm_start

    if agent not in ("main", "sub"):
        raise ValueError(f"mgrpo_warmstart: agent must be 'main' or 'sub', got {agent!r}")
    settings = OmegaConf.to_container(settings, resolve=True) if OmegaConf.is_config(settings) else dict(settings or {})
    out = settings.pop("out", None)
    spec = spec_from_settings(task, settings)
    result = warm_start(spec, out, log=lambda msg: print(f"mgrpo_warmstart: {msg}", file=sys.stderr, flush=True))
    return str(result.main if agent == "main" else result.sub)


RESOLVERS = {
    "mgrpo_device": _device,
    "mgrpo_if_cpu": lambda mode, on_cpu, otherwise: on_cpu if uses_cpu(mode) else otherwise,
    "mgrpo_attn": _attention,
    "mgrpo_task_file": _task_file,
    "mgrpo_model": _model,
    "mgrpo_tokenizer": _tokenizer,
    "mgrpo_config_file": _config_file,
    "mgrpo_warmstart": _warmstart,
}


def register_resolvers() -> None:
    """Register every resolver above with OmegaConf (idempotent)."""
    for name, fn in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, fn, replace=True)
