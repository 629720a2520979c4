"""Pre-flight GPU memory estimate of a multi-agent layout, run before Ray starts.

verl checks nothing of the sort: a layout that cannot fit fails minutes later, in a worker, with a CUDA
out-of-memory error. :func:`check_memory` adds up, per GPU and per phase of a training step, what each agent
keeps on that GPU and refuses a layout whose peak exceeds the GPU's memory, naming the figures and what to
change: an estimate of the large terms, not a simulation. The terms, what stays resident and the phases:
``docs/multi_agent.md``, "GPU memory pre-flight". Pure functions except :func:`read_model_config` (a local file
or the Hugging Face cache, never the network), :func:`detect_gpu_memory_gb` (``nvidia-smi``) and
:func:`check_memory` (both, and prints).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from mgrpo_verl.config import setting
from mgrpo_verl.config.plan import RunPlan
from mgrpo_verl.config.rules import ENGINES_WITH_MEMORY_FRACTION

logger = logging.getLogger(__name__)

GB = 1e9
"""Bytes of one GB (decimal, as GPU vendors count: an "80 GB" H100)."""

ADAMW_BYTES_PER_PARAM = 8
"""AdamW's two moments in fp32."""

PROCESS_OVERHEAD_GB = 1.0
"""CUDA context, NCCL buffers and allocator slack of one agent worker process on a GPU."""

ACTIVATION_BYTES_PER_TOKEN_HIDDEN_LAYER = 34
"""Korthikanti et al. 2022 ("Reducing activation recomputation in large transformer models"), 16-bit
activations of one transformer layer per token and hidden unit, without the attention-score term (flash
attention / SDPA do not store the scores)."""

CHECKPOINTED_BYTES_PER_TOKEN_HIDDEN_LAYER = 2
"""With gradient checkpointing, one 16-bit hidden state per layer is kept."""

DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2}


class MemoryLayoutError(ValueError):
    """The layout cannot fit on the GPUs (the message holds the figures and what to change)."""


# ----------------------------------------------------------------------------------------------------
# model size


#: the linear layers of a Llama / Qwen-style decoder layer: name -> (in, out) as functions of (h, q, k, inter)
_LINEAR = {"q_proj": lambda h, q, k, i: (h, q), "k_proj": lambda h, q, k, i: (h, k),
           "v_proj": lambda h, q, k, i: (h, k), "o_proj": lambda h, q, k, i: (q, h),
           "gate_proj": lambda h, q, k, i: (h, i), "up_proj": lambda h, q, k, i: (h, i),
           "down_proj": lambda h, q, k, i: (i, h)}


