"""Fixtures shared by several test folders: the built-in tiny model, built once per test session in a private
cache, and its tokenizer (``tests/hf_rollout``, ``tests/agent_loops``; ``tests/warmstart`` has its own, in its
own cache). And how ``tests/run.sh`` spreads the suite over pytest-xdist workers (:func:`pytest_collection_modifyitems`)."""

from __future__ import annotations

import pytest

#: The trainer's session runs that several test files read (``tests/trainer/conftest.py``): under xdist, every file
#: that uses one goes to the same worker, so that each run happens once.
SHARED_RUNS = frozenset({"two_agent_job", "frozen_sub_on_one_gpu", "decoupled_on_two_machines"})


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``--dist loadgroup`` (``tests/run.sh``): one group per test file (its module fixtures are built once),
    the files that read :data:`SHARED_RUNS` in one group together, and the groups holding a ``slow`` test first, so
    that the long end-to-end runs start early and the short files fill the other worker around them (run with
    ``--no-loadscope-reorder``: xdist's own order, most tests first, would leave the long runs to the end)."""
    if not getattr(config.option, "loadgroup", False):
        return
    shared = {item.path for item in items if SHARED_RUNS & set(getattr(item, "fixturenames", ()))}
    groups: dict[str, list] = {}
    for item in items:
        name = "trainer-shared-runs" if item.path in shared else str(item.path.relative_to(config.rootpath))
        item.add_marker(pytest.mark.xdist_group(name))
        groups.setdefault(name, []).append(item)
    slow_first = sorted(groups.values(), key=lambda group: not any(i.get_closest_marker("slow") for i in group))
    items[:] = [item for group in slow_first for item in group]


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
