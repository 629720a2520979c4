"""The verl 0.9.1 symbols and behaviours mgrpo_verl relies on. These fail first when verl moves.

Each test names what we use and where; when one fails after a verl upgrade, the module named in the
test is the one to revisit.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

from mgrpo_verl.testing import make_batch


def test_pinned_verl_version():
    # pyproject pins verl==0.9.1; everything below was checked against it.
    assert verl.__version__ == "0.9.1"


def test_advantage_registry_api():
    # used by mgrpo_verl/algorithms/verl_registry.py
    assert callable(core_algos.register_adv_est)
    assert callable(core_algos.get_adv_estimator_fn)
    assert isinstance(core_algos.ADV_ESTIMATOR_REGISTRY, dict)


def test_grpo_reference_signatures():
    # our equivalence tests and benchmark call these with (rewards, mask, index, epsilon, norm flag)
    for fn in (core_algos.compute_grpo_outcome_advantage, core_algos.compute_grpo_vectorized_outcome_advantage):
        params = list(inspect.signature(fn).parameters)
        assert params[:5] == ["token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo"]


def test_registry_call_passes_no_agent_metadata():
    # docs/algorithms.md: through the registry an estimator receives rewards, mask, config and uid only
    # (plus reward_baselines). If verl starts passing non_tensor_batch to every estimator (upstream PR
    # #7473), the registry path could run the full M-GRPO and this test tells us to update it.
    src = inspect.getsource(compute_advantage)
    assert '"token_level_rewards": data.batch["token_level_rewards"]' in src
    assert 'adv_kwargs["index"] = data.non_tensor_batch["uid"]' in src
    assert 'adv_kwargs["non_tensor_batch"] = data.non_tensor_batch' in src
    assert "AdvantageEstimator.GDPO" in src.split('adv_kwargs["non_tensor_batch"]')[0].rsplit("if ", 1)[1]


def test_plugin_entry_point_group_is_loaded_by_verl():
    # pyproject's [project.entry-points."verl.plugins"] relies on verl/__init__.py loading this group.
    src = inspect.getsource(verl)
    assert 'entry_points(group="verl.plugins")' in src


def test_entry_point_registers_estimators_in_a_fresh_process():
    code = (
        "import verl\n"
        "from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY as R\n"
        "assert R['mgrpo'].__module__ == 'mgrpo_verl.algorithms.verl_registry', R.get('mgrpo')\n"
        "assert R['magrpo'].__module__ == 'mgrpo_verl.algorithms.verl_registry', R.get('magrpo')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_plugin_imports_nothing_heavy_on_import_verl():
    # every process of a run imports verl, hence our plugin: the estimators wait for core_algos (their
    # registry), the algorithms and pandas for first use; compared with verl alone in the same test
    code = "import sys, verl; print(' '.join(sorted(sys.modules)))"

    def modules(policy: str) -> set[str]:
        env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": policy}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return set(done.stdout.split())

    ours = modules("auto") - modules("none")
    assert "mgrpo_verl.plugin" in ours
    heavy = {"pandas", "verl.trainer.ppo.core_algos", "mgrpo_verl.algorithms", "mgrpo_verl.algorithms.verl_registry"}
    assert not ours & heavy, sorted(ours & heavy)


def test_auto_await_hands_a_coroutine_to_a_coroutine_caller():
    # per_agent._start_rollout_servers awaits LLMServerManager.create (auto_await) from a coroutine, to start
    # every agent's servers concurrently; called from plain code, auto_await runs the coroutine itself
    import asyncio

    from verl.utils.ray_utils import auto_await
    from verl.workers.rollout.llm_server import LLMServerManager

    @auto_await
    async def make(x):
        return x + 1

    async def caller():
        pending = make(1)
        assert asyncio.iscoroutine(pending)
        return await pending

    assert asyncio.run(caller()) == 2 and make(2) == 3
    assert "auto_await" in inspect.getsource(LLMServerManager.create.__func__) or hasattr(LLMServerManager.create, "__wrapped__")


def test_dataproto_api_used_by_alignment():
    # alignment builds its output with type(data)(batch=..., non_tensor_batch=..., meta_info=...)
    params = inspect.signature(DataProto).parameters
    assert {"batch", "non_tensor_batch", "meta_info"} <= set(params)
    assert callable(DataProto.from_dict) and callable(DataProto.select_idxs)


@pytest.mark.parametrize("norm", [True, False])
def test_verl_compute_advantage_runs_mgrpo_by_name(norm):
    # The whole registry path as verl's trainer runs it: compute_advantage(adv_estimator="mgrpo").
    # Scores 1, 0, 1 in group a and 0.5 alone in group b:
    #   a: mean 2/3, unbiased std sqrt(((1/3)^2*2 + (2/3)^2)/2) = 0.57735 -> A = +0.57735, -1.1547, +0.57735
    #   b: group of one -> mean 0, std 1 -> A = 0.5 / (1 + 1e-6)
    data = make_batch([1.0, 0.0, 1.0, 0.5], uid=["a", "a", "a", "b"])
    from verl.trainer.config import AlgoConfig

    out = compute_advantage(data, adv_estimator="mgrpo", config=AlgoConfig(norm_adv_by_std_in_grpo=norm))
    got = out.batch["advantages"][:, -1]
    if norm:
        expected = torch.tensor([0.57735, -1.1547, 0.57735, 0.5 / (1 + 1e-6)])
    else:
        expected = torch.tensor([1 / 3, -2 / 3, 1 / 3, 0.5])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    ref, _ = core_algos.compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], np.array(["a", "a", "a", "b"], dtype=object),
        norm_adv_by_std_in_grpo=norm,
    )
    torch.testing.assert_close(out.batch["advantages"], ref, atol=1e-6, rtol=1e-5)
