"""``task=relay_tools`` (mgrpo_verl/config/task/relay_tools.yaml): delegation by tool call from the cached warm
start, named by ``mgrpo_verl.warmstart`` and the ``mgrpo_warmstart`` resolver, built by the launcher's warm-start
stage; ``task=relay`` is the forced relay with the random tiny models. Composition, the resolver's path and
what the stage is asked to build only: nothing is built here (the build is test_warmstart_e2e.py's, the RL run
test_tool_run_e2e.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.warmstart import build, sft

register_resolvers()


def _compose(*overrides: str):
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose("mgrpo_trainer", overrides=list(overrides))


SUB = "multi_agent.agents.sub.actor_rollout_ref"


def test_relay_tools_preset_sets_the_tool_task_and_the_warm_started_models():
    cfg = _compose("task=relay_tools")
    assert cfg.mgrpo_verl.task == "relay_tools"
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_delegate"
    # both agents' models come from the warm start the config names
    main_path = OmegaConf.to_container(cfg.actor_rollout_ref.model, resolve=False)["path"]
    sub_model = OmegaConf.to_container(OmegaConf.select(cfg, f"{SUB}.model"), resolve=False)
    assert main_path == "${mgrpo_warmstart:main,${mgrpo_verl.warmstart}}"
    assert sub_model == {"path": "${mgrpo_warmstart:sub,${mgrpo_verl.warmstart}}", "tokenizer_path": None}
    # the lengths the demonstrations need, the ones the warm start's evaluation runs the loop with
    from mgrpo_verl.warmstart import evaluate

    assert cfg.data.max_prompt_length == evaluate.PROMPT_LENGTH
    assert cfg.data.max_response_length == evaluate.RESPONSE_LENGTH
    assert cfg.multi_agent.delegation.sub_response_tokens == evaluate.SUB_RESPONSE_TOKENS
    # each agent's own learning rate, as its workers get it: 3e-4 for both (the sub-agent's at 1e-3 collapsed in
    # one run of two, docs/warmstart.md version 5); neither at the random models' 1e-2
    from mgrpo_verl.config.plan import build_plan
    from mgrpo_verl.config.rules import agent_full_config

    specs = build_plan(cfg).multi_agent.agents
    lrs = {name: agent_full_config(cfg, spec).actor_rollout_ref.actor.optim.lr for name, spec in specs.items()}
    assert lrs == {"main": 3e-4, "sub": 3e-4}
    tools = OmegaConf.select(cfg, f"{SUB}.rollout.multi_turn.tool_config_path")
    assert Path(tools).name == "relay_sub_tools.yaml" and Path(tools).is_file()
    # the default warm start of the task: every setting null (the CLI's defaults)
    settings = OmegaConf.to_container(cfg.mgrpo_verl.warmstart)
    assert settings.pop("task") == "relay_tools" and set(settings.values()) == {None}


def test_relay_tools_is_the_default_and_relay_stays_available_by_name():
    default, named = _compose(), _compose("task=relay")
    assert OmegaConf.to_yaml(default) == OmegaConf.to_yaml(_compose("task=relay_tools"))
    assert named.mgrpo_verl.task == "relay" and named.actor_rollout_ref.rollout.agent.default_agent_loop == "mgrpo_relay"
    assert "warmstart" not in named.mgrpo_verl
    assert "mgrpo_warmstart" not in OmegaConf.to_yaml(named)


def test_the_resolver_names_the_spec_of_the_config_and_the_stage_builds_it(monkeypatch, tmp_path):
    """``${mgrpo_warmstart:<agent>,${mgrpo_verl.warmstart}}`` answers where that agent's checkpoint of the warm
    start of the config's settings (null: default) is published under the root ``out``, building nothing; the
    launcher's stage (``run_stage``) then builds that spec once, after the checks, and not again once cached."""
    from mgrpo_verl.config.plan import build_plan
    from mgrpo_verl.launcher.warm_start import pending_models, run_stage

    calls = []

    def fake_warm_start(spec, root=None, log=print):
        calls.append((spec, root))
        return build.WarmStart(tmp_path, tmp_path / "main", tmp_path / "sub", {})

    monkeypatch.setattr(build, "warm_start", fake_warm_start)
    cfg = _compose("task=relay_tools", "mgrpo_verl.warmstart.steps=40", "mgrpo_verl.warmstart.n_train=16",
                   f"mgrpo_verl.warmstart.out={tmp_path}", "mgrpo_verl.warmstart.sub_model=tiny")  # fmt: skip
    OmegaConf.resolve(cfg)
    assert calls == []  # resolving builds nothing
    spec = build.WarmStartSpec(task="relay_tools", n_train=16, sub_model="tiny", sft=sft.SFTSettings(steps=40))
    target = build.target_dir(spec, tmp_path)
    assert target.parent == tmp_path and target.name.startswith("relay_tools-")
    assert cfg.actor_rollout_ref.model.path == str(target / "main")
    assert OmegaConf.select(cfg, f"{SUB}.model.path") == str(target / "sub")
    plan = build_plan(cfg)
    bases = build.base_models(spec)
    assert pending_models(plan) == {str(target / "main"): bases["main"][0], str(target / "sub"): bases["sub"][0]}
    run_stage(plan)
    assert calls == [(spec, str(tmp_path))]
    (target / "main").mkdir(parents=True)
    (target / "main" / "config.json").write_text("{}")
    # published (a manifest recording its files, as _build writes it): the stage has nothing left to build
    (target / "manifest.json").write_text(json.dumps({"files": build.file_records(target)}))
    assert pending_models(plan) == {} and run_stage(plan) is None and len(calls) == 1


