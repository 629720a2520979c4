"""User hooks, imported and checked in the driver before Ray starts: the tool classes of every tool config the
run names, verl function-tool files, the agent loops of ``agent_loop_config_path``, the delegation ``scorer`` /
``sub_prompt`` callables and the warm start's ``demos`` function. Each error names the config key, the file and the
class or function.

Without this, verl imports them inside Ray workers a minute or more into the run, and a tool class that does not
import fails there as ``AttributeError: 'NoneType' object has no attribute 'loader'`` (verl's ``get_tool_class``
on a module it cannot find), naming neither. A relative path works or not depending on each process's working
directory: :func:`absolute_paths` makes every relative hook path absolute against the launch directory before the
plan is built, so the config Ray's processes receive names absolute files.

- :data:`PATH_LEAVES` (under ``actor_rollout_ref``, at the top level and in each agent's override) and
  :data:`DATA_KEYS`: YAML / Python files;
- :data:`CALLABLE_KEYS`: ``"module:function"`` or ``"file.py:function"`` (only the file part is a path).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

from mgrpo_verl.config import setting
from mgrpo_verl.config.plan import RunPlan

TOOL_CONFIG = "rollout.multi_turn.tool_config_path"
FUNCTION_TOOLS = "rollout.multi_turn.function_tool_path"
AGENT_LOOPS = "rollout.agent.agent_loop_config_path"
#: File paths under ``actor_rollout_ref`` (top level, and ``multi_agent.agents.<name>.actor_rollout_ref``).
PATH_LEAVES = (TOOL_CONFIG, FUNCTION_TOOLS, AGENT_LOOPS)
#: verl's dataset reads the tools too (prompt lengths with the tool schemas): its copies of the keys.
DATA_KEYS = ("data.tool_config_path", "data.function_tool_path")
#: ``module:function`` / ``file.py:function`` settings of the delegation loops and of the warm start (your own
#: demonstrations, :mod:`mgrpo_verl.warmstart.own`).
CALLABLE_KEYS = ("multi_agent.delegation.scorer", "multi_agent.delegation.sub_prompt", "mgrpo_verl.warmstart.demos")


# ------------------------------------------------------------------------------------------ paths


def _path_keys(config: DictConfig) -> list[str]:
    """Every key of :data:`PATH_LEAVES` / :data:`DATA_KEYS` the config may set."""
    keys = [f"actor_rollout_ref.{leaf}" for leaf in PATH_LEAVES] + list(DATA_KEYS)
    agents = OmegaConf.select(config, "multi_agent.agents", default=None)
    for name in (agents.keys() if isinstance(agents, DictConfig) else ()):
        keys += [f"multi_agent.agents.{name}.actor_rollout_ref.{leaf}" for leaf in PATH_LEAVES]
    return keys


def absolute_path(value: str, cwd: str) -> str:
    """``value`` made absolute against ``cwd`` (``~`` expanded); absolute paths unchanged."""
    value = os.path.expanduser(value)
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(cwd, value))


def absolute_callable(spec: str, cwd: str) -> str:
    """A ``file.py:function`` spec with its file made absolute against ``cwd``; ``module:function`` unchanged."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target.endswith(".py"):
        return spec
    return f"{absolute_path(target, cwd)}:{name}"


def absolute_paths(config: DictConfig, cwd: Optional[str] = None) -> dict[str, str]:
    """Rewrite, in ``config`` (resolved), every relative hook path to an absolute one against ``cwd`` (default: the
    current directory, the launch directory of ``main_ppo``): the keys of :data:`PATH_LEAVES` / :data:`DATA_KEYS`
    (verl resolves them in each process, against that process's working directory, or verl's own folder) and the
    file part of :data:`CALLABLE_KEYS`. A tool or agent-loop config that is not under ``cwd`` is left to verl's
    rule (``resolve_config_path``: next, verl's install folder), which :func:`check_user_hooks` applies. Returns
    key -> new value of what changed."""
    cwd = os.path.abspath(cwd or os.getcwd())
    changed = {}
    for key in _path_keys(config):
        value = OmegaConf.select(config, key, default=None)
        if not isinstance(value, str) or not value or value.startswith(("pkg://", "hdfs://")):
            continue
        new = absolute_path(value.removeprefix("file://"), cwd)
        if new != value and (key.endswith(FUNCTION_TOOLS) or key == "data.function_tool_path" or os.path.exists(new)):
            changed[key] = new
    for key in CALLABLE_KEYS:
        value = OmegaConf.select(config, key, default=None)
        if isinstance(value, str) and (new := absolute_callable(value, cwd)) != value:
            changed[key] = new
    for key, value in changed.items():
        OmegaConf.update(config, key, value, merge=False)
    return changed


