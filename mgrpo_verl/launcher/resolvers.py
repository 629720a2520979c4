"""OmegaConf resolvers used by our YAML, so that one file serves CPU and GPU machines.

Pure functions of their arguments and of the machine (device, rollout, attention, built-in models and task
files, shipped config files, the warm start's path), registered by :func:`register_resolvers` before Hydra
composes the config; none trains anything. Each resolver: ``docs/cpu.md``, "The resolvers".
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from mgrpo_verl.launcher.warm_start import checkpoint_dir
from mgrpo_verl.platform import uses_cpu

logger = logging.getLogger(__name__)


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
    path = Path(__file__).resolve().parent.parent / "config" / relative
    if not path.is_file():
        raise ValueError(f"mgrpo_config_file: no file {relative!r} in {path.parent}")
    return str(path)


RESOLVERS = {
    "mgrpo_device": _device,
    "mgrpo_if_cpu": lambda mode, on_cpu, otherwise: on_cpu if uses_cpu(mode) else otherwise,
    "mgrpo_attn": _attention,
    "mgrpo_task_file": _task_file,
    "mgrpo_model": _model,
    "mgrpo_tokenizer": _tokenizer,
    "mgrpo_config_file": _config_file,
    "mgrpo_warmstart": checkpoint_dir,
}


def register_resolvers() -> None:
    """Register every resolver above with OmegaConf (idempotent)."""
    for name, fn in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, fn, replace=True)
