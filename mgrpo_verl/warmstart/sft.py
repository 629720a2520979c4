"""Fine-tuning one agent's model with verl's own SFT trainer (``verl/trainer/sft_trainer.py``).

``python -m mgrpo_verl.warmstart.sft <hydra overrides>`` is verl's ``sft_trainer`` entry point (its Hydra
config ``sft_trainer_engine``, its ``SFTTrainer``, its FSDP engine and checkpoint handler) after our plugin's
registrations have run with their errors visible (:func:`mgrpo_verl.plugin.ensure_registered`: verl swallows
a failing plugin): on a CPU-only machine that is the CPU platform, verl's FSDP engines registered for device
``cpu`` and the process-group patch (gloo, ``mgrpo_verl/platform``). It runs as one child process, not under
``torchrun`` (docs/security.md "Network exposure"): torchrun's elastic agent keeps a rendezvous store that
listens on every interface and unpickles what it reads from it every few seconds, and it starts the trainer in a
session of its own, which outlives a kill of the build's process group. Here verl's trainer gets the rank from
:func:`single_process_env` (rank 0 of 1, the process group's store a file in the run's folder, gloo on
loopback), and the child dies with the process that started it (:func:`die_with_parent`).

:func:`train` builds the command: :func:`overrides` are the settings a tiny model needs on CPU (fp32, sdpa
attention, no remove-padding, no ``torch.compile``, no gradient checkpointing) plus the run's data, steps
and optimiser, and ``checkpoint.save_contents=[hf_model]``: the checkpoint verl writes is a Hugging Face
folder (model, config, generation config, tokenizer with its chat template) under
``<out>/global_step_<n>/huggingface``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mgrpo_verl.platform.ray_session import loopback_interface
from mgrpo_verl.progress import JsonlFollower


@dataclass(frozen=True)
class SFTSettings:
    """What one agent's fine-tuning run varies (everything else is fixed by :func:`overrides`)."""

    steps: int = 250
    batch_size: int = 16
    lr: float = 5e-3
    #: verl's ``trainer.seed`` / ``engine.seed``. It changes no result of a warm start: verl 0.9.1's SFT trainer
    #: shuffles with ``DistributedSampler``'s own seed (0, not passed) and the model starts from its checkpoint
    #: (measured: SFT seeds 0 and 1 gave identical losses). ``WarmStartSpec.data_seed`` changes the data.
    seed: int = 0
    #: verl's ``optim.lr_scheduler_type`` after the 5 % warm-up: ``constant`` or ``cosine`` (down to 0 at the last
    #: step: what is published is never a step taken at full learning rate)
    lr_schedule: str = "constant"
    #: also keep Hugging Face checkpoints every this many steps (0: the last step only)
    save_every: int = 0

    def __post_init__(self):
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"warm start lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")


#: verl's learning-rate schedules (``optim.lr_scheduler_type``).
LR_SCHEDULES = ("constant", "cosine")


def overrides(
    model_dir: str,
    tokenizer_dir: str,
    train_file: str | Path,
    val_file: Optional[str | Path],
    out_dir: str | Path,
    settings: SFTSettings,
    device: str = "cpu",
    max_length: int = 1024,
) -> list[str]:
    """Hydra overrides of verl's ``sft_trainer_engine`` config for one run. ``max_length``: verl pads every sequence
    to it on CPU (no remove-padding there), so it is what the step computes on (:func:`fit_max_length`)."""
    cpu = device == "cpu"
    dtype = "fp32" if cpu else "bf16"
    return [
        f"data.train_files={train_file}",
        f"data.val_files={val_file if val_file else 'null'}",
        # the demonstrations' tools column is JSON text (mgrpo_verl/warmstart/dataset.py)
        "data.custom_cls.path=pkg://mgrpo_verl.warmstart.dataset",
        "data.custom_cls.name=JsonToolsSFTDataset",
        f"data.train_batch_size={settings.batch_size}",
        f"data.micro_batch_size_per_gpu={settings.batch_size}",
        "data.use_dynamic_bsz=False",
        f"data.max_length={max_length}",
        "data.num_workers=0",
        f"model.path={model_dir}",
        f"model.tokenizer_path={tokenizer_dir}",
        f"model.use_remove_padding={not cpu}",
        "model.enable_gradient_checkpointing=False",
        "+model.override_config.attn_implementation=sdpa",
        "engine.strategy=fsdp2",
        f"engine.use_torch_compile={not cpu}",
        f"engine.seed={settings.seed}",
        f"+engine.mixed_precision={{param_dtype:{dtype},reduce_dtype:fp32,buffer_dtype:fp32}}",
        f"optim.lr={settings.lr}",
        "optim.lr_warmup_steps_ratio=0.05",
        f"optim.lr_scheduler_type={settings.lr_schedule}",
        f"trainer.device={device}",
        f"trainer.seed={settings.seed}",
        f"trainer.total_training_steps={settings.steps}",
        "trainer.total_epochs=100000",  # the step count decides
        f"trainer.save_freq={settings.save_every if settings.save_every > 0 else -1}",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        f"trainer.default_local_dir={out_dir}",
        "trainer.project_name=mgrpo_warmstart",
        f"trainer.experiment_name={Path(out_dir).name}",
        "trainer.resume_mode=disable",
        "checkpoint.save_contents=[hf_model]",
    ]


