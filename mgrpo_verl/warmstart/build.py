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

Trusted only when intact: the manifest records the size and sha256 of every published file (``files``), and a
cached warm start is checked against it before it is returned (:class:`WarmStartCorrupt` names the file that
differs: a weights file truncated by a crash or a full disk no longer reaches a training worker); a manifest
without records (a warm start cached before they existed) cannot be checked and is refused the same way, naming
the folder to delete. The build is
flushed to disk (``fsync``) before it is published. A build interrupted by SIGTERM or SIGHUP removes its
temporary folder like one interrupted by Ctrl-C; one killed outright leaves it to the next build, which removes
it (``mgrpo_verl.models.tiny.build_once``), and its SFT child dies with it
(:func:`~mgrpo_verl.warmstart.sft.die_with_parent`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from mgrpo_verl.progress import Progress
from mgrpo_verl.trainer.checkpoints import fsync_tree
from mgrpo_verl.warmstart import demos, sft

#: Bump when the demonstrations, the SFT recipe or the evaluation change: part of every cache key.
VERSION = "6"

#: ``sub_model`` value: the sub-agent's SFT starts from the main agent's fine-tuned checkpoint (trained first).
FROM_MAIN = "main"

#: ``python -m mgrpo_verl.main_ppo`` preset of the tasks with a warm start (mgrpo_verl/config/task/<task>.yaml:
#: the lengths the demonstrations need, the sub-agent's tools, the RL learning rate); the model paths given
#: with it replace the preset's ``mgrpo_warmstart`` resolver.
PRESETS = {"relay_tools": "task=relay_tools"}


@dataclass(frozen=True)
class WarmStartSpec:
    """Every input of a warm start (the cache key hashes all of it)."""

    task: str = "relay_tools"
    #: base models per agent: a built-in model name (mgrpo_verl.envs.builtin.MODELS) or a model directory;
    #: for the sub-agent also :data:`FROM_MAIN`: the main agent's fine-tuned checkpoint. That is the default
    #: because copying a digit out of a tool response is learnt by these tiny models only in a sudden
    #: transition after hundreds of steps (docs/warmstart.md): the main agent goes through it (its report
    #: copy), the sub-agent started from random weights did not within 1000 steps, and started from the
    #: main agent's checkpoint it copies its own tool's answer after tens of steps.
    #: The main agent's default is ``tiny`` initialised at std 0.1 (``tiny_init01``): at Qwen2's 0.02 the copy
    #: needed 500 + 300 steps, at 0.1 250 + 100 (docs/warmstart.md, version 4).
    main_model: str = "tiny_init01"
    sub_model: str = FROM_MAIN
    #: SFT steps of the sub-agent (``None``: ``sft.steps``, as the main agent). 150: the copy of its tool's digit,
    #: shown in 40 % of its demonstrations, is learnt by then (docs/warmstart.md, version 5; 40 in version 4)
    sub_steps: Optional[int] = 150
    #: SFT steps of the main agent after a warm restart: a second verl SFT run from its first run's checkpoint
    #: (optimizer state and lr warm-up afresh); 0: none. A run stuck with some digits uncopied gets unstuck within
    #: 50-75 steps of the restart (docs/warmstart.md, version 4)
    main_restart_steps: int = 100
    #: fraction of the sub-agent's demonstrations that call its tool and report the secret; the others answer the
    #: stock non-answer :data:`~mgrpo_verl.warmstart.demos.SUB_FALLBACK_REPORT` without calling: the sub-agent
    #: starts lazy (its greedy answer is the fallback), and only training the sub-agent can fix it
    #: (docs/warmstart.md, versions 3 and 5; 0.3 in version 4)
    sub_report_accuracy: float = 0.4
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
        """Hydra overrides of ``python -m mgrpo_verl.main_ppo`` that start RL from these checkpoints: the
        manifest's preset with the checkpoints where they are now (a cache copied to another machine moves)."""
        return _main_ppo_overrides(self.manifest["main_ppo_overrides"][0], self.main, self.sub)

    def main_ppo_command(self) -> str:
        """The shell command (quoted) of :meth:`main_ppo_overrides`."""
        import shlex

        return " \\\n    ".join(["python -m mgrpo_verl.main_ppo", *map(shlex.quote, self.main_ppo_overrides())])


def _main_ppo_overrides(preset: str, main: Path, sub: Path) -> list[str]:
    """The task's preset and the two checkpoints as Hydra overrides of ``main_ppo``."""
    return [preset, f"actor_rollout_ref.model.path={main}",
            f"multi_agent.agents.sub.actor_rollout_ref.model.path={sub}"]


def spec_from_settings(task: str, settings: dict[str, Any]) -> WarmStartSpec:
    """The :class:`WarmStartSpec` of ``task`` with ``settings`` (flat: fields of the spec and of its
    :class:`~mgrpo_verl.warmstart.sft.SFTSettings`); ``None`` values keep the defaults. The
    launcher (``mgrpo_verl.warmstart`` of the ``task=relay_tools`` preset, :mod:`mgrpo_verl.launcher.warm_start`)
    passes them.

    Raises:
        ValueError: a key that is neither a spec nor an SFT setting.
    """
    from dataclasses import fields, replace

    spec_keys = {f.name for f in fields(WarmStartSpec)} - {"task", "sft"}
    sft_keys = {f.name for f in fields(sft.SFTSettings)}
    unknown = sorted(set(settings) - spec_keys - sft_keys)
    if unknown:
        raise ValueError(f"unknown warm-start settings {unknown}; known: {sorted(spec_keys | sft_keys)}")
    given = {k: v for k, v in settings.items() if v is not None}
    sft_settings = replace(sft.SFTSettings(), **{k: v for k, v in given.items() if k in sft_keys})
    return replace(WarmStartSpec(task=task), sft=sft_settings, **{k: v for k, v in given.items() if k in spec_keys})


def base_model(name_or_path: str) -> tuple[str, str]:
    """(model dir, tokenizer dir) of a built-in model name or a model directory (its own tokenizer)."""
    from mgrpo_verl.envs.builtin import MODELS, model_paths

    if name_or_path in MODELS:
        paths = model_paths(name_or_path)
        return paths.model_dir, paths.tokenizer_dir
    path = Path(name_or_path).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"{name_or_path!r} is neither a built-in model ({', '.join(MODELS)}) nor a model directory")
    return str(path), str(path)


