"""User hooks are imported and checked before Ray, with errors naming the key, the file and the class or function
(issue 31; ``mgrpo_verl/launcher/hooks.py``): tool classes of the tool configs (top level and per agent), the
agent loops of ``agent_loop_config_path``, the delegation ``scorer`` / ``sub_prompt``. Relative paths are made
absolute against the launch directory before the plan, so Ray's processes (other working directories) find them.

Composed and run as in ``test_fail_fast.py``: verl's ``run_ppo`` replaced by a sentinel that keeps the config it
was given, ``ray.init`` recorded (never called); every hook file is written in ``tmp_path``."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_module

import verl.trainer.main_ppo

from mgrpo_verl import main_ppo
from mgrpo_verl.envs import relay
from mgrpo_verl.launcher import hooks
from mgrpo_verl.launcher.resolvers import register_resolvers

register_resolvers()

SUB_TOOLS = "multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path"
TOP_TOOLS = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
LOOPS = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
SCORER = "multi_agent.delegation.scorer"


class ReachedRay(Exception):
    """verl's run_ppo was called: every check before Ray passed; ``config`` is what it got."""

    def __init__(self, config):
        super().__init__("reached run_ppo")
        self.config = config


@pytest.fixture
def run(monkeypatch, tmp_path):
    def reached(config, *args, **kwargs):
        raise ReachedRay(config)

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", reached)
    inits = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def call(*overrides: str) -> BaseException:
        with initialize_config_module("mgrpo_verl.config", version_base=None):
            config = compose("mgrpo_trainer", overrides=["task=relay", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                                                         *overrides])
        with pytest.raises(BaseException) as info:
            main_ppo.run(config)
        assert not inits, "the run called ray.init before refusing"
        return info.value

    return call


def refused(err: BaseException, *texts: str) -> str:
    assert isinstance(err, ValueError), f"expected a ValueError before Ray, got {err!r}"
    for text in texts:
        assert text in str(err), (text, str(err))
    return str(err)


def tool_config(path: Path, class_name: str, kind: str = "native") -> Path:
    path.write_text(textwrap.dedent(f"""\
        tools:
          - class_name: {class_name}
            config:
              type: {kind}
            tool_schema:
              type: function
              function:
                name: read_a
                description: Read part A.
                parameters: {{type: object, properties: {{}}, required: []}}
        """))
    return path


def tool_module(folder: Path, name: str, body: str) -> Path:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    return folder / f"{name}.py"


GOOD_TOOL = """\
    from verl.tools.base_tool import BaseTool

    class ReadA(BaseTool):
        pass

    class NotATool:
        pass
    """


def test_the_built_in_tool_and_a_users_tool_class_pass(run, tmp_path, monkeypatch):
    assert isinstance(run(f"{SUB_TOOLS}={relay.SUB_TOOL_CONFIG}"), ReachedRay)
    monkeypatch.syspath_prepend(str(tmp_path))
    tool_module(tmp_path, "hooks_ok_tools", GOOD_TOOL)
    cfg = tool_config(tmp_path / "tools.yaml", "hooks_ok_tools.ReadA")
    assert isinstance(run(f"{SUB_TOOLS}={cfg}", f"{TOP_TOOLS}={cfg}"), ReachedRay)


def test_a_tool_module_that_is_not_on_the_path_names_key_file_and_class(run, tmp_path):
    """The trial's case: verl failed ~70 s in with ``'NoneType' object has no attribute 'loader'``."""
    cfg = tool_config(tmp_path / "tools.yaml", "hooks_missing_pkg.tools.ReadA")
    refused(run(f"{SUB_TOOLS}={cfg}"), SUB_TOOLS, str(cfg), "class_name hooks_missing_pkg.tools.ReadA",
            "no module named 'hooks_missing_pkg'", "PYTHONPATH")


