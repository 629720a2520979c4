"""Fixtures shared by several test folders: the built-in tiny model, built once per test session in a private
cache, and its tokenizer (``tests/hf_rollout``, ``tests/agent_loops``; ``tests/warmstart`` has its own, in its
own cache)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory):
    from mgrpo_verl.models.tiny import build_tiny_model
    from mgrpo_verl.platform.ray_session import patched_environ

    with patched_environ({"MGRPO_VERL_CACHE": str(tmp_path_factory.mktemp("mgrpo_cache"))}):
        yield build_tiny_model(seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_paths):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_paths.tokenizer_dir)