_base_model = base_model  # the name the tests use


def default_root() -> Path:
    from mgrpo_verl.models.tiny import cache_root

    return cache_root() / "warmstart"


def base_models(spec: WarmStartSpec) -> dict[str, tuple[str, str]]:
    """(model dir, tokenizer dir) per agent; the sub-agent's is the main agent's base when it starts from the
    main agent's checkpoint (that checkpoint exists only once built: :func:`_build` resolves it). The
    launcher's memory estimate reads a warm start's architecture from its base before it is built."""
    main = base_model(spec.main_model)
    return {"main": main, "sub": main if spec.sub_model == FROM_MAIN else base_model(spec.sub_model)}


def agent_settings(spec: WarmStartSpec, agent: str) -> sft.SFTSettings:
    """The SFT settings of ``agent``: ``spec.sft``, with ``spec.sub_steps`` for the sub-agent when set."""
    from dataclasses import replace

    if agent == "sub" and spec.sub_steps is not None:
        return replace(spec.sft, steps=spec.sub_steps)
    return spec.sft


def base_identity(path: str) -> str:
    """What a cache key hashes of a base model's folder: built-in models' folders are named by a hash of their
    recipe (their name), others by their absolute path."""
    from mgrpo_verl.models.tiny import cache_root

    return Path(path).name if Path(path).is_relative_to(cache_root()) else str(Path(path).resolve())


def cache_key(spec: WarmStartSpec, bases: dict[str, tuple[str, str]]) -> str:
    from mgrpo_verl.models.tiny import content_key

    payload = {"v": VERSION, "spec": asdict(spec), "bases": {a: [base_identity(p) for p in bases[a]] for a in bases}}
    return content_key(payload)


def target_dir(spec: WarmStartSpec, root: Optional[str | Path] = None) -> Path:
    """Where the warm start of ``spec`` is published under ``root`` (default :func:`default_root`), built or not."""
    return Path(root or default_root()) / f"{spec.task}-{cache_key(spec, base_models(spec))}"


def cached(spec: WarmStartSpec, root: Optional[str | Path] = None) -> Optional[WarmStart]:
    """The published warm start of ``spec`` under ``root``, or ``None`` when there is none yet."""
    return _published(target_dir(spec, root))


class WarmStartCorrupt(RuntimeError):
    """A published warm start whose files differ from its manifest's record."""