def test_a_tool_module_that_raises_on_import(run, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    tool_module(tmp_path, "hooks_broken_tools", "import hooks_no_such_dependency\n")
    cfg = tool_config(tmp_path / "tools.yaml", "hooks_broken_tools.ReadA")
    refused(run(f"{TOP_TOOLS}={cfg}"), TOP_TOOLS, str(cfg), "importing module 'hooks_broken_tools' failed",
            "hooks_no_such_dependency")


@pytest.mark.parametrize("class_name, message", [
    ("hooks_named_tools.ReadB", "module 'hooks_named_tools' has no class 'ReadB'"),
    ("hooks_named_tools.NotATool", "is not a subclass of verl's BaseTool"),
])
def test_a_wrong_class_name_or_a_class_that_is_no_tool(run, tmp_path, monkeypatch, class_name, message):
    monkeypatch.syspath_prepend(str(tmp_path))
    tool_module(tmp_path, "hooks_named_tools", GOOD_TOOL)
    cfg = tool_config(tmp_path / "tools.yaml", class_name)
    refused(run(f"{SUB_TOOLS}={cfg}"), SUB_TOOLS, str(cfg), message)


def test_a_missing_tool_config_and_a_bad_tool_type(run, tmp_path, monkeypatch):
    refused(run(f"{SUB_TOOLS}={tmp_path / 'nope.yaml'}"), f"{SUB_TOOLS}={tmp_path / 'nope.yaml'}", "no such file")
    monkeypatch.syspath_prepend(str(tmp_path))
    tool_module(tmp_path, "hooks_typed_tools", GOOD_TOOL)
    cfg = tool_config(tmp_path / "tools.yaml", "hooks_typed_tools.ReadA", kind="mcp")
    refused(run(f"{SUB_TOOLS}={cfg}"), SUB_TOOLS, "config.type 'mcp'")
    functions = "actor_rollout_ref.rollout.multi_turn.function_tool_path"
    refused(run(f"{functions}={tmp_path / 'fns.py'}"), f"{functions}={tmp_path / 'fns.py'}", "no such file")


def test_a_scorer_file_that_does_not_exist(run, tmp_path):
    missing = tmp_path / "scorers" / "mine.py"
    refused(run(f"{SCORER}={missing}:score"), SCORER, str(missing), "no such file")


def test_a_scorer_without_the_function_and_a_scorer_file_that_raises(run, tmp_path):
    scorer = tmp_path / "scorer.py"
    scorer.write_text("def other(role, text, ground_truth):\n    return 0.0\n")
    refused(run(f"{SCORER}={scorer}:score"), SCORER, str(scorer), "has no function 'score'")
    scorer.write_text("raise RuntimeError('the scorer module is broken')\n")
    refused(run(f"{SCORER}={scorer}:score"), SCORER, str(scorer), "the scorer module is broken")


def test_relative_scorer_and_tool_paths_are_resolved_from_the_launch_dir(run, tmp_path, monkeypatch):
    """Launched from ``tmp_path`` with ``scorer=user/score.py:score`` and a relative tool config: the config Ray
    receives names both absolutely, so a process elsewhere (a Ray worker's cwd) loads them."""
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "score.py").write_text("def score(role, text, ground_truth):\n    return 0.25\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tool_module(tmp_path, "hooks_relative_tools", GOOD_TOOL)
    tool_config(tmp_path / "user" / "tools.yaml", "hooks_relative_tools.ReadA")
    monkeypatch.chdir(tmp_path)
    reached = run(f"{SCORER}=user/score.py:score", f"{SUB_TOOLS}=user/tools.yaml")
    assert isinstance(reached, ReachedRay), repr(reached)
    config = reached.config
    assert config.multi_agent.delegation.scorer == f"{tmp_path / 'user' / 'score.py'}:score"
    assert config.multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path == str(tmp_path / "user" / "tools.yaml")
    monkeypatch.chdir("/")  # a worker's working directory: the absolute spec still loads
    assert relay.load_scorer(config.multi_agent.delegation.scorer)("main", "x", "1") == 0.25
    # launched elsewhere, the relative spec is refused before Ray, naming the file it looked for
    refused(run(f"{SCORER}=user/score.py:score"), SCORER, "/user/score.py", "no such file")


def test_agent_loop_config_entries_are_imported(run, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    tool_module(tmp_path, "hooks_user_loops", """\
        from mgrpo_verl.agent_loops.tool_delegation import ToolDelegationLoop

        class ForcedCalls(ToolDelegationLoop):
            pass

        class NotALoop:
            pass

        def build_loop(**kwargs):  # a factory: hydra instantiates any callable _target_
            return ForcedCalls(**kwargs)
        """)
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: forced\n  _target_: hooks_user_loops.ForcedCalls\n"
                     "- name: built\n  _target_: hooks_user_loops.build_loop\n")
    assert isinstance(run(f"{LOOPS}={loops}"), ReachedRay)
    loops.write_text("- name: forced\n  _target_: hooks_user_loops.NotALoop\n")
    refused(run(f"{LOOPS}={loops}"), LOOPS, str(loops), "name forced", "not a subclass of verl's AgentLoopBase")
    loops.write_text("- name: forced\n  _target_: hooks_user_loops.Missing\n")
    refused(run(f"{LOOPS}={loops}"), LOOPS, "has no class 'Missing'")


def test_absolute_paths_rewrites_only_relative_hook_paths(tmp_path):
    from omegaconf import OmegaConf

    (tmp_path / "t.yaml").write_text("tools: []\n")
    config = OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"multi_turn": {"tool_config_path": "t.yaml", "function_tool_path": "f.py"},
                                          "agent": {"agent_loop_config_path": "missing_here.yaml"}}},
        "data": {"tool_config_path": "t.yaml"},
        "multi_agent": {"delegation": {"scorer": "pkg.mod:fn", "sub_prompt": "p.py:build"},
                        "agents": {"sub": {"actor_rollout_ref": {"rollout": {"multi_turn": {"tool_config_path": "/abs/t.yaml"}}}}}},
    })
    changed = hooks.absolute_paths(config, str(tmp_path))
    t = str(tmp_path / "t.yaml")
    assert changed == {
        "actor_rollout_ref.rollout.multi_turn.tool_config_path": t,
        "actor_rollout_ref.rollout.multi_turn.function_tool_path": str(tmp_path / "f.py"),
        "data.tool_config_path": t,
        "multi_agent.delegation.sub_prompt": f"{tmp_path / 'p.py'}:build",
    }
    # not under the launch dir: left to verl's rule (its own folder next); module specs and absolute paths unchanged
    assert config.actor_rollout_ref.rollout.agent.agent_loop_config_path == "missing_here.yaml"
    assert config.multi_agent.delegation.scorer == "pkg.mod:fn"
    assert os.path.isabs(config.multi_agent.agents.sub.actor_rollout_ref.rollout.multi_turn.tool_config_path)