def test_a_warm_starts_overrides_are_the_preset_and_its_checkpoints(tmp_path, cache_dir, monkeypatch):
    """``python -m mgrpo_verl.warmstart --overrides``: ``task=relay_tools`` with the model paths of that warm
    start, which replace the preset's resolver: the run starts from no warm start of its settings, so the
    launcher's stage builds nothing."""
    from mgrpo_verl.config.plan import build_plan
    from mgrpo_verl.launcher.warm_start import run_stage

    monkeypatch.setattr(build, "warm_start", lambda *a, **k: pytest.fail("the stage built a warm start the run does not use"))
    # the manifest was written where the warm start was built; the cache was copied here since (the GPU
    # machine gets it carried): the overrides name the checkpoints where they are now
    ws = build.WarmStart(tmp_path, tmp_path / "main", tmp_path / "sub", {"main_ppo_overrides": [
        build.PRESETS["relay_tools"], "actor_rollout_ref.model.path=/elsewhere/main",
        "multi_agent.agents.sub.actor_rollout_ref.model.path=/elsewhere/sub"]})  # fmt: skip
    from mgrpo_verl.platform.ray_session import patched_environ

    cfg = _compose(*ws.main_ppo_overrides())
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):  # the task's data and the tiny tokenizer
        OmegaConf.resolve(cfg)
        assert run_stage(build_plan(cfg)) is None
    assert cfg.actor_rollout_ref.model.path == str(tmp_path / "main")
    assert OmegaConf.select(cfg, f"{SUB}.model.path") == str(tmp_path / "sub")
    assert cfg.mgrpo_verl.task == "relay_tools" and cfg.data.max_prompt_length == 512


def test_spec_from_settings_keeps_defaults_and_refuses_unknown_keys():
    assert build.spec_from_settings("relay_tools", {"steps": None, "lr": None}) == build.WarmStartSpec()
    assert build.spec_from_settings("relay_tools", {"lr": 1e-3, "n_eval": 0}).sft.lr == 1e-3
    with pytest.raises(ValueError, match="unknown warm-start settings \\['stpes'\\]"):
        build.spec_from_settings("relay_tools", {"stpes": 3})


def test_the_resolver_refuses_an_unknown_agent_and_a_settings_without_task():
    with pytest.raises(Exception, match="agent must be 'main' or 'sub'"):
        _ = OmegaConf.create({"p": "${mgrpo_warmstart:planner,${s}}", "s": {"task": "relay_tools"}}).p
    with pytest.raises(Exception, match="mgrpo_verl.warmstart.task is null"):
        _ = OmegaConf.create({"p": "${mgrpo_warmstart:main,${s}}", "s": {"task": None}}).p


def test_the_sub_agent_starts_from_the_main_agents_checkpoint_by_default(cache_dir):
    from mgrpo_verl.platform.ray_session import patched_environ

    spec = build.WarmStartSpec()
    assert spec.sub_model == build.FROM_MAIN
    assert build.agent_settings(spec, "main") == spec.sft
    assert build.agent_settings(spec, "sub") == sft.SFTSettings(steps=spec.sub_steps)
    same = build.WarmStartSpec(sub_steps=None)
    assert build.agent_settings(same, "sub") == build.agent_settings(same, "main")
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):  # the tiny models are built there
        # until the main checkpoint exists, the key hashes the main agent's base for both
        assert spec.main_model == "tiny_init01"  # tiny at init std 0.1: the copy is learnt in 250 + 100 steps
        assert build.base_models(spec)["sub"] == build.base_models(spec)["main"] == build._base_model("tiny_init01")
        other = build.WarmStartSpec(sub_model="tiny_sub")
        assert build.base_models(other)["sub"] == build._base_model("tiny_sub")
        assert build.cache_key(other, build.base_models(other)) != build.cache_key(spec, build.base_models(spec))


def test_exact_scorer_pays_the_bare_right_digit_only():
    """relay.exact_scorer: 1 for the bare right digit, a small format credit for another bare digit, 0 for
    anything else, including text the dense default pays as much as the right digit or more ("7.", "77777777")."""
    from mgrpo_verl.envs import relay

    assert relay.exact_scorer("main", " 7\n", "7") == 1.0
    assert relay.exact_scorer("sub", "3", "7") == relay.EXACT_FORMAT_CREDIT < 1.0
    for text in ("7.", "77777777", "7 3", "", "<tool_call>"):
        assert relay.exact_scorer("main", text, "7") == 0.0, text
    assert relay.default_scorer("main", "77777777", "7") == 1.0  # what the dense score pays for spam