def _published(target: Path) -> Optional[WarmStart]:
    """The warm start published at ``target`` once :func:`verify` passes, or None when there is none.

    Raises:
        WarmStartCorrupt: a file differs from the manifest's record.
    """
    manifest_path = target / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    verify(target, manifest)
    return WarmStart(target, target / "main", target / "sub", manifest)


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size", "sha256"}}`` of every file under ``folder`` but ``manifest.json``."""
    records = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel != "manifest.json":
            records[rel] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return records


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(target: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest records is in ``target`` with its size and sha256.

    Raises:
        WarmStartCorrupt: naming the first file missing or different, or the folder whose manifest records no files
            (a warm start built before the records existed: nothing could tell a truncated weights file), and what
            to do.
    """
    records = manifest.get("files")
    if not isinstance(records, dict) or not records:
        raise WarmStartCorrupt(
            f"warm start {target}: its manifest records no files (no size or sha256: it was built before warm starts "
            f"recorded them), so a truncated or damaged weights file could not be told apart. It is not used; delete "
            f"{target} to build it again (rm -rf {target})."
        )
    for rel, record in records.items():
        path = target / rel
        problem = None
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != record["size"]:
            problem = f"has {path.stat().st_size} bytes, the manifest records {record['size']} (truncated?)"
        elif _sha256(path) != record["sha256"]:
            problem = "differs from the manifest's sha256"
        if problem:
            raise WarmStartCorrupt(
                f"warm start {target}: {path} {problem}. It is not used; delete {target} to build it again."
            )


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` instead of ending the process on the spot, so that
    the build's temporary folder is removed and its SFT child killed as on Ctrl-C. Only in the main thread, and
    only for a signal whose handler is the default one (a handler someone else installed is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_exit(signum, frame):
        raise SystemExit(128 + signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, raise_exit)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def warm_start(spec: WarmStartSpec = WarmStartSpec(), root: Optional[str | Path] = None, log=print) -> WarmStart:
    """The warm start of ``spec``: the published one when it exists, else built and published now."""
    from mgrpo_verl.models.tiny import build_once

    if spec.task not in demos.TASKS:  # before anything is built
        raise ValueError(f"no demonstrations for task {spec.task!r}; tasks with demonstrations: {sorted(demos.TASKS)}")
    bases = base_models(spec)
    target = target_dir(spec, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    found = _published(target)
    if found is not None:
        log(f"warm start: cached at {target}")
        return found
    with terminate_as_exit():
        build_once(target, lambda tmp: _build(spec, bases, tmp, target, log))
    result = _published(target)
    assert result is not None
    return result


def _build(spec: WarmStartSpec, bases: dict[str, tuple[str, str]], tmp: Path, target: Path, log) -> None:
    """Build everything into ``tmp`` (renamed to ``target`` by the caller); paths in the manifest are final."""
    start = time.monotonic()
    log(f"warm start: demonstrations of {spec.task} ({spec.n_train} train / {spec.n_val} val) -> {tmp / 'data'}")
    data = demos.write_sft_datasets(
        tmp / "data", spec.task, spec.n_train, spec.n_val, spec.data_seed, spec.sub_report_accuracy
    )
    (tmp / "logs").mkdir()
    agents: dict[str, Any] = {}
    for agent in demos.AGENTS:  # main first: the sub-agent may start from its checkpoint
        model_dir, tokenizer_dir = bases[agent]
        base_label = model_dir
        if agent == "sub" and spec.sub_model == FROM_MAIN:
            model_dir, tokenizer_dir, base_label = str(tmp / "main"), str(tmp / "main"), str(target / "main")
        settings = agent_settings(spec, agent)
        restart_steps = spec.main_restart_steps if agent == "main" else 0
        figures = train_agent(agent, model_dir, tokenizer_dir, base_label, data[agent], settings, restart_steps, tmp,
                              spec.device, log)  # fmt: skip
        agents[agent] = {
            "base_model": base_label,
            "tokenizer": tokenizer_dir if tokenizer_dir != model_dir else base_label,
            "sft_steps": settings.steps,
            "restart_steps": restart_steps,
            "checkpoint": str(target / agent),
            **figures,
        }
    if not spec.sft.save_every:
        shutil.rmtree(tmp / "sft", ignore_errors=True)  # the published copies are all that is needed
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
        "main_ppo_overrides": _main_ppo_overrides(PRESETS[spec.task], target / "main", target / "sub"),
        "files": file_records(tmp),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    fsync_tree(tmp)  # on disk before the caller's rename publishes it


def train_agent(
    agent: str,
    model_dir: str,
    tokenizer_dir: str,
    base_label: str,
    data: dict[str, Optional[Path]],
    settings: sft.SFTSettings,
    restart_steps: int,
    tmp: Path,
    device: str,
    log,
) -> dict[str, Any]:
    """``agent``'s SFT inside a build folder ``tmp``: verl's SFT trainer from ``model_dir`` on ``data`` (``train`` and
    ``val`` parquet files, ``val`` may be None), then ``restart_steps`` more after a warm restart (a second run from
    the first one's checkpoint, its lr decaying to 0), published as ``tmp/<agent>``; 0 steps: the base model as it
    is. Progress bars and logs under ``tmp/logs``, verl's per-step metrics in ``tmp/logs/sft_<agent>_metrics.jsonl``.
    ``base_label``: the base as the log names it (its final path). Returns seconds and losses."""
    if settings.steps > 0:
        log(f"warm start: verl SFT of {agent} from {base_label} ({settings.steps} steps, "
            f"batch {settings.batch_size}, lr {settings.lr}) ...")  # fmt: skip
    else:
        log(f"warm start: {agent} is {base_label} as it is (0 SFT steps)")
    # the agent's data and tokenizer are the same for its first run and its warm restart: measured once
    files = [f for f in (data["train"], data["val"]) if f]
    max_length = sft.fit_max_length(files, tokenizer_dir)

    def fine_tune(
        source_dir: str, source_tokenizer: str, run_settings: sft.SFTSettings, name: str
    ) -> tuple[float, str]:
        """One verl SFT run of ``agent`` from ``source_dir``, published as ``tmp/<agent>``: (seconds, metrics)."""
        bar = Progress(f"warm start: {name} SFT", run_settings.steps)
        try:
            checkpoint, run_seconds = sft.train(
                source_dir, source_tokenizer, data["train"], data["val"], tmp / "sft" / name,
                run_settings, tmp / "logs" / f"sft_{name}.log", device,
                on_step=lambda step, loss: bar.update(step, loss=loss), max_length=max_length,
            )  # fmt: skip
        finally:
            bar.close()
        sft.publish(checkpoint, tmp / agent, model_dir)
        return run_seconds, (tmp / "sft" / name / "metrics.jsonl").read_text()

    if settings.steps > 0:
        seconds, metrics_text = fine_tune(model_dir, tokenizer_dir, settings, agent)
    else:  # no fine-tuning: the base model as it is (e.g. an earlier warm start's main agent)
        seconds, metrics_text = 0.0, ""
        sft.publish_base(model_dir, tokenizer_dir, tmp / agent)
    if restart_steps > 0:  # the warm restart, from what was just published
        from dataclasses import replace

        log(f"warm start: verl SFT of {agent}, warm restart ({restart_steps} steps) ...")
        first = tmp / f"{agent}_before_restart"
        (tmp / agent).rename(first)
        # cosine down to 0: at a constant lr the run with data_seed 2 spiked in its last 5 steps (loss 0.03 -> 0.40,
        # grad norm 0.05 -> 7) and published that (docs/warmstart.md, version 4)
        restart = replace(settings, steps=restart_steps, lr_schedule="cosine")
        more, more_metrics = fine_tune(str(first), str(first), restart, f"{agent}_restart")
        shutil.rmtree(first)
        seconds, metrics_text = seconds + more, metrics_text + more_metrics
    metrics = [json.loads(line) for line in metrics_text.splitlines() if line.strip()]
    (tmp / "logs" / f"sft_{agent}_metrics.jsonl").write_text(metrics_text)
    losses = [m["data"]["train/loss"] for m in metrics if "train/loss" in m.get("data", {})]
    val = [m["data"]["val/loss"] for m in metrics if "val/loss" in m.get("data", {})]
    figures = {
        "sft_seconds": round(seconds, 1),
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "val_loss": val[-1] if val else None,
    }
    log(f"warm start: {agent} done in {seconds:.0f} s, train loss {figures['first_loss']} -> "
        f"{figures['final_loss']}, val loss {figures['val_loss']}")  # fmt: skip
    return figures
