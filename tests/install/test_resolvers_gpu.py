"""GPU-side config values on a machine without GPU: the attention resolver with flash-attn present or
absent (a stand-in module in ``sys.modules``), remove-padding per device, and the transformers behaviour
that makes remove-padding correct without flash-attn."""

import logging
import sys
import types

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mgrpo_verl.launcher import resolvers
from mgrpo_verl.launcher.resolvers import register_resolvers

register_resolvers()


@pytest.fixture
def flash_attn(monkeypatch):
    """``set(True)``: ``import flash_attn`` gives a stand-in module; ``set(False)``: it raises ImportError."""
    def set_present(present: bool) -> None:
        monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn") if present else None)
        resolvers.flash_attn_importable.cache_clear()

    yield set_present
    resolvers.flash_attn_importable.cache_clear()


def _model_values(device: str):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        cfg = compose("mgrpo_trainer", overrides=["task=relay", f"mgrpo_verl.device={device}"])
    return (OmegaConf.select(cfg, "actor_rollout_ref.model.override_config.attn_implementation"),
            OmegaConf.select(cfg, "actor_rollout_ref.model.use_remove_padding"))


def test_attention_on_accelerators_follows_flash_attn(flash_attn, caplog):
    flash_attn(True)
    assert resolvers._attention("accelerator") == "flash_attention_2"
    flash_attn(False)
    with caplog.at_level(logging.WARNING, logger="mgrpo_verl.launcher.resolvers"):
        assert resolvers._attention("accelerator") == "sdpa"
        assert resolvers._attention("accelerator") == "sdpa"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "flash-attn is not importable" in lines[0] and "sdpa" in lines[0]


def test_attention_on_cpu_is_sdpa_and_never_imports_flash_attn(flash_attn, monkeypatch):
    flash_attn(True)  # even where flash-attn is present
    assert resolvers._attention("cpu") == "sdpa"
    assert resolvers.flash_attn_importable.cache_info().currsize == 0  # the import was not tried


def test_shipped_config_picks_attention_and_remove_padding_per_device(flash_attn):
    flash_attn(False)
    assert _model_values("cpu") == ("sdpa", False)
    assert _model_values("accelerator") == ("sdpa", True)
    flash_attn(True)
    assert _model_values("accelerator") == ("flash_attention_2", True)


def test_sdpa_attends_within_each_packed_sequence():
    """Why remove-padding is on without flash-attn (mgrpo_base.yaml): verl packs a micro-batch into one row
    with position ids restarting per sequence and no attention mask; with sdpa, transformers must then keep
    each sequence to itself. Packed logits equal the padded batch's; without the restart they do not."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa")).eval()
    a, b = torch.randint(0, 50, (5,)), torch.randint(0, 50, (7,))
    padded = torch.zeros(2, 7, dtype=torch.long)
    padded[0, :5], padded[1] = a, b
    mask = torch.tensor([[1] * 5 + [0] * 2, [1] * 7])
    packed_ids = torch.cat([a, b])[None]
    restart = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():  # use_cache=False as verl's forward passes (a cache turns the detection off)
        ref = model(input_ids=padded, attention_mask=mask, position_ids=torch.arange(7).expand(2, 7),
                    use_cache=False).logits
        packed = model(input_ids=packed_ids, attention_mask=None, position_ids=restart, use_cache=False).logits[0]
        # same positions, but an explicit all-ones mask turns the packed-sequence detection off
        leaking = model(input_ids=packed_ids, attention_mask=torch.ones(1, 12, dtype=torch.long),
                        position_ids=restart, use_cache=False).logits[0]
    expected = torch.cat([ref[0, :5], ref[1]])
    torch.testing.assert_close(packed, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(leaking[:5], ref[0, :5], atol=1e-5, rtol=1e-4)
    assert not torch.allclose(leaking[5:], ref[1], atol=1e-3)  # b attending to a changes its logits
