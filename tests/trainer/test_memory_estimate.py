"""The pre-flight memory estimate (mgrpo_verl/trainer/memory.py): hand-computed figures, phases, refusals,
and the shipped GPU presets against 80 GB GPUs (their models' config.json values written to temp folders:
the estimate reads local files only)."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.trainer import memory
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.trainer.memory import (
    AgentFigures,
    MemoryLayoutError,
    agent_figures,
    count_parameters,
    estimate,
    check_memory,
    estimate_plan,
    read_model_config,
)

register_resolvers()

# config.json values of the models the presets name (from their Hugging Face model cards' config.json)
QWEN3_4B = dict(model_type="qwen3", hidden_size=2560, num_hidden_layers=36, intermediate_size=9728, vocab_size=151936,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
QWEN3_1_7B = dict(model_type="qwen3", hidden_size=2048, num_hidden_layers=28, intermediate_size=6144, vocab_size=151936,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
QWEN25_05B = dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24, intermediate_size=4864, vocab_size=151936,
                  num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True)
QWEN25_CODER_3B = dict(model_type="qwen2", hidden_size=2048, num_hidden_layers=36, intermediate_size=11008,
                       vocab_size=151936, num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True)


def _model_dir(tmp_path, name: str, values: dict) -> str:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(values))
    return str(folder)


def _compose(name: str, *overrides: str):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose(name, overrides=list(overrides))


# ------------------------------------------------------------------------------------------ model size


def test_parameter_counts_by_hand():
    # Qwen3-4B: embedding 151936 x 2560; per layer q 2560x4096, k and v 2560x1024, o 4096x2560, q/k norms 128 each,
    # MLP 3 x 2560 x 9728, two norms 2560; final norm 2560; tied output head
    layer = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 2 * 128 + 3 * 2560 * 9728 + 2 * 2560
    assert layer == 100_930_816
    assert count_parameters(QWEN3_4B) == 151936 * 2560 + 36 * layer + 2560 == 4_022_468_096
    # Qwen2.5-0.5B: head_dim 896 / 14 = 64, k/v 2 x 64 = 128 wide, q/k/v biases (qwen2), no q/k norms
    layer = 896 * 896 + 896 + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert count_parameters(QWEN25_05B) == 151936 * 896 + 24 * layer + 896 == 494_032_768
    # an untied output head adds vocab x hidden
    assert count_parameters({**QWEN25_05B, "tie_word_embeddings": False}) == 494_032_768 + 151936 * 896
    with pytest.raises(ValueError, match="config.json lacks 'vocab_size'"):
        count_parameters({k: v for k, v in QWEN25_05B.items() if k != "vocab_size"})


def test_read_model_config_local_only(tmp_path, monkeypatch):
    path = _model_dir(tmp_path, "m", QWEN25_05B)
    values, file = read_model_config(path)
    assert values == QWEN25_05B and file == f"{path}/config.json"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert read_model_config("Qwen/not-in-this-cache") is None
    assert read_model_config(str(tmp_path / "missing")) is None


# ------------------------------------------------------------------------------------------ agent terms


def _agent_config(**extra) -> OmegaConf:
    """The keys agent_figures reads, as in research=gpu before the fix: 4 GPUs, 16 x (4096 + 8192) log-prob
    micro-batches, padded logits."""
    base = {
        "trainer": {"n_gpus_per_node": 4},
        "actor_rollout_ref": {
            "model": {"use_remove_padding": False, "enable_gradient_checkpointing": True},
            "actor": {"fsdp_config": {"model_dtype": "fp32", "param_offload": False, "optimizer_offload": False,
                                      "mixed_precision": {"param_dtype": "bf16"}},
                      "ppo_micro_batch_size_per_gpu": 2, "use_dynamic_bsz": False},
            "ref": {"fsdp_config": {"model_dtype": "fp32", "param_offload": False}, "log_prob_micro_batch_size_per_gpu": 16},
            "rollout": {"name": "vllm", "gpu_memory_utilization": 0.5, "log_prob_micro_batch_size_per_gpu": 16,
                        "prompt_length": 4096, "response_length": 8192},
        },
    }
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(extra))


def test_agent_terms_by_hand():
    p = 4_022_468_096
    a = agent_figures("main", _agent_config(), QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert a.params == p and a.gpus == 4
    assert a.actor == pytest.approx(p * 4 / 4 / 1e9)          # fp32, sharded over 4 GPUs: 4.02 GB
    assert a.grads == a.actor
    assert a.optimizer == pytest.approx(p * 8 / 4 / 1e9)      # AdamW: 8.04 GB
    assert a.reference == 0
    assert a.engine == pytest.approx(40.0)                    # 0.5 x 80 GB
    # 16 sequences x 12,288 tokens x 151,936 x 2 B = 59.75 GB; the old-log-prob pass's unchunked entropy holds 3 copies
    assert a.logprob_logits == pytest.approx(16 * 12288 * 151936 * 2 * 3 / 1e9)
    assert 16 * 12288 * 151936 * 2 / 1e9 == pytest.approx(59.75, abs=0.01)
    # update (no entropy term): 2 x 12,288 tokens, padded + packed copies + the gradient
    assert a.update_logits == pytest.approx(2 * 12288 * 151936 * 2 * 3 / 1e9)
    # gradient checkpointing: 2 B x 36 layers + one layer's 34 B, per token and hidden unit
    assert a.activations == pytest.approx((2 * 36 + 34) * 2 * 12288 * 2560 / 1e9)
    assert a.resident == pytest.approx(a.actor + a.optimizer)

    packed = agent_figures("main", _agent_config(actor_rollout_ref={"model": {"use_remove_padding": True}}),
                           QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert packed.logprob_logits == pytest.approx(a.logprob_logits)  # the entropy's 3 copies either way
    assert packed.update_logits == pytest.approx(2 * 12288 * 151936 * 2 * 2 / 1e9)
    chunked = agent_figures("main", _agent_config(actor_rollout_ref={"model": {"use_remove_padding": True},
                                                                      "actor": {"entropy_from_logits_with_chunking": True}}),
                            QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert chunked.logprob_logits == pytest.approx(16 * 12288 * 151936 * 2 * 1 / 1e9)
    entropy = agent_figures("main", _agent_config(actor_rollout_ref={"actor": {"entropy_coeff": 0.001}}),
                            QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert entropy.update_logits == pytest.approx(2 * 12288 * 151936 * 2 * 4 / 1e9)

    dynamic = agent_figures("main", _agent_config(actor_rollout_ref={
        "rollout": {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 30000},
        "actor": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 8000}}),
        QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert dynamic.logprob_logits == pytest.approx(30000 * 151936 * 2 * 3 / 1e9)
    # a budget below one sequence still holds that sequence
    assert dynamic.update_logits == pytest.approx(12288 * 151936 * 2 * 3 / 1e9)

    no_ckpt = agent_figures("main", _agent_config(actor_rollout_ref={"model": {"enable_gradient_checkpointing": False}}),
                            QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert no_ckpt.activations == pytest.approx(34 * 36 * 2 * 12288 * 2560 / 1e9)

    with_ref = agent_figures("main", _agent_config(actor_rollout_ref={"ref": {"fsdp_config": {"param_offload": True}}}),
                             QWEN3_4B, 80.0, trainable=True, use_reference=True)
    assert with_ref.reference == pytest.approx(p * 4 / 4 / 1e9) and with_ref.ref_offload
    assert with_ref.ref_logits == pytest.approx(16 * 12288 * 151936 * 2 * 2 / 1e9)  # no entropy
    assert with_ref.resident == pytest.approx(a.actor + a.optimizer)  # the offloaded reference is not resident

    frozen = agent_figures("sub", _agent_config(), QWEN3_4B, 80.0, trainable=False, use_reference=False)
    assert (frozen.grads, frozen.optimizer, frozen.update_logits, frozen.logprob_logits) == (0, 0, 0, 0)
    assert frozen.resident == pytest.approx(a.actor)
    shared_frozen = agent_figures("sub", _agent_config(), QWEN3_4B, 80.0, trainable=False, use_reference=False,
                                  frozen_actor_resident=False)
    assert shared_frozen.resident == 0

    hf = agent_figures("main", _agent_config(actor_rollout_ref={"rollout": {"name": "hf", "dtype": "float32"}}),
                       QWEN3_4B, 80.0, trainable=True, use_reference=False)
    assert hf.engine == pytest.approx(p * 4 / 1e9)  # its own copy of the weights


# ------------------------------------------------------------------------------------------ phases


def _figures(name, trainable=True, **kw):
    values = dict(name=name, gpus=1, trainable=trainable, params=10**9, actor=4.0, grads=4.0 if trainable else 0.0,
                  optimizer=8.0 if trainable else 0.0, reference=0.0, engine=20.0, logprob_logits=3.0, ref_logits=0.0,
                  update_logits=6.0 if trainable else 0.0, activations=2.0 if trainable else 0.0)
    values.update(kw)
    return AgentFigures(**values)


def test_shared_phases_by_hand():
    main, sub = _figures("main"), _figures("sub")
    est = estimate([main, sub], "shared", 80.0)
    totals = {p.name: p.total for p in est.phases}
    # rollout: both engines awake + both actors and optimizers + 2 contexts
    assert totals["rollout"] == 20 + 20 + (4 + 8) * 2 + 2
    # main's update: sub's resident state, main's params, grads, AdamW, activations, logits; both engines asleep
    assert totals["update main"] == (4 + 8) + 4 + 4 + 8 + 2 + 6 + 2
    assert totals["old log-prob sub"] == (4 + 8) + 4 + 8 + 3 + 2
    assert est.peak.name == "rollout" and est.fits
    assert not estimate([main, sub], "shared", 60.0).fits

    # offloaded optimizer states leave the rollout and the other agent's update; a weight sync brings params back
    off = _figures("main", param_offload=True, optimizer_offload=True)
    est = estimate([off, sub], "shared", 80.0)
    totals = {p.name: p.total for p in est.phases}
    assert totals["rollout"] == 20 + 20 + (4 + 8) + 2
    assert totals["weight sync main"] == totals["rollout"] + 4
    assert totals["update sub"] == 0 + 4 + 4 + 8 + 2 + 6 + 2
    assert totals["update main"] == (4 + 8) + 4 + 4 + 8 + 2 + 6 + 2  # its own optimizer comes back for the step

    # a frozen agent's engine stays awake while the other trains (it answers at every rollout)
    frozen = _figures("sub", trainable=False, actor_resident_when_frozen=False)
    totals = {p.name: p.total for p in estimate([main, frozen], "shared", 80.0).phases}
    assert "update sub" not in totals
    assert totals["update main"] == 20 + 4 + 4 + 8 + 2 + 6 + 2


def test_separate_phases_are_per_agent():
    est = estimate([_figures("main"), _figures("sub", engine=60.0)], "separate", 80.0)
    groups = {p.group for p in est.phases}
    assert groups == {"the GPUs of agent 'main'", "the GPUs of agent 'sub'"}
    rollout_sub = [p for p in est.phases if p.group.endswith("'sub'") and p.name == "rollout"][0]
    assert rollout_sub.total == 60 + 4 + 8 + 1
    assert est.fits  # 73 GB


# ------------------------------------------------------------------------------------------ presets


def _research_gpu(tmp_path, *overrides):
    main, sub = _model_dir(tmp_path, "qwen3-4b", QWEN3_4B), _model_dir(tmp_path, "qwen3-1.7b", QWEN3_1_7B)
    return _compose(
        "mgrpo_trainer", "task=relay", "research=gpu",
        f"actor_rollout_ref.model.path={main}", f"actor_rollout_ref.model.tokenizer_path={main}",
        f"multi_agent.agents.sub.actor_rollout_ref.model.path={sub}",
        f"multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path={sub}",
        "multi_agent.gpu_memory_gb=80", *overrides,
    )


def test_research_gpu_fits_80gb_and_the_old_micro_batches_do_not(tmp_path, capsys):
    cfg = _research_gpu(tmp_path)
    est = check_memory(build_plan(cfg))
    assert est is not None and est.fits and est.peak.total < 80
    assert "mgrpo memory estimate: peak" in capsys.readouterr().out
    # mgrpo_base's log-prob micro-batches of 16 (what research=gpu inherited) cannot fit, with or without remove-padding
    for rmpad in ("true", "false"):
        old = _research_gpu(tmp_path / rmpad, f"actor_rollout_ref.model.use_remove_padding={rmpad}",
                            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
                            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16")
        with pytest.raises(MemoryLayoutError) as info:
            check_memory(build_plan(old))
        message = str(info.value)
        assert "cannot fit on GPUs of 80 GB (multi_agent.placement=separate)" in message
        assert "phase 'old log-prob main'" in message
        assert "log_prob_micro_batch_size_per_gpu=16 x 12288 tokens x vocab 151936 x 2 B x 3 copies" in message
        assert "main (trainable, 4.02 B params, FSDP over 4 GPU(s)): actor params 4.02 GB" in message
        assert "AdamW 8.04 GB" in message and "rollout engine 40.00 GB" in message
        assert "smaller actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu" in message
        assert "use_remove_padding=true" in message


def test_research_gpu_shared_on_8_gpus_is_refused_for_its_engines(tmp_path):
    # both engines at 0.5 on the same GPUs: refused by the config check before any estimate
    with pytest.raises(ValueError, match="reserve 1 of every GPU together"):
        check_memory(build_plan(_research_gpu(tmp_path, "multi_agent.placement=shared", "multi_agent.agents.main.n_gpus_per_node=null",
                                "multi_agent.agents.sub.n_gpus_per_node=null")))


def test_research_gpu_shared_on_8_gpus_as_the_recipe_says(tmp_path):
    # recipes/research_gpu.sh's shared example: every agent on all 8 GPUs, engines at 0.3 each
    cfg = _research_gpu(tmp_path, "multi_agent.placement=shared", "multi_agent.agents.main.n_gpus_per_node=8",
                        "multi_agent.agents.sub.n_gpus_per_node=8", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                        "+multi_agent.agents.sub.actor_rollout_ref.rollout.gpu_memory_utilization=0.3")
    est = check_memory(build_plan(cfg))
    assert est is not None and est.fits and [a.gpus for a in est.agents] == [8, 8]
    rollout = [p for p in est.phases if p.name == "rollout"][0]
    # both engines (2 x 24 GB) + both actors and AdamW states sharded over 8 GPUs + 2 contexts
    p_main, p_sub = count_parameters(QWEN3_4B), count_parameters(QWEN3_1_7B)
    assert rollout.total == pytest.approx(48 + (p_main + p_sub) * 12 / 8 / 1e9 + 2)


def test_one_gpu_preset_fits_80gb(tmp_path):
    model = _model_dir(tmp_path, "qwen2.5-0.5b", QWEN25_05B)
    paths = (f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.model.tokenizer_path={model}",
             f"multi_agent.agents.sub.actor_rollout_ref.model.path={model}",
             f"multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path={model}")
    cfg = _compose("mgrpo_trainer", "task=relay", "+preset=one_gpu", *paths, "multi_agent.gpu_memory_gb=80")
    assert cfg.multi_agent.placement == "shared" and cfg.trainer.n_gpus_per_node == 1
    est = check_memory(build_plan(cfg))
    assert est is not None and est.fits
    assert {p.group for p in est.phases} == {"the shared GPUs (all agents)"}
    assert [a.gpus for a in est.agents] == [1, 1]
    # the same layout on a 40 GB GPU: 2 x 0.3 x 40 = 24 GB of engines + 2 x 5.9 GB resident + ... still fits;
    # on 24 GB it does not, and the message offers separate placement
    with pytest.raises(MemoryLayoutError, match=r"multi_agent.placement=separate"):
        check_memory(build_plan(_compose("mgrpo_trainer", "task=relay", "+preset=one_gpu", *paths, "multi_agent.gpu_memory_gb=16")))


@pytest.mark.parametrize("task,other", [("code", "main"), ("writing", "details")])
def test_magrpo_gpu_preset_fits_80gb(tmp_path, task, other):
    values = QWEN25_CODER_3B if task == "code" else QWEN3_1_7B
    model = _model_dir(tmp_path, "model", values)
    cfg = _compose("magrpo_trainer", "+preset=magrpo_gpu", f"coop_task={task}", f"actor_rollout_ref.model.path={model}",
                   f"actor_rollout_ref.model.tokenizer_path={model}",
                   f"multi_agent.agents.{other}.actor_rollout_ref.model.path={model}",
                   f"multi_agent.agents.{other}.actor_rollout_ref.model.tokenizer_path={model}", "multi_agent.gpu_memory_gb=80")
    est = check_memory(build_plan(cfg))
    assert est is not None and est.fits and est.placement == "separate"
    if task == "code":
        # 3.09 B params: 12.4 GB fp32 actor + 24.7 GB AdamW + 0.4 x 80 GB engine + 1 GB context
        p = count_parameters(QWEN25_CODER_3B)
        rollout = [ph for ph in est.phases if ph.name == "rollout"][0]
        assert rollout.total == pytest.approx(p * 12 / 1e9 + 32 + 1)
        # the recipe's old gpu_memory_utilization of 0.5 was within 2 GB of the limit; 0.6 cannot fit
        with pytest.raises(MemoryLayoutError, match="rollout engine"):
            check_memory(build_plan(OmegaConf.merge(cfg, {"actor_rollout_ref": {"rollout": {"gpu_memory_utilization": 0.6}}})))


# ------------------------------------------------------------------------------------------ skipping


def test_skipped_without_gpu_memory(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(memory, "detect_gpu_memory_gb", lambda: None)
    cfg = _research_gpu(tmp_path, "multi_agent.gpu_memory_gb=null")
    assert check_memory(build_plan(cfg)) is None
    assert "mgrpo memory estimate skipped: no GPU visible and multi_agent.gpu_memory_gb is null" in capsys.readouterr().out
    # with a GPU visible, its memory is used (here: a 24 GB one, which research=gpu cannot fit)
    monkeypatch.setattr(memory, "detect_gpu_memory_gb", lambda: 24.0)
    with pytest.raises(MemoryLayoutError, match="GPUs of 24 GB"):
        check_memory(build_plan(cfg))


def test_skipped_when_a_model_is_not_on_this_machine(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cfg = _research_gpu(tmp_path, "multi_agent.agents.sub.actor_rollout_ref.model.path=Qwen/Qwen3-1.7B")
    est, why = estimate_plan(build_plan(cfg), 80.0)
    assert est is None and "no local config.json for agent 'sub' (Qwen/Qwen3-1.7B)" in why
    assert check_memory(build_plan(cfg)) is None
    assert "mgrpo memory estimate skipped: no local config.json for agent 'sub'" in capsys.readouterr().out


def test_gpu_memory_is_read_from_nvidia_smi_for_the_visible_gpus_only():
    # an H100 (81,559 MiB) and a 40 GiB card; MiB -> GB (1e9 bytes): 40,960 * 2**20 / 1e9 = 42.94967296
    csv = "0, 81559\n1, 40960\n"
    assert memory.smallest_visible_gpu_gb(csv, None) == pytest.approx(42.94967296)
    # CUDA_VISIBLE_DEVICES=0 hides the small card: 81,559 * 2**20 / 1e9 = 85.520809984
    assert memory.smallest_visible_gpu_gb(csv, "0") == pytest.approx(85.520809984)
    # UUIDs instead of indices: all GPUs count; no GPU at all: None
    assert memory.smallest_visible_gpu_gb(csv, "GPU-1a2b") == pytest.approx(42.94967296)
    assert memory.smallest_visible_gpu_gb("", None) is None
