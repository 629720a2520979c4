"""The warm start from your own demonstrations (``mgrpo_verl.warmstart.demos``, :mod:`mgrpo_verl.warmstart.own`): a
system of three agents (main delegating to alice and bob, alice with the relay_tools sub-agent's ``read_secret``
tool), its demonstrations written by a function of the user's, the tools derived from the run's plan. Unit tests of
the checks, the tools, the cache key, the resolver and the launcher's stage (nothing built), then one build of the
three agents with verl's SFT trainer (3 steps each, bob 2 more after a warm restart: about 1 min on 2 cores),
served from the cache the second time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf, open_dict

from mgrpo_verl.agent_loops.tool_delegation import DelegationTool
from mgrpo_verl.config.plan import build_plan
from mgrpo_verl.launcher import hooks
from mgrpo_verl.launcher import warm_start as stage
from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.platform.ray_session import patched_environ
from mgrpo_verl.warmstart import build, own

register_resolvers()

DEMOS = '''
import json
import random


def call(name, arguments):
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": name, "arguments": arguments}}]}


def demonstrations(n, seed, split):
    rng = random.Random(f"{seed}-{split}")
    episodes = []
    for i in range(n):
        digit = str(rng.randrange(10))
        main = [{"role": "system", "content": "You lead alice and bob."},
                {"role": "user", "content": "Find the secret digit."},
                call("ask_alice", {"task": "Read the secret digit."}),  # arguments as a dict
                {"role": "tool", "content": digit}]
        episode = {"alice": [{"role": "user", "content": "Read the secret digit."}, call("read_secret", "{}"),
                             {"role": "tool", "content": digit}, {"role": "assistant", "content": digit}]}
        if i % 3:  # bob is asked in two episodes of three
            main += [call("ask_bob", json.dumps({"task": "Check " + digit})), {"role": "tool", "content": "ok"}]
            episode["bob"] = [{"role": "user", "content": "Check " + digit}, {"role": "assistant", "content": "ok"}]
        episode["main"] = main + [{"role": "assistant", "content": digit}]
        episodes.append(episode)
    return episodes
'''


@pytest.fixture
def demos_file(tmp_path) -> Path:
    path = tmp_path / "system" / "demos.py"
    path.parent.mkdir()
    path.write_text(DEMOS)
    return path


def settings(demos_file: Path, root: Path, **more) -> dict:
    return {"task": None, "demos": f"{demos_file}:demonstrations", "out": str(root), "n_train": 16, "n_val": 4,
            "batch_size": 4, "agents": {"main": {"base": "tiny_init01", "steps": 3},
                                        "alice": {"base": "main", "steps": 3},
                                        "bob": {"base": "tiny", "steps": 3, "restart_steps": 2}}, **more}  # fmt: skip


def three_agent_config(warmstart: dict, main_tools: bool = False):
    """The user's system: main + alice + bob, each its own model from the warm start, alice with a verl tool config
    (the relay_tools sub-agent's), as a user's YAML composes it (unresolved)."""
    tools = "${mgrpo_config_file:tools/relay_sub_tools.yaml}"
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        cfg = compose("mgrpo_trainer", overrides=["task=relay", "trainer.n_gpus_per_node=3", "~multi_agent.agents.sub"])
    with open_dict(cfg):
        cfg.mgrpo_verl.warmstart = warmstart
        cfg.actor_rollout_ref.model.path = "${mgrpo_warmstart:main,${mgrpo_verl.warmstart}}"
        if main_tools:
            cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path = tools
        path = {"model": {"path": None, "tokenizer_path": None}}
        cfg.multi_agent.agents.alice = {"actor_rollout_ref": {**path, "rollout": {"multi_turn": {"tool_config_path": tools}}}}
        cfg.multi_agent.agents.bob = {"actor_rollout_ref": path}
        for agent in ("alice", "bob"):
            cfg.multi_agent.agents[agent].actor_rollout_ref.model.path = (
                f"${{mgrpo_warmstart:{agent},${{mgrpo_verl.warmstart}}}}")
    return cfg


@pytest.fixture
def plan(demos_file, tmp_path, cache_dir):
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        cfg = three_agent_config(settings(demos_file, tmp_path / "warmstart"))
        OmegaConf.resolve(cfg)
        return build_plan(cfg)


def schema(tool) -> dict:
    return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)


READ_SECRET = {"type": "function", "function": {"name": "read_secret", "description": "Read the secret digit of this task.",
                                                "parameters": {"type": "object", "properties": {}, "required": []}}}
TOOLS = {"main": [schema(DelegationTool.for_agent("alice")), schema(DelegationTool.for_agent("bob"))],
         "alice": [READ_SECRET], "bob": []}  # fmt: skip


# ------------------------------------------------------------------------------------------ the checks


def test_the_demonstrations_are_normalised_as_the_rollout_writes_them(demos_file):
    fn = own.load_demos(f"{demos_file}:demonstrations")
    checked = own.check(fn(6, 0, "train"), TOOLS, "demos")
    assert [len(checked[a]) for a in ("main", "alice", "bob")] == [6, 6, 4]  # bob left out of episodes 0 and 3
    assert [i for i, _ in checked["bob"]] == [1, 2, 4, 5]
    _, main = checked["main"][1]
    # arguments given as a dict and as a JSON string: both JSON text, as the chat template's tojson writes a dict
    assert main[2]["tool_calls"] == [{"type": "function", "function": {"name": "ask_alice",
                                                                      "arguments": '{"task": "Read the secret digit."}'}}]
    assert json.loads(main[4]["tool_calls"][0]["function"]["arguments"])["task"].startswith("Check ")
    assert checked["alice"][0][1][1]["tool_calls"][0]["function"]["arguments"] == "{}"
    tool_call = {"role": "assistant", "tool_calls": [{"function": {"name": "read_secret", "arguments": {"x": "é"}}}]}
    [(_, [message])] = own.check([{"alice": [tool_call]}], {"alice": TOOLS["alice"]}, "demos")["alice"]
    assert message["content"] == "" and message["tool_calls"][0]["function"]["arguments"] == '{"x": "é"}'


def ok(agent: str) -> list[dict]:
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "1"}]


@pytest.mark.parametrize("episodes, error", [
    ({"main": ok("main")}, "demos returned dict, not a list of episodes"),
    ([ok("main")], "demos: episode 0 is list, not a dict agent -> messages"),
    ([{"main": ok("main"), "alice": ok("alice"), "bob": ok("bob")}, {"carol": ok("carol")}],
     "demos: episode 1, agent 'carol': not an agent fine-tuned here \\(mgrpo_verl.warmstart.agents: \\['main', "),
    ([{"main": [], "alice": ok("alice"), "bob": ok("bob")}], "episode 0, agent 'main': its conversation must be a non-empty"),
    ([{"main": [{"role": "robot", "content": "x"}]}], "episode 0, agent 'main', message 0: unknown role 'robot'"),
    ([{"main": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}],
     "episode 0, agent 'main', message 1: an assistant turn without content nor tool_calls"),
    ([{"main": [{"role": "user", "contents": "x"}]}], "message 0: unknown key 'contents'"),
    ([{"main": [{"role": "user", "content": 3}]}], "message 0: content must be a string, got int"),
    ([{"main": [{"role": "user", "content": "x"}]}], "agent 'main': no assistant turn"),
    # two calls in one turn: verl's SFT dataset asserts on the row ("may not equal to apply_chat_template ...")
    ([{"main": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "ask_alice", "arguments": {"task": "a"}}},
        {"function": {"name": "ask_bob", "arguments": {"task": "b"}}}]},
        {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, {"role": "assistant", "content": "12"}]}],
     "agent 'main', messages 2-3: two tool responses in a row .* one tool call per assistant turn"),
    ([{"main": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "read_secret"}}]}]}],
     "agent 'main', message 0, tool call 0: a call to 'read_secret', a tool this agent is not offered in the run; "
     "its tools: \\['ask_alice', 'ask_bob'\\]"),
    ([{"alice": [{"role": "assistant", "tool_calls": [{"function": {"name": "read_secret", "arguments": "{x"}}]}]}],
     "agent 'alice', message 0, tool call 0: the arguments of read_secret are not JSON"),
    ([{"alice": [{"role": "assistant", "tool_calls": [{"function": {"name": "read_secret", "arguments": "[1]"}}]}]}],
     "the arguments of read_secret must be a JSON object"),
    ([{"alice": [{"role": "user", "content": "x", "tool_calls": []}]}], "tool_calls must be a list, on an assistant"),
    ([{"main": ok("main"), "alice": ok("alice")}], "demos: agent 'bob' has no demonstration at all"),
])  # fmt: skip
def test_each_bad_demonstration_is_refused_naming_where_it_is(episodes, error):
    with pytest.raises(ValueError, match=error):
        own.check(episodes, TOOLS, "demos")


def test_errors_name_the_demos_function_and_the_split(tmp_path):
    spec = own.spec_from_settings({"demos": "m:f", "agents": {"main": {"base": "tiny"}}})

    def demonstrations(n, seed, split):
        return [{"main": ok("main")}] if split == "train" else [{"main": [{"role": "user", "content": "x"}]}]

    with pytest.raises(ValueError, match=r"mgrpo_verl.warmstart.demos=m:f called with \(n=32, seed=0, split='val'\): "
                                         r"episode 0, agent 'main': no assistant turn"):
        own.write_datasets(tmp_path, spec, {"main": []}, demonstrations)

    def broken(n, seed, split):
        raise KeyError("prompt")

    with pytest.raises(RuntimeError, match=r"demos=m:f called with \(n=256, seed=0, split='train'\) raised KeyError"):
        own.write_datasets(tmp_path, spec, {"main": []}, broken)


def test_an_agent_with_fewer_train_demonstrations_than_a_batch_is_refused_before_any_sft(tmp_path, cache_dir,
                                                                                        monkeypatch):
    monkeypatch.setattr(build, "train_agent", lambda *a, **k: pytest.fail("trained"))
    spec = own.spec_from_settings({"demos": "m:f", "n_train": 3, "n_val": 0, "batch_size": 4,
                                   "agents": {"main": {"base": "tiny"}}})  # fmt: skip
    monkeypatch.setattr(own, "load_demos", lambda s: lambda n, seed, split: [{"main": ok("main")}] * n)
    monkeypatch.setattr(own, "demos_code", lambda s: {})
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        with pytest.raises(ValueError, match="agent 'main' has 3 train demonstrations, fewer than "
                                             "mgrpo_verl.warmstart.batch_size \\(4\\): verl's SFT trainer drops"):
            own.warm_start(spec, {"main": []}, tmp_path)
        assert list(tmp_path.iterdir()) == [tmp_path / f"{own.target_dir(spec, tmp_path).name}.lock"]  # nothing left


# ------------------------------------------------------------------------------------------ settings


def test_settings_defaults_and_overrides(demos_file, tmp_path, monkeypatch):
    monkeypatch.chdir(demos_file.parent.parent)
    spec = own.spec_from_settings({"demos": "system/demos.py:demonstrations", "lr": 1e-3, "n_train": 8,
                                   "agents": {"main": {"base": "tiny", "restart_steps": 5},
                                              "alice": {"base": "main", "steps": 7, "lr": 2e-3}}})  # fmt: skip
    assert spec.demos == f"{demos_file}:demonstrations"  # relative: against the launch directory
    assert (spec.n_train, spec.n_val, spec.data_seed) == (8, 32, 0)
    main, alice = spec.agents
    assert (main.sft.steps, main.sft.lr, main.sft.batch_size, main.restart_steps) == (250, 1e-3, 16, 5)
    assert (alice.base, alice.sft.steps, alice.sft.lr, alice.restart_steps) == ("main", 7, 2e-3, 0)
    # the task=relay_tools preset's keys, left null, are not this kind's: ignored
    assert own.spec_from_settings({"demos": "m:f", "agents": {"main": {"base": "tiny"}}, "sub_steps": None,
                                   "main_model": None}).names == ("main",)  # fmt: skip


@pytest.mark.parametrize("given, error", [
    ({"stpes": 3}, r"unknown warm-start setting mgrpo_verl.warmstart.stpes; known: \['task', 'demos', 'agents'"),
    ({"sub_steps": 3}, "mgrpo_verl.warmstart.sub_steps is a setting of the built-in warm start"),
    ({"agents": {"main": {"base": "tiny", "stpes": 3}}},
     r"unknown setting mgrpo_verl.warmstart.agents.main.stpes; known: \['base', 'steps', 'restart_steps', 'lr'\]"),
    ({"agents": {"main": {"steps": 3}}}, "mgrpo_verl.warmstart.agents.main.base is required"),
    ({"agents": {"alice": {"base": "main"}, "main": {"base": "tiny"}}},
     "agents.alice.base: agent 'main' is not listed before 'alice'"),
    ({"agents": {}}, "mgrpo_verl.warmstart.agents must map each agent"),
    ({"agents": {"main": {"base": "tiny", "steps": -1}}}, "agents.main.steps must be an integer >= 0, got -1"),
    ({"n_train": 0}, "mgrpo_verl.warmstart.n_train must be an integer >= 1"),
    ({"agents": {"main": "tiny"}}, r"mgrpo_verl.warmstart.agents.main must be a mapping of \['base', "),
    ({"agents": {"../x": {"base": "tiny"}}}, r"agents.../x: agent names match \[A-Za-z0-9_-\]\+"),
    ({"agents": {"main": {"base": "tiny", "lr": "fast"}}}, "agents.main.lr must be a positive number, got 'fast'"),
    ({"lr": 0}, "mgrpo_verl.warmstart.lr must be a positive number, got 0"),
    ({"demos": "demos.py"}, "mgrpo_verl.warmstart.demos must be 'file.py:function' or 'module:function'"),
])  # fmt: skip
def test_bad_settings_are_refused_naming_the_key(given, error):
    with pytest.raises(ValueError, match=error):
        own.spec_from_settings({"demos": "m:f", "agents": {"main": {"base": "tiny"}}, **given})


def test_task_and_demos_together_are_refused():
    with pytest.raises(ValueError, match=r"task \(relay_tools\) and demos \(m:f\) are both set"):
        stage.requested({"task": "relay_tools", "demos": "m:f"})
    assert stage.requested({"task": None, "demos": None}) is None
    assert isinstance(stage.requested({"task": "relay_tools", "demos": None}), stage.BuiltIn)  # the built-in kind


# ------------------------------------------------------------------------------------------ tools


def test_tools_are_the_plan_s_as_the_rollout_offers_them(plan, demos_file, tmp_path, cache_dir):
    assert own.agent_tools(plan, ("main", "alice", "bob")) == TOOLS
    # the main agent's own tools first, then one ask_<sub> per sub-agent in the plan's order (as the loop appends them)
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        cfg = three_agent_config(settings(demos_file, tmp_path / "warmstart"), main_tools=True)
        OmegaConf.resolve(cfg)
    main = own.agent_tools(build_plan(cfg), ["main"])["main"]
    assert [t["function"]["name"] for t in main] == ["read_secret", "ask_alice", "ask_bob"] and main[0] == READ_SECRET
    with pytest.raises(ValueError, match=r"agents.carol: the run has no agent 'carol'; its agents are \['main', 'alice', 'bob'\]"):
        own.agent_tools(plan, ["carol"])


def test_an_agent_playing_another_s_model_is_refused(demos_file, tmp_path, cache_dir):
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        cfg = three_agent_config(settings(demos_file, tmp_path / "warmstart"))
        cfg.multi_agent.agents.bob = {"share_model_with": "main"}
        cfg.trainer.n_gpus_per_node = 2
        OmegaConf.resolve(cfg)
    with pytest.raises(ValueError, match="agents.bob: 'bob' plays 'main''s model .*fine-tune 'main' instead"):
        own.agent_tools(build_plan(cfg), ["bob"])


# ------------------------------------------------------------------------------------------ cache key, resolver


def test_the_cache_key_hashes_the_demos_code_and_not_its_folder(demos_file, tmp_path, cache_dir):
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        spec = own.spec_from_settings({k: v for k, v in settings(demos_file, tmp_path).items() if k not in ("task", "out")})
        key = own.cache_key(spec)
        (demos_file.parent / "notes.txt").write_text("not code")
        (demos_file.parent / "sub").mkdir()
        (demos_file.parent / "sub" / "deep.py").write_text("x = 1")
        (demos_file.parent / "compare.py").write_text("import demos")  # a script beside it, which it does not import
        assert own.cache_key(spec) == key
        copy = tmp_path / "elsewhere"
        shutil.copytree(demos_file.parent, copy)
        assert own.cache_key(own.OwnSpec(f"{copy / 'demos.py'}:demonstrations", spec.agents, 16, 4)) == key
        demos_file.write_text(DEMOS + "\n# an edit\n")
        edited = own.cache_key(spec)
        assert edited != key
        assert own.cache_key(own.OwnSpec(f"{demos_file}:other", spec.agents, 16, 4)) != edited
        assert own.cache_key(own.OwnSpec(spec.demos, spec.agents, 16, 4, data_seed=1)) != edited


def test_the_cache_key_follows_the_demos_file_s_local_imports(tmp_path):
    # demos.py imports prompts (a sibling) and sub.deep (a subpackage); prompts imports helpers; unused.py is never
    # imported; os and json are not files of the folder
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "deep.py").write_text("X = 1")
    (tmp_path / "helpers.py").write_text("Y = 2")
    (tmp_path / "prompts.py").write_text("from helpers import Y")
    (tmp_path / "unused.py").write_text("Z = 3")
    demos = tmp_path / "demos.py"
    demos.write_text("import os, json\nimport prompts\nfrom sub import deep\n")
    assert [p.name for p in own.local_imports(demos)] == ["demos.py", "helpers.py", "prompts.py", "__init__.py",
                                                            "deep.py"]
    spec = f"{demos}:demonstrations"
    before = own.demos_code(spec)
    assert sorted(before["py"]) == ["demos.py", "helpers.py", "prompts.py", "sub/__init__.py", "sub/deep.py"]
    (tmp_path / "unused.py").write_text("Z = 4")
    assert own.demos_code(spec) == before
    (tmp_path / "helpers.py").write_text("Y = 5")  # imported through prompts
    assert own.demos_code(spec) != before
    demos.write_text("from . import prompts\n")  # a relative import of a sibling
    assert sorted(own.demos_code(spec)["py"]) == ["demos.py", "helpers.py", "prompts.py"]
    demos.write_text("from mypkg.prompts import Y\n")  # a module of package mypkg naming its sibling absolutely
    assert sorted(own.demos_code(spec)["py"]) == ["demos.py", "helpers.py", "prompts.py"]
    demos.write_text("def broken(:\n")  # unparsable: the file itself is still hashed; loading it names the error
    assert sorted(own.demos_code(spec)["py"]) == ["demos.py"]


def test_the_resolver_names_each_agent_s_folder_and_builds_nothing(plan, demos_file, tmp_path, cache_dir):
    root = tmp_path / "warmstart"
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        spec = own.spec_from_settings({k: v for k, v in settings(demos_file, root).items() if k not in ("task", "out")})
        target = own.target_dir(spec, root)
    assert target.parent == root and target.name.startswith("own-")
    assert plan.agent_configs["main"].actor_rollout_ref.model.path == str(target / "main")
    assert plan.agent_configs["alice"].actor_rollout_ref.model.path == str(target / "alice")
    assert plan.agent_configs["bob"].actor_rollout_ref.model.path == str(target / "bob")
    assert not root.exists()  # resolving built nothing
    with pytest.raises(Exception, match=r"agent 'carol' is not one of mgrpo_verl.warmstart.agents \['main', 'alice', 'bob'\]"):
        _ = OmegaConf.create({"p": "${mgrpo_warmstart:carol,${s}}", "s": settings(demos_file, root)}).p


def test_the_stage_builds_with_the_plan_s_tools_and_the_checks_read_the_bases(plan, monkeypatch, tmp_path, cache_dir):
    calls = []
    monkeypatch.setattr(own, "warm_start", lambda spec, tools, root=None, log=print: calls.append((spec, tools, root)))
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        found = stage.requested(plan.config.mgrpo_verl.warmstart)
        target = found.target()
        tiny_init01, tiny = build.base_model("tiny_init01")[0], build.base_model("tiny")[0]
        # alice starts from main's checkpoint: the architecture of main's base
        assert stage.pending_models(plan) == {str(target / "main"): tiny_init01, str(target / "alice"): tiny_init01,
                                              str(target / "bob"): tiny}  # fmt: skip
        stage.run_stage(plan)
    assert calls == [(found.spec, TOOLS, str(tmp_path / "warmstart"))]


def test_a_cached_warm_start_with_other_tools_is_refused(tmp_path):
    target = tmp_path / "own-0123"
    (target / "main").mkdir(parents=True)
    (target / "main" / "config.json").write_text("{}")
    manifest = {"tools": {"main": TOOLS["main"]}, "agents": {"main": {}}, "files": build.file_records(target)}
    (target / "manifest.json").write_text(json.dumps(manifest))
    assert own.published(target, {"main": TOOLS["main"]}).checkpoints == {"main": target / "main"}
    assert own.published(target).directory == target  # no tools given: not compared (the launcher's checks)
    with pytest.raises(own.StaleTools, match=rf"warm start {target}: agent 'main' was fine-tuned with other tools than "
                                             rf"the run offers it now \(the run: \['ask_alice'\]; the warm start: "
                                             rf"\['ask_alice', 'ask_bob'\].*delete {target}"):
        own.published(target, {"main": TOOLS["main"][:1]})
    assert own.published(tmp_path / "own-none", {"main": []}) is None


def test_main_ppo_builds_it_after_every_check_and_before_ray(demos_file, tmp_path, cache_dir, monkeypatch):
    """``main_ppo.run`` from a relative ``demos`` (the launch directory): the resolver names the folders, the checks
    accept the checkpoints not built yet (their bases' architectures), the stage builds with the plan's tools, then
    verl's ``run_ppo`` (stubbed here) starts Ray."""
    import ray
    import verl.trainer.main_ppo

    from mgrpo_verl import main_ppo

    class ReachedRay(Exception):
        pass

    calls = []
    monkeypatch.setattr(own, "warm_start", lambda spec, tools, root=None, log=print: calls.append((spec.demos, tools)))
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda *a, **k: (_ for _ in ()).throw(ReachedRay()))
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    monkeypatch.chdir(demos_file.parent.parent)
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        cfg = three_agent_config({**settings(demos_file, tmp_path / "warmstart"), "demos": "system/demos.py:demonstrations"})
        cfg.trainer.default_local_dir = str(tmp_path / "checkpoints")
        with pytest.raises(ReachedRay):
            main_ppo.run(cfg)
    assert calls == [(f"{demos_file}:demonstrations", TOOLS)]
    assert cfg.mgrpo_verl.warmstart.demos == f"{demos_file}:demonstrations"  # what Ray's processes would read


# ------------------------------------------------------------------------------------------ hooks


def test_the_demos_hook_is_made_absolute_and_checked_before_ray(plan, demos_file, monkeypatch):
    monkeypatch.chdir(demos_file.parent)
    cfg = OmegaConf.create({"mgrpo_verl": {"warmstart": {"demos": "demos.py:demonstrations"}}})
    assert hooks.absolute_paths(cfg) == {"mgrpo_verl.warmstart.demos": f"{demos_file}:demonstrations"}
    hooks.check_user_hooks(plan)  # the plan's: an absolute file, a function there
    with open_dict(plan.config):
        plan.config.mgrpo_verl.warmstart.demos = f"{demos_file}:nope"
    with pytest.raises(ValueError, match=rf"mgrpo_verl.warmstart.demos={demos_file}:nope: {demos_file} has no "
                                         rf"function 'nope'"):
        hooks.check_user_hooks(plan)
    plan.config.mgrpo_verl.warmstart.demos = f"{demos_file.parent / 'missing.py'}:demonstrations"
    with pytest.raises(ValueError, match=r"mgrpo_verl.warmstart.demos=.*missing.py:demonstrations: no such file"):
        hooks.check_user_hooks(plan)
    demos_file.write_text("import no_such_module_here\n")
    plan.config.mgrpo_verl.warmstart.demos = f"{demos_file}:demonstrations"
    with pytest.raises(ValueError, match=r"demos=.*demos.py:demonstrations: loading .*demos.py failed: "
                                         r"ModuleNotFoundError"):
        hooks.check_user_hooks(plan)
    plan.config.mgrpo_verl.warmstart.demos = "no_such_package_xyz:demonstrations"
    with pytest.raises(ValueError, match="demos=no_such_package_xyz:demonstrations: no module 'no_such_package_xyz'"):
        hooks.check_user_hooks(plan)


# ------------------------------------------------------------------------------------------ the build


def test_three_agents_fine_tuned_from_their_demonstrations_then_cached(plan, cache_dir, tmp_path, capsys, monkeypatch):
    import pandas as pd
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        ws = stage.run_stage(plan)
        target = ws.directory
        assert target == stage.requested(plan.config.mgrpo_verl.warmstart).target()
        err = capsys.readouterr().err
        for name in ("main", "alice", "bob"):  # each SFT run showed its progress on stderr
            assert any(line.startswith(f"warm start: {name} SFT 3/3 steps [100%]") for line in err.splitlines()), name
        assert any(line.startswith("warm start: bob_restart SFT 2/2 steps [100%]") for line in err.splitlines())
        assert "mgrpo_warmstart: warm start: verl SFT of alice from " + str(target / "main") in err
        assert ("mgrpo_warmstart: warm start: agent 'bob' has 2 val demonstrations, fewer than the batch (4): verl's "
                "SFT computes no val loss for it") in err

        manifest = json.loads((target / "manifest.json").read_text())
        assert manifest["version"] == own.VERSION and manifest["kind"] == "own"
        assert manifest["tools"] == TOOLS and list(manifest["agents"]) == ["main", "alice", "bob"]
        assert manifest["demos"]["function"] == "demonstrations" and "demos.py" in manifest["demos"]["py"]
        bases = {"main": build.base_model("tiny_init01")[0], "alice": str(target / "main"), "bob": build.base_model("tiny")[0]}
        for agent, info in manifest["agents"].items():
            assert info["base_model"] == bases[agent] and info["checkpoint"] == str(target / agent)
            assert info["sft_steps"] == 3 and info["restart_steps"] == (2 if agent == "bob" else 0)
            assert info["first_loss"] > 0 and info["final_loss"] > 0
            # bob is in 2 of the 4 val episodes, fewer than the batch of 4: verl drops it (and the build says so)
            assert info["val_loss"] is None if agent == "bob" else info["val_loss"] > 0
            assert info["demonstrations"] == ({"train": 10, "val": 2} if agent == "bob" else {"train": 16, "val": 4})
            rows = pd.read_parquet(target / "data" / agent / "train.parquet")
            assert len(rows) == info["demonstrations"]["train"] and json.loads(rows["tools"][0]) == TOOLS[agent]
            # a Hugging Face checkpoint with its tokenizer, moved away from its base
            model = AutoModelForCausalLM.from_pretrained(str(target / agent))
            assert next(model.parameters()).dtype == torch.float32
            AutoTokenizer.from_pretrained(str(target / agent))
            tuned, before = load_file(target / agent / "model.safetensors"), load_file(f"{bases[agent]}/model.safetensors")
            assert any(not torch.equal(tuned[k], before[k]) for k in tuned)
        assert set(manifest["files"]) >= {f"{a}/model.safetensors" for a in TOOLS} and not (target / "sft").exists()
        assert "'lr_scheduler_type': 'cosine'" in (target / "logs" / "sft_bob_restart.log").read_text()

        # the second time: cached, nothing trains
        monkeypatch.setattr(build, "train_agent", lambda *a, **k: pytest.fail("built again"))
        assert stage.pending_models(plan) == {} and stage.run_stage(plan) is None
        again = own.warm_start(stage.requested(plan.config.mgrpo_verl.warmstart).spec, TOOLS, tmp_path / "warmstart")
        assert again.directory == target and again.checkpoints == {a: target / a for a in TOOLS}


def test_magrpo_agents_are_fine_tuned_without_tools(cache_dir):
    # MAGRPO's cooperative loop renders every prompt without tools, so its agents' SFT must not see any; before, the
    # first agent was handed ask_<other> as if it delegated (the plan's main agent)
    with patched_environ({"MGRPO_VERL_CACHE": str(cache_dir)}):
        with initialize_config_module("mgrpo_verl.config", version_base=None):
            cfg = compose(config_name="magrpo_trainer")
        with open_dict(cfg):
            cfg.mgrpo_verl.warmstart = {
                "task": None, "demos": "mgrpo_verl.envs.coop_writing:demonstrations",
                "agents": {"summary": {"base": "tiny_init01", "steps": 2}, "details": {"base": "tiny_init01", "steps": 2}}}
            cfg.actor_rollout_ref.model.path = "${mgrpo_warmstart:summary,${mgrpo_verl.warmstart}}"
            details = cfg.multi_agent.agents.details.actor_rollout_ref.model
            details.path, details.tokenizer_path = "${mgrpo_warmstart:details,${mgrpo_verl.warmstart}}", None
        OmegaConf.resolve(cfg)
        plan = build_plan(cfg)
        found = stage.requested(cfg.mgrpo_verl.warmstart)
        assert found.agents == ("summary", "details")
        assert plan.agent_configs["details"].actor_rollout_ref.model.path == str(found.target() / "details")
        assert own.agent_tools(plan, found.agents) == {"summary": [], "details": []}