def fit_max_length(files: list[str | Path], tokenizer_dir: str, multiple: int = 32) -> int:
    """The longest demonstration of ``files`` in tokens, as verl's SFT dataset tokenises it (our
    :class:`~mgrpo_verl.warmstart.dataset.JsonToolsSFTDataset`, chat template and tools included), rounded up to
    ``multiple``: the ``data.max_length`` that wastes no compute on padding. verl's default, 1024, padded the
    ~260-token ``relay_tools`` demonstrations to 4 times their length (32: the step's time follows the length)."""
    from omegaconf import OmegaConf
    from verl.utils import hf_tokenizer

    from mgrpo_verl.warmstart.dataset import JsonToolsSFTDataset

    tokenizer = hf_tokenizer(tokenizer_dir)
    config = OmegaConf.create({"pad_mode": "no_padding", "max_length": 1 << 20, "truncation": "error"})
    longest = 0
    for file in files:
        dataset = JsonToolsSFTDataset(str(file), tokenizer, config)
        longest = max([longest, *(len(dataset[i]["input_ids"]) for i in range(len(dataset)))])
    return max(multiple, -(-longest // multiple) * multiple)


def logged_steps(records: list[dict]) -> list[tuple[int, Optional[float]]]:
    """``(step, train loss or None)`` of verl's metrics records that carry a step (validation lines included)."""
    out = []
    for record in records:
        data = record.get("data") if isinstance(record.get("data"), dict) else {}
        try:
            step = int(record["step"])
        except (KeyError, TypeError, ValueError):
            continue  # not a step record: nothing to show
        loss = data.get("train/loss")
        out.append((step, float(loss) if isinstance(loss, (int, float)) else None))
    return out


def hf_checkpoint(out_dir: str | Path, step: int) -> Path:
    """Where verl's checkpoint handler writes the Hugging Face folder of ``step``."""
    return Path(out_dir) / f"global_step_{step}" / "huggingface"


def train(
    model_dir: str,
    tokenizer_dir: str,
    train_file: str | Path,
    val_file: Optional[str | Path],
    out_dir: str | Path,
    settings: SFTSettings,
    log_path: str | Path,
    device: str = "cpu",
    on_step: Optional[Callable[[int, Optional[float]], None]] = None,
    poll_s: float = 1.0,
    max_length: int = 1024,
) -> tuple[Path, float]:
    """One SFT run in a child process (one rank, :func:`single_process_env`); returns the last step's Hugging Face
    checkpoint and the seconds the run took. verl's per-step metrics go to ``<out_dir>/metrics.jsonl``, which is
    followed while the run lasts: ``on_step(step, train loss)`` for every step verl has logged (a progress line).

    Raises:
        RuntimeError: the run failed (its log's tail in the message) or left no checkpoint.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    store = tempfile.mkdtemp(prefix=".process_group-", dir=out_dir)
    metrics = JsonlFollower(out_dir / "metrics.jsonl")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VERL_FILE_LOGGER_PATH": str(metrics.path),
           **single_process_env(Path(store) / "store", os.environ)}
    if device == "cpu":
        env["MGRPO_VERL_DEVICE"] = "cpu"
    args = [sys.executable, "-m", "mgrpo_verl.warmstart.sft",
            *overrides(model_dir, tokenizer_dir, train_file, val_file, out_dir, settings, device, max_length)]
    start = time.monotonic()
    try:
        with open(log_path, "w") as log:
            # in our process group (a kill of the group reaches it); killed here when we are interrupted
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out_dir)
            try:
                while True:
                    try:
                        proc.wait(timeout=poll_s)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    finally:
                        for step, loss in logged_steps(metrics.new_records()):
                            if on_step is not None:
                                on_step(step, loss)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        shutil.rmtree(store, ignore_errors=True)
    seconds = time.monotonic() - start
    checkpoint = hf_checkpoint(out_dir, settings.steps)
    if proc.returncode != 0 or not (checkpoint / "model.safetensors").is_file():
        tail = Path(log_path).read_text(errors="replace")[-3000:]
        raise RuntimeError(f"verl's SFT trainer failed (exit {proc.returncode}); see {log_path}:\n{tail}")
    return checkpoint, seconds


#: ``config.json`` keys that verl's checkpoint writer changes without changing the model: ``dtype`` (it
#: builds the saved model in bf16 and then stores the fp32 weights of the run, so the file claims bfloat16)
#: and ``attn_implementation`` (the run's ``override_config``). The published copy takes the base model's.
RESTORED_CONFIG_KEYS = ("dtype", "attn_implementation")


def publish(checkpoint: Path, target: Path, base_model_dir: str | Path) -> Path:
    """Copy a Hugging Face checkpoint folder to ``target`` with readable permissions (verl writes the
    weights 0600) and :data:`RESTORED_CONFIG_KEYS` of ``config.json`` as the base model has them."""
    shutil.copytree(checkpoint, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    base = json.loads((Path(base_model_dir) / "config.json").read_text())
    config_path = target / "config.json"
    config = json.loads(config_path.read_text())
    for key in RESTORED_CONFIG_KEYS:
        if key in base:
            config[key] = base[key]
        else:
            config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return target


#: Tokenizer files a Hugging Face model folder may carry (copied by :func:`publish_base`).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "added_tokens.json")  # fmt: skip


def publish_base(model_dir: str | Path, tokenizer_dir: str | Path, target: Path) -> Path:
    """Publish a model without fine-tuning it (``steps=0``): its folder, plus its tokenizer's files when the
    tokenizer lives elsewhere (the built-in models), so ``target`` loads on its own like a checkpoint."""
    shutil.copytree(model_dir, target)
    if Path(tokenizer_dir).resolve() != Path(model_dir).resolve():
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copy2(Path(tokenizer_dir) / name, target / name)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


#: The variable that tells the child which process started it (:func:`die_with_parent`).
PARENT_ENV = "MGRPO_SFT_PARENT_PID"


def single_process_env(store_file: str | Path, environ: dict | os._Environ) -> dict[str, str]:
    """What verl's SFT trainer reads from torchrun's environment, for one process without torchrun:
    rank 0 of 1, and the process group's rendezvous through a file (``DIST_INIT_METHOD``, which verl's
    ``initialize_global_process_group`` passes to ``torch.distributed``) instead of a TCP store (which listens
    on every interface whatever ``MASTER_ADDR`` says; ``MASTER_ADDR`` / ``MASTER_PORT`` are set only because
    verl's ``Worker`` requires them). Gloo's own socket goes on loopback
    (``GLOO_SOCKET_IFNAME``: the interface holding 127.0.0.1, unless ``environ`` sets it)."""
    return {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
        "DIST_INIT_METHOD": f"file://{Path(store_file).absolute()}?rank=0&world_size=1",
        # verl's Worker reads (and only records) these; port 0: nothing is to listen or connect there
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0",
        "GLOO_SOCKET_IFNAME": environ.get("GLOO_SOCKET_IFNAME") or loopback_interface(),
        PARENT_ENV: str(os.getpid()),
    }  # fmt: skip


def die_with_parent() -> None:
    """In the child: be killed (SIGKILL) when the process named by :data:`PARENT_ENV` ends, however it ends
    (``prctl(PR_SET_PDEATHSIG)``, Linux; elsewhere nothing). A parent already gone: exit now."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):  # it ended before the line above took effect
        os._exit(1)


def main() -> None:
    die_with_parent()
    # the CPU platform and its engines (all the SFT trainer needs of ours), registered here so that an error shows:
    # verl swallows a plugin's exceptions on ``import verl``
    from mgrpo_verl.platform import register_cpu_platform

    register_cpu_platform()
    from verl.trainer.sft_trainer import main as verl_sft_main

    verl_sft_main()


if __name__ == "__main__":
    main()