# ------------------------------------------------------------------------------------------ imports


def _import_module(module: str, key: str, where: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name and (module == err.name or module.startswith(err.name + ".")):
            raise ValueError(
                f"{key}: {where}: no module named {err.name!r} on the Python path "
                f"(launch directory {os.getcwd()}): put "
                f"the folder that holds it on PYTHONPATH, or install it; Ray's workers import it the same way"
            ) from None
        raise ValueError(f"{key}: {where}: importing module {module!r} failed: {type(err).__name__}: {err}") from err
    except Exception as err:  # a module that raises while it is imported
        raise ValueError(f"{key}: {where}: importing module {module!r} failed: {type(err).__name__}: {err}") from err


def import_class(dotted: str, key: str, where: str, base: type, base_name: str, factory_ok: bool = False) -> Any:
    """The class ``package.module.Class`` (``where``: the file and entry that name it, for errors), which must be a
    subclass of ``base``; with ``factory_ok`` a function that builds one passes too (hydra's ``_target_``)."""
    module, _, name = str(dotted).rpartition(".")
    if not module or not name:
        raise ValueError(f"{key}: {where}: {dotted!r} is not a dotted 'package.module.ClassName'")
    obj = getattr(_import_module(module, key, where), name, None)
    if obj is None:
        raise ValueError(f"{key}: {where}: module {module!r} has no class {name!r}")
    if isinstance(obj, type) and issubclass(obj, base) or factory_ok and callable(obj) and not isinstance(obj, type):
        return obj
    raise ValueError(f"{key}: {where}: {dotted} is not a subclass of {base_name}"
                     + (" (nor a function that builds one)" if factory_ok else ""))


def _config_file(key: str, value: str) -> str:
    """verl's ``resolve_config_path`` of ``value``, refused naming ``key`` when there is no such file."""
    from verl.utils.import_utils import resolve_config_path

    try:
        path = resolve_config_path(value)
    except FileNotFoundError:
        path = None
    if path is None or not os.path.isfile(path):
        raise ValueError(f"{key}={value}: no such file (relative paths are resolved against the launch directory "
                         f"{os.getcwd()}, then verl's folder)")
    return path


def _load_yaml(key: str, path: str) -> Any:
    try:
        return OmegaConf.load(path)
    except Exception as err:
        raise ValueError(f"{key}={path}: not a readable YAML file: {type(err).__name__}: {err}") from err


def check_tool_config(key: str, value: str) -> list[type]:
    """Every tool of the verl tool config ``value`` (``tools: [{class_name, config: {type: native}, tool_schema}]``):
    the class imports and is a subclass of verl's ``BaseTool``, the type is one verl knows, the schema parses.
    Returns the classes."""
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema
    from verl.tools.tool_registry import ToolType

    path = _config_file(key, value)
    loaded = _load_yaml(key, path)
    tools = loaded.get("tools") if isinstance(loaded, DictConfig) else None
    if not isinstance(tools, ListConfig):
        raise ValueError(f"{key}={path}: a verl tool config needs a 'tools' list, got {tools!r}")
    classes = []
    for i, tool in enumerate(tools):
        where = f"{path}, tools[{i}]"
        class_name = tool.get("class_name") if isinstance(tool, DictConfig) else None
        if not class_name:
            raise ValueError(f"{key}: {where}: no class_name")
        where += f" (class_name {class_name})"
        classes.append(import_class(class_name, key, where, BaseTool, "verl's BaseTool (verl.tools.base_tool)"))
        kind = setting(tool, "config.type")
        try:
            ToolType(kind)
        except ValueError:
            raise ValueError(f"{key}: {where}: config.type {kind!r} is not one verl knows "
                             f"({', '.join(t.value for t in ToolType)})") from None
        schema = setting(tool, "tool_schema")
        if schema is not None:
            try:
                OpenAIFunctionToolSchema.model_validate(schema)
            except Exception as err:
                raise ValueError(f"{key}: {where}: tool_schema is not an OpenAI function schema: {err}") from err
    return classes


def check_function_tools(key: str, value: str) -> None:
    """verl's function-tool file ``value`` exists and executes (``load_function_tools_from_path``)."""
    from verl.tools.function_tool import load_function_tools_from_path

    if not os.path.isfile(value):
        raise ValueError(f"{key}={value}: no such file (relative paths are resolved against the launch directory "
                         f"{os.getcwd()})")
    try:
        load_function_tools_from_path(value)
    except Exception as err:
        raise ValueError(f"{key}={value}: loading the function tools failed: {type(err).__name__}: {err}") from err


def check_agent_loops(key: str, value: str) -> list[type]:
    """Every entry of verl's ``agent_loop_config_path`` file (``[{name, _target_: package.module.Class}]``): the
    class imports and is a subclass of verl's ``AgentLoopBase`` (or a function: verl instantiates ``_target_`` with
    hydra, and a factory is a ``_target_`` too). Returns them."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    path = _config_file(key, value)
    entries = _load_yaml(key, path)
    if not isinstance(entries, ListConfig):
        raise ValueError(f"{key}={path}: an agent loop config is a list of {{name, _target_}}, "
                         f"got {type(entries).__name__}")
    classes = []
    for i, entry in enumerate(entries):
        target = entry.get("_target_") if isinstance(entry, DictConfig) else None
        if not target or not (entry.get("name") if isinstance(entry, DictConfig) else None):
            raise ValueError(f"{key}: {path}, entry {i}: needs a name and a _target_ (package.module.Class)")
        where = f"{path}, entry {i} (name {entry.get('name')}, _target_ {target})"
        classes.append(import_class(target, key, where, AgentLoopBase, "verl's AgentLoopBase", factory_ok=True))
    return classes


def _sources(plan: RunPlan) -> list[tuple[str, str, str]]:
    """(key a user sets, leaf, value) of every hook path the run's processes read: the top-level keys and verl's
    dataset copies, then each model owner's full config (its own tools: the delegation loop loads a sub-agent's
    tools from its owner's config), each under the key that set it; duplicates once."""
    seen, out = set(), []

    def add(key: str, leaf: str, value: Any) -> None:
        if isinstance(value, str) and value and (leaf, value) not in seen:
            seen.add((leaf, value))
            out.append((key, leaf, value))

    config = plan.config
    for leaf in PATH_LEAVES:
        add(f"actor_rollout_ref.{leaf}", leaf, setting(config, f"actor_rollout_ref.{leaf}"))
    add("data.tool_config_path", TOOL_CONFIG, setting(config, "data.tool_config_path"))
    add("data.function_tool_path", FUNCTION_TOOLS, setting(config, "data.function_tool_path"))
    for agent, full in plan.agent_configs.items():
        for leaf in (TOOL_CONFIG, FUNCTION_TOOLS):
            add(plan.source_key(agent, f"actor_rollout_ref.{leaf}"), leaf, setting(full, f"actor_rollout_ref.{leaf}"))
    return out


CHECKS: dict[str, Callable[[str, str], Any]] = {
    TOOL_CONFIG: check_tool_config, FUNCTION_TOOLS: check_function_tools, AGENT_LOOPS: check_agent_loops,
}


def check_user_hooks(plan: RunPlan) -> None:
    """Import every user hook of the run in this process (no Ray) and refuse, naming the key and the file, a
    missing file, a missing module, a missing class or function, or a class of the wrong kind: the tool configs and
    function-tool files (top level, verl's dataset copies, each model owner's), the agent loops of
    ``agent_loop_config_path``, ``mgrpo_verl.warmstart.demos``, and (multi-agent) ``multi_agent.delegation.scorer``
    / ``sub_prompt``."""
    from mgrpo_verl.envs import relay
    from mgrpo_verl.warmstart import own

    for key, leaf, value in _sources(plan):
        CHECKS[leaf](key, value)
    demos = setting(plan.config, own.DEMOS_KEY)
    if demos is not None:
        own.load_demos(own.normalise_demos(demos))
    if plan.multi_agent is not None:
        delegation = plan.multi_agent.delegation
        relay.load_scorer(delegation.scorer)
        if delegation.sub_prompt:
            relay.load_sub_prompt(delegation.sub_prompt)