def count_lora_parameters(hf: Mapping[str, Any], rank: int, target_modules: Any) -> int:
    """Parameters of a LoRA adapter of rank ``rank`` (A: r x in, B: out x r per targeted linear layer of every
    decoder layer). ``target_modules`` as verl / peft take it: ``all-linear`` (every layer of :data:`_LINEAR`; the
    output head is never a target) or names; names that are not decoder linear layers count nothing."""
    h, layers, inter = (int(hf[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size"))
    heads = int(hf.get("num_attention_heads") or 1)
    d = int(hf.get("head_dim") or h // heads)
    q, k = heads * d, int(hf.get("num_key_value_heads") or heads) * d
    names = list(_LINEAR) if target_modules in (None, "all-linear") else (
        [target_modules] if isinstance(target_modules, str) else list(target_modules))
    return layers * sum(rank * sum(_LINEAR[n](h, q, k, inter)) for n in names if n in _LINEAR)


def count_parameters(hf: Mapping[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its Hugging Face ``config.json`` values.

    Embedding V x h; per layer: attention q (h x heads x d), k and v (h x kv_heads x d each), o
    (heads x d x h), with q/k/v biases for ``attention_bias: true`` or the ``qwen2`` family, q/k norms (d
    each) for the ``qwen3`` family; gated MLP 3 x h x intermediate; two norms of h; a final norm h; an
    output head V x h unless ``tie_word_embeddings``. d = ``head_dim`` or h / heads; kv_heads defaults to
    heads.
    """
    try:
        h, layers, inter, vocab = (int(hf[k])
                                   for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    except KeyError as err:
        raise ValueError(f"config.json lacks {err.args[0]!r}: cannot count the model's parameters") from None
    heads = int(hf.get("num_attention_heads") or 1)
    kv = int(hf.get("num_key_value_heads") or heads)
    d = int(hf.get("head_dim") or h // heads)
    family = str(hf.get("model_type", ""))
    q, k = heads * d, kv * d
    attention = h * q + 2 * h * k + q * h
    if hf.get("attention_bias", family == "qwen2"):
        attention += q + 2 * k
    if family.startswith("qwen3"):
        attention += 2 * d
    layer = attention + 3 * h * inter + 2 * h
    head = 0 if hf.get("tie_word_embeddings", False) else vocab * h
    return vocab * h + layers * layer + h + head


def read_model_config(path: str) -> Optional[tuple[dict, str]]:
    """(``config.json`` values, file read) of a local model folder, or of a hub name already in the local
    Hugging Face cache; ``None`` when neither has it. Never downloads."""
    candidate = os.path.join(os.path.expanduser(str(path)), "config.json")
    if not os.path.isfile(candidate):
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:  # pragma: no cover - verl depends on it
            return None
        try:
            cached = try_to_load_from_cache(str(path), "config.json")
        except Exception:  # not a valid repo id
            return None
        if not isinstance(cached, str):
            return None
        candidate = cached
    with open(candidate) as f:
        return json.load(f), candidate


# ----------------------------------------------------------------------------------------------------
# per-agent figures


@dataclass(frozen=True)
class AgentFigures:
    """Per-GPU memory terms of one model owner (GB), and the inputs behind them (see the module table)."""

    name: str
    gpus: int
    trainable: bool
    params: int
    actor: float
    grads: float
    optimizer: float
    reference: float
    engine: float
    logprob_logits: float
    ref_logits: float
    update_logits: float
    activations: float
    param_offload: bool = False
    optimizer_offload: bool = False
    ref_offload: bool = False
    actor_resident_when_frozen: bool = True
    notes: tuple[str, ...] = ()
    """How the larger terms were computed, for the refusal message."""

    @property
    def resident(self) -> float:
        """What stays on the GPU between phases (see the module docstring)."""
        if not self.trainable:
            return self.actor if (self.actor_resident_when_frozen and not self.param_offload) else 0.0
        return (
            (0.0 if self.param_offload else self.actor)
            + (0.0 if self.optimizer_offload else self.optimizer)
            + (0.0 if self.ref_offload else self.reference)
        )


def _bytes(dtype: Any, default: str) -> int:
    name = str(dtype if dtype is not None else default).lower()
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r} in the memory estimate; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]



def _tokens(config: DictConfig, section: str, micro_key: str, dynamic_key: str, budget_key: str,
            seq: int) -> tuple[int, str]:
    if setting(config, f"{section}.{dynamic_key}", False):
        budget = int(setting(config, f"{section}.{budget_key}", seq))
        return max(budget, seq), f"{section}.{budget_key}={budget} tokens (dynamic batch size)"
    micro = int(setting(config, f"{section}.{micro_key}", 1))
    return micro * seq, f"{section}.{micro_key}={micro} x {seq} tokens"


def agent_figures(
    name: str,
    config: DictConfig,
    hf: Mapping[str, Any],
    gpu_gb: float,
    trainable: bool,
    use_reference: bool,
    frozen_actor_resident: bool = True,
) -> AgentFigures:
    """One model owner's terms from its full config (``agent_full_config``: its own ``actor_rollout_ref`` and
    ``trainer.n_gpus_per_node``) and its model's ``config.json`` values."""
    arr = "actor_rollout_ref"
    params = count_parameters(hf)
    hidden, layers, vocab = int(hf["hidden_size"]), int(hf["num_hidden_layers"]), int(hf["vocab_size"])
    world = int(setting(config, "trainer.n_gpus_per_node", 1))
    actor = params * _bytes(setting(config, f"{arr}.actor.fsdp_config.model_dtype"), "fp32") / world / GB
    ref = (params * _bytes(setting(config, f"{arr}.ref.fsdp_config.model_dtype"), "fp32") / world / GB
           if use_reference else 0.0)
    rollout_name = setting(config, f"{arr}.rollout.name", "vllm")
    notes = []
    if rollout_name in ENGINES_WITH_MEMORY_FRACTION:
        fraction = float(setting(config, f"{arr}.rollout.gpu_memory_utilization", 0.5))
        engine = fraction * gpu_gb
        notes.append(f"rollout engine {engine:.2f} GB = gpu_memory_utilization {fraction:g} x {gpu_gb:g} GB")
    else:
        engine = params * _bytes(setting(config, f"{arr}.rollout.dtype"), "bf16") / GB
        notes.append(f"rollout engine {engine:.2f} GB = its copy of the weights ({rollout_name})")

    logit_bytes = _bytes(setting(config, f"{arr}.actor.fsdp_config.mixed_precision.param_dtype"), "bf16")
    rmpad = bool(setting(config, f"{arr}.model.use_remove_padding", False))
    copies = 1 if rmpad else 2
    chunked = bool(setting(config, f"{arr}.actor.entropy_from_logits_with_chunking",
                        setting(config, f"{arr}.actor.fsdp_config.entropy_from_logits_with_chunking", False)))
    lp_copies = copies if chunked else 3
    up_entropy = (bool(setting(config, f"{arr}.actor.calculate_entropy", False))
                  or float(setting(config, f"{arr}.actor.entropy_coeff", 0.0)) != 0.0)
    up_copies = (copies if chunked or not up_entropy else 3) + 1
    seq = int(setting(config, f"{arr}.rollout.prompt_length", setting(config, "data.max_prompt_length", 0))) + int(
        setting(config, f"{arr}.rollout.response_length", setting(config, "data.max_response_length", 0))
    )

    def logits(tokens: int, factor: int) -> float:
        return tokens * vocab * logit_bytes * factor / GB

    lp_tokens, lp_how = _tokens(config, f"{arr}.rollout", "log_prob_micro_batch_size_per_gpu",
                                "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu", seq)
    ref_tokens, _ = _tokens(config, f"{arr}.ref", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                            "log_prob_max_token_len_per_gpu", seq)
    up_tokens, up_how = _tokens(config, f"{arr}.actor", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz",
                                "ppo_max_token_len_per_gpu", seq)
    padding = f"use_remove_padding={str(rmpad).lower()}"
    notes.append(
        f"log-prob logits {logits(lp_tokens, lp_copies):.2f} GB = {lp_how} x vocab {vocab} x {logit_bytes} B "
        f"x {lp_copies} "
        f"copies ({padding}, entropy {'chunked' if chunked else 'unchunked'})"
    )
    checkpointing = bool(setting(config, f"{arr}.model.enable_gradient_checkpointing", False))
    if checkpointing:
        act = ((CHECKPOINTED_BYTES_PER_TOKEN_HIDDEN_LAYER * layers + ACTIVATION_BYTES_PER_TOKEN_HIDDEN_LAYER)
               * up_tokens * hidden / GB)
    else:
        act = ACTIVATION_BYTES_PER_TOKEN_HIDDEN_LAYER * layers * up_tokens * hidden / GB
    trained = params  # what gradients and optimizer moments are kept for
    lora_rank = int(setting(config, f"{arr}.model.lora_rank", 0) or 0)
    if lora_rank > 0:
        targets = setting(config, f"{arr}.model.target_modules", "all-linear")
        trained = count_lora_parameters(hf, lora_rank,
                                        OmegaConf.to_container(targets) if OmegaConf.is_config(targets) else targets)
        notes.append(f"LoRA rank {lora_rank}: gradients and AdamW states of {trained:,} adapter parameters only; "
                     f"the reference is the actor with its adapter off (no copy)")
        ref = 0.0
    if trainable:
        notes.append(
            f"update logits {logits(up_tokens, up_copies):.2f} GB = {up_how} x vocab {vocab} x {logit_bytes} B "
            f"x {up_copies} "
            f"copies ({padding}, gradient included); activations {act:.2f} GB (gradient checkpointing "
            f"{'on' if checkpointing else 'off'})"
        )
    return AgentFigures(
        name=name,
        gpus=world,
        trainable=trainable,
        params=params,
        actor=actor,
        grads=(actor if trained == params else trained * 4 / world / GB) if trainable else 0.0,
        optimizer=trained * ADAMW_BYTES_PER_PARAM / world / GB if trainable else 0.0,
        reference=ref,
        engine=engine,
        logprob_logits=logits(lp_tokens, lp_copies) if trainable else 0.0,
        ref_logits=logits(ref_tokens, copies) if use_reference else 0.0,
        update_logits=logits(up_tokens, up_copies) if trainable else 0.0,
        activations=act if trainable else 0.0,
        param_offload=bool(setting(config, f"{arr}.actor.fsdp_config.param_offload", False)),
        optimizer_offload=bool(setting(config, f"{arr}.actor.fsdp_config.optimizer_offload", False)),
        ref_offload=bool(setting(config, f"{arr}.ref.fsdp_config.param_offload", False)),
        actor_resident_when_frozen=frozen_actor_resident,
        notes=tuple(notes),
    )


# ----------------------------------------------------------------------------------------------------
# phases


@dataclass(frozen=True)
class Phase:
    """Memory in use on one GPU of ``group`` during one phase: ``parts`` are (label, GB)."""

    group: str
    name: str
    parts: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return sum(gb for _, gb in self.parts)


def group_phases(group: str, agents: list[AgentFigures]) -> list[Phase]:
    """The phases of one group of GPUs shared by ``agents`` (see the module docstring)."""
    overhead = (f"CUDA contexts of {len(agents)} worker(s)", PROCESS_OVERHEAD_GB * len(agents))

    def resident(a: AgentFigures) -> list[tuple[str, float]]:
        if not a.trainable:
            return [(f"{a.name}: actor params", a.resident)] if a.resident else []
        out = []
        if not a.param_offload:
            out.append((f"{a.name}: actor params", a.actor))
        if not a.optimizer_offload and a.optimizer:
            out.append((f"{a.name}: AdamW states", a.optimizer))
        if not a.ref_offload and a.reference:
            out.append((f"{a.name}: reference", a.reference))
        return out

    rollout = [p for a in agents for p in resident(a)] + [(f"{a.name}: rollout engine", a.engine) for a in agents]
    phases = [Phase(group, "rollout", tuple(rollout + [overhead]))]
    for a in agents:
        if not a.trainable:
            continue
        if a.param_offload:
            phases.append(Phase(group, f"weight sync {a.name}",
                                tuple(rollout + [(f"{a.name}: actor params", a.actor), overhead])))
        others = [p for b in agents if b is not a for p in resident(b)]
        others += [(f"{b.name}: rollout engine (frozen, awake)", b.engine)
                   for b in agents if b is not a and not b.trainable]
        params = [(f"{a.name}: actor params", a.actor)]
        optimizer = [(f"{a.name}: AdamW states", a.optimizer)] if a.optimizer else []
        kept_opt = [] if a.optimizer_offload else optimizer
        ref = [(f"{a.name}: reference", a.reference)] if a.reference else []
        kept_ref = [] if a.ref_offload else ref
        kept_params = [] if a.param_offload else params
        phases.append(Phase(group, f"old log-prob {a.name}", tuple(
            others + params + kept_opt + kept_ref + [(f"{a.name}: log-prob logits", a.logprob_logits), overhead])))
        if a.reference:
            phases.append(Phase(group, f"reference {a.name}", tuple(
                others + kept_params + kept_opt + ref + [(f"{a.name}: reference logits", a.ref_logits), overhead])))
        phases.append(Phase(group, f"update {a.name}", tuple(
            others + params + [(f"{a.name}: gradients", a.grads)] + optimizer + kept_ref
            + [(f"{a.name}: activations", a.activations), (f"{a.name}: update logits", a.update_logits), overhead])))
    return phases


@dataclass(frozen=True)
class MemoryEstimate:
    """Every phase of every GPU group, for GPUs of ``gpu_gb`` GB."""

    gpu_gb: float
    placement: str
    agents: tuple[AgentFigures, ...]
    phases: tuple[Phase, ...]

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total)

    @property
    def fits(self) -> bool:
        return self.peak.total <= self.gpu_gb

    def summary(self) -> str:
        peak = self.peak
        return (f"mgrpo memory estimate: peak {peak.total:.1f} GB of {self.gpu_gb:g} GB per GPU ({peak.group}, phase "
                f"{peak.name!r}; multi_agent.placement={self.placement})")

    def agent_lines(self) -> list[str]:
        lines = []
        for a in self.agents:
            role = "trainable" if a.trainable else "frozen"
            lines.append(
                f"  {a.name} ({role}, {a.params / 1e9:.2f} B params, FSDP over {a.gpus} GPU(s)): actor params "
                f"{a.actor:.2f} GB, gradients {a.grads:.2f} GB, AdamW {a.optimizer:.2f} GB, "
                f"reference {a.reference:.2f} GB, "
                f"rollout engine {a.engine:.2f} GB, log-prob logits {a.logprob_logits:.2f} GB, update logits "
                f"{a.update_logits:.2f} GB, activations {a.activations:.2f} GB; offload: params "
                f"{str(a.param_offload).lower()}, optimizer {str(a.optimizer_offload).lower()}"
            )
            lines.extend(f"    {note}" for note in a.notes)
        return lines

    def refusal(self) -> str:
        peak = self.peak
        parts = sorted(peak.parts, key=lambda p: -p[1])
        breakdown = ", ".join(f"{label} {gb:.2f}" for label, gb in parts if gb > 0)
        return "\n".join([
            f"multi_agent memory estimate: this layout cannot fit on GPUs of {self.gpu_gb:g} GB "
            f"(multi_agent.placement={self.placement}): {peak.group} need {peak.total:.1f} GB per GPU in phase "
            f"{peak.name!r} ({breakdown} GB).",
            "Per agent, per GPU:",
            *self.agent_lines(),
            "What to change: " + "; ".join(_hints(self, parts)),
            "(the GPU memory is multi_agent.gpu_memory_gb, or nvidia-smi's when that is null; terms: "
            "mgrpo_verl/trainer/memory.py)",
        ])


def _hints(est: MemoryEstimate, parts: list[tuple[str, float]]) -> list[str]:
    hints: list[str] = []
    for label, _ in parts:
        agent, _, term = label.partition(": ")
        where = (f"multi_agent.agents.{agent}.actor_rollout_ref" if agent in {a.name for a in est.agents}
                 else "actor_rollout_ref")
        if term.startswith("log-prob logits") or term.startswith("reference logits"):
            hint = ("smaller actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu / "
                    "ref.log_prob_micro_batch_size_per_gpu "
                    "(or log_prob_use_dynamic_bsz with a smaller log_prob_max_token_len_per_gpu), "
                    "actor_rollout_ref.model.use_remove_padding=true, "
                    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")
        elif term.startswith("update logits") or term.startswith("activations"):
            hint = ("smaller actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (or use_dynamic_bsz with a smaller "
                    "ppo_max_token_len_per_gpu), actor_rollout_ref.model.enable_gradient_checkpointing=true, "
                    "actor_rollout_ref.model.use_remove_padding=true")
        elif term.startswith("rollout engine"):
            hint = f"lower gpu_memory_utilization ({where}.rollout.gpu_memory_utilization)"
        elif term in ("actor params", "AdamW states", "gradients"):
            hint = ("enable actor_rollout_ref.actor.fsdp_config.param_offload / optimizer_offload "
                    "(or more GPUs per agent)")
        elif term == "reference":
            hint = "enable actor_rollout_ref.ref.fsdp_config.param_offload"
        else:
            continue
        if hint not in hints:
            hints.append(hint)
    if est.placement == "shared" and len(est.agents) > 1:
        hints.append("or give each agent GPUs of its own (multi_agent.placement=separate)")
    return hints


def estimate(agents: list[AgentFigures], placement: str, gpu_gb: float) -> MemoryEstimate:
    """The phases of ``agents`` (model owners of this process, in order) under ``placement``."""
    if placement == "shared":
        phases = group_phases("the shared GPUs (all agents)", list(agents))
    else:
        phases = [p for a in agents for p in group_phases(f"the GPUs of agent {a.name!r}", [a])]
    return MemoryEstimate(gpu_gb=gpu_gb, placement=placement, agents=tuple(agents), phases=tuple(phases))


# ----------------------------------------------------------------------------------------------------
# from a trainer config


def estimate_plan(
    plan: RunPlan,
    gpu_gb: float,
    model_configs: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> tuple[Optional[MemoryEstimate], str]:
    """(estimate, "") for the model owners this process builds (``plan.local_configs``), or (None, why) when a
    model's ``config.json`` is not on this machine. ``model_configs`` (agent -> config.json values) replaces
    reading the files."""
    from verl.trainer.ppo.utils import need_reference_policy

    ma = plan.multi_agent
    figures = []
    for spec in ma.local_owners:
        full = plan.agent_configs[spec.name]
        if model_configs is not None and spec.name in model_configs:
            hf = model_configs[spec.name]
        else:
            path = OmegaConf.select(full, "actor_rollout_ref.model.path")
            found = read_model_config(path)
            if found is None:
                return None, (f"no local config.json for agent {spec.name!r} ({path}): not a folder with one and "
                              f"not in the "
                              f"Hugging Face cache (the estimate never downloads)")
            hf = found[0]
        use_ref = spec.trainable and need_reference_policy(full)
        figures.append(agent_figures(spec.name, full, hf, gpu_gb, spec.trainable, use_ref,
                                     frozen_actor_resident=ma.placement != "shared"))
    return estimate(figures, ma.placement, gpu_gb), ""


def detect_gpu_memory_gb() -> Optional[float]:
    """Memory of the smallest visible GPU in GB, ``None`` when no GPU is visible.

    Asks ``nvidia-smi`` rather than ``torch.cuda``: the driver process must not create a CUDA context (it
    would hold several hundred MB of GPU 0 for the whole run, next to the agents' workers). Honours
    ``CUDA_VISIBLE_DEVICES`` when it lists indices."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return smallest_visible_gpu_gb(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def smallest_visible_gpu_gb(nvidia_smi_csv: str, visible: Optional[str]) -> Optional[float]:
    """The smallest ``memory.total`` (MiB) in ``nvidia-smi --query-gpu=index,memory.total`` output among the
    GPUs ``visible`` lists (``CUDA_VISIBLE_DEVICES``; unset or not plain indices: all), in GB."""
    sizes = {}
    for line in nvidia_smi_csv.strip().splitlines():
        index, _, mib = line.partition(",")
        try:
            sizes[index.strip()] = float(mib.strip()) * 2**20
        except ValueError:
            continue
    wanted = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if wanted and all(v.isdigit() for v in wanted):
        sizes = {k: v for k, v in sizes.items() if k in wanted}
    return min(sizes.values()) / GB if sizes else None


def check_memory(plan: RunPlan,
                 model_configs: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Optional[MemoryEstimate]:
    """Estimate the plan's layout and raise :class:`MemoryLayoutError` when it cannot fit; print one summary
    line either way (or why it was skipped). Returns the estimate, ``None`` when skipped (not a multi-agent
    run, no GPU memory known, a model's ``config.json`` not on this machine). ``model_configs`` as in
    :func:`estimate_plan` (the launcher passes the base models of a warm start not built yet)."""
    if plan.multi_agent is None:
        return None
    gpu_gb = plan.multi_agent.gpu_memory_gb
    source = "multi_agent.gpu_memory_gb"
    if gpu_gb is None:
        gpu_gb, source = detect_gpu_memory_gb(), "nvidia-smi"
    if gpu_gb is None:
        print("mgrpo memory estimate skipped: no GPU visible and multi_agent.gpu_memory_gb is null", flush=True)
        return None
    est, why = estimate_plan(plan, gpu_gb, model_configs)
    if est is None:
        print(f"mgrpo memory estimate skipped: {why}", flush=True)
        return None
    if not est.fits:
        raise MemoryLayoutError(est.refusal())
    print(f"{est.summary()}; GPU memory from {source}", flush=True)
    return est
