"""Fixtures of the warm-start tests: the tiny model and tokenizer built in a per-session cache."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("mgrpo_cache")


@pytest.fixture(scope="session")
def tiny_paths(cache_dir):
    from mgrpo_verl.models.tiny import build_tiny_model
    from mgrpo_verl.platform.ray_session import patched_environ

    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        yield build_tiny_model(seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_paths):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_paths.tokenizer_dir)
