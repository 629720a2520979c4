"""The warm start from your own demonstrations: any task, any agents (docs/warmstart.md, "Your own demonstrations").

What differs from the built-in ``relay_tools`` warm start (:mod:`~mgrpo_verl.warmstart.build`), whose SFT, cache and
publication it shares (:func:`~mgrpo_verl.warmstart.build.train_agent`, ``build_once``, ``file_records`` /
``verify``):

* the demonstrations are the user's: ``mgrpo_verl.warmstart.demos`` names ``demonstrations(n, seed, split)``, which
  returns one ``{agent: OpenAI chat messages}`` per episode; every episode and message is checked (:func:`check`)
  before anything trains, errors naming the function, split, episode, agent and message;
* the tools each agent is trained with are not written by the user: :func:`agent_tools` computes them from the run's
  plan as the rollout offers them (the agent's own verl tools, plus ``ask_<sub>`` per sub-agent for the main agent).
  The cache key cannot hash them (the ``mgrpo_warmstart`` resolver does not see the plan), so the manifest records
  them and a cached warm start whose tools differ is refused (:class:`StaleTools`), naming the folder to delete;
* the cache key hashes the demos file and the files of its folder it imports (:func:`local_imports`; not its data
  files): an edit of the demonstration code builds a new warm start, an edit of a script beside it does not;
* agents are named by the user and fine-tuned in the order listed, each from a base model or from the fine-tuned
  checkpoint of an agent listed before it; there is no held-out evaluation (RL's validation measures it).

Published as ``<root>/own-<key>/{<agent>/, data/<agent>/{train,val}.parquet, logs/, manifest.json}``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

from mgrpo_verl.trainer.checkpoints import fsync_tree
from mgrpo_verl.user_code import load_function
from mgrpo_verl.warmstart import build, sft
from mgrpo_verl.warmstart.demos import MESSAGES_KEY, TOOLS_KEY

#: Bump when the layout of the data, the SFT recipe or the manifest changes: part of every cache key.
VERSION = "1"

#: The config key that names the demonstrations (errors name it).
DEMOS_KEY = "mgrpo_verl.warmstart.demos"

#: Keys of ``mgrpo_verl.warmstart`` for this kind (``task`` must be null, ``out`` is the root).
SETTINGS = ("task", "demos", "agents", "n_train", "n_val", "data_seed", "lr", "batch_size", "out")
#: Keys of ``mgrpo_verl.warmstart.agents.<name>``.
AGENT_SETTINGS = ("base", "steps", "restart_steps", "lr")

ROLES = ("system", "user", "assistant", "tool")
#: Keys a message may carry (OpenAI's chat layout).
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass(frozen=True)
class AgentSpec:
    """One agent to fine-tune."""

    name: str
    #: a built-in model name (mgrpo_verl.envs.builtin.MODELS), a model directory, or the name of an agent listed
    #: before this one: its fine-tuned checkpoint (an agent's name wins over a built-in model of the same name)
    base: str
    sft: sft.SFTSettings = field(default_factory=sft.SFTSettings)
    #: SFT steps after a warm restart from the first run's checkpoint (lr decaying to 0, as the built-in main agent's)
    restart_steps: int = 0


@dataclass(frozen=True)
class OwnSpec:
    """Every input of a warm start from one's own demonstrations but the demos code (the cache key hashes both)."""

    #: ``/abs/file.py:function`` or ``module:function``
    demos: str
    agents: tuple[AgentSpec, ...]
    n_train: int = 256
    n_val: int = 32
    data_seed: int = 0
    device: str = "cpu"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.agents)


@dataclass(frozen=True)
class OwnWarmStart:
    """A published warm start: each agent's checkpoint folder."""

    directory: Path
    checkpoints: dict[str, Path]
    manifest: dict[str, Any]


class StaleTools(RuntimeError):
    """A cached warm start trained with other tools than the run's plan offers."""


# ------------------------------------------------------------------------------------------ settings


def _int(key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"mgrpo_verl.warmstart.{key} must be an integer >= {low}, got {value!r}")
    return value


def _lr(key: str, value: Any) -> float:
    try:
        lr = float(value)
    except (TypeError, ValueError):
        lr = -1.0
    if isinstance(value, bool) or not lr > 0:
        raise ValueError(f"mgrpo_verl.warmstart.{key} must be a positive number, got {value!r}")
    return lr


def normalise_demos(spec: Any, cwd: Optional[str] = None) -> str:
    """``file.py:function`` with the file made absolute against ``cwd`` (default: the current directory, the launch
    directory), or ``module:function`` as it is.

    Raises:
        ValueError: not of either form.
    """
    target, _, name = str(spec).rpartition(":")
    if not isinstance(spec, str) or not target or not name.isidentifier():
        raise ValueError(f"{DEMOS_KEY} must be 'file.py:function' or 'module:function', got {spec!r}")
    if target.endswith(".py"):
        target = os.path.normpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(target)))
    return f"{target}:{name}"


def spec_from_settings(settings: Mapping[str, Any], cwd: Optional[str] = None) -> OwnSpec:
    """The :class:`OwnSpec` of ``mgrpo_verl.warmstart`` (``settings``: a plain mapping, ``out`` and ``task`` removed);
    ``None`` values keep the defaults. Settings of the built-in kind left null (the ``task=relay_tools`` preset's,
    when a config composed on it brings its own demonstrations) are ignored.

    Raises:
        ValueError: an unknown key (here or under ``agents.<name>``), a built-in setting given a value, a missing
            ``base``, a base naming an agent not listed before, or a value of the wrong type.
    """
    settings = dict(settings)
    builtin = {f.name for f in fields(build.WarmStartSpec)} | {f.name for f in fields(sft.SFTSettings)}
    for key in sorted(set(settings) - set(SETTINGS)):
        if key in builtin and settings[key] is None:
            settings.pop(key)
        elif key in builtin:
            raise ValueError(f"mgrpo_verl.warmstart.{key} is a setting of the built-in warm start (task), not of "
                             f"your own demonstrations ({DEMOS_KEY}); known keys: {list(SETTINGS)}")
        else:
            raise ValueError(f"unknown warm-start setting mgrpo_verl.warmstart.{key}; known: {list(SETTINGS)}")
    shared = sft.SFTSettings()
    if settings.get("lr") is not None:
        shared = replace(shared, lr=_lr("lr", settings["lr"]))
    if settings.get("batch_size") is not None:
        shared = replace(shared, batch_size=_int("batch_size", settings["batch_size"], 1))
    agents_in = settings.get("agents")
    if not isinstance(agents_in, Mapping) or not agents_in:
        raise ValueError(f"mgrpo_verl.warmstart.agents must map each agent to fine-tune to its settings "
                         f"({', '.join(AGENT_SETTINGS)}), got {agents_in!r}")
    agents: list[AgentSpec] = []
    for name, given in agents_in.items():
        where = f"mgrpo_verl.warmstart.agents.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"{where}: agent names match [A-Za-z0-9_-]+ (as multi_agent.agents' do), got {name!r}")
        if given is not None and not isinstance(given, Mapping):
            raise ValueError(f"{where} must be a mapping of {list(AGENT_SETTINGS)}, got {given!r}")
        given = dict(given or {})
        unknown = sorted(set(given) - set(AGENT_SETTINGS))
        if unknown:
            raise ValueError(f"unknown setting {where}.{unknown[0]}; known: {list(AGENT_SETTINGS)}")
        base = given.get("base")
        if not isinstance(base, str) or not base:
            raise ValueError(f"{where}.base is required: a built-in model name, a model directory, or an agent "
                             f"listed before {name!r}")
        if base in agents_in and base not in {a.name for a in agents}:
            raise ValueError(f"{where}.base: agent {base!r} is not listed before {name!r}; agents are fine-tuned "
                             f"in the order listed, so a base agent must come first")
        run = shared
        if given.get("steps") is not None:
            run = replace(run, steps=_int(f"agents.{name}.steps", given["steps"], 0))
        if given.get("lr") is not None:
            run = replace(run, lr=_lr(f"agents.{name}.lr", given["lr"]))
        restart = _int(f"agents.{name}.restart_steps", given.get("restart_steps") or 0, 0)
        agents.append(AgentSpec(str(name), base, run, restart))
    counts = {k: _int(k, settings[k], low) for k, low in (("n_train", 1), ("n_val", 0), ("data_seed", 0))
              if settings.get(k) is not None}  # fmt: skip
    return OwnSpec(normalise_demos(settings.get("demos"), cwd), tuple(agents), **counts)


# ------------------------------------------------------------------------------------------ the demos code


def _demos_file(spec: str) -> Path:
    """The file that defines the demos function (a module's, found without importing it)."""
    target, _, _ = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
    else:
        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError) as err:
            raise ValueError(f"{DEMOS_KEY}={spec}: module {target!r} not found: {err}") from None
        if found is None or not found.origin or not Path(found.origin).is_file():
            raise ValueError(f"{DEMOS_KEY}={spec}: no module {target!r} on the Python path (launch directory "
                             f"{os.getcwd()})")
        path = Path(found.origin)
    if not path.is_file():
        raise ValueError(f"{DEMOS_KEY}={spec}: no such file {path} (a relative path is resolved against the launch "
                         f"directory)")
    return path


def demos_code(spec: str) -> dict[str, Any]:
    """What the cache key hashes of the demonstrations' code: the function's name, its file's name, and the sha256 of
    that file and of every file of its folder it imports (:func:`local_imports`), by path relative to the folder (not
    the folder's path: a copied project finds its cache)."""
    path = _demos_file(spec)
    return {
        "function": spec.rpartition(":")[2],
        "file": path.name,
        "py": {p.relative_to(path.parent).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in local_imports(path)},
    }


def local_imports(path: Path) -> list[Path]:
    """``path`` and the ``.py`` files under its folder that it imports, directly or through each other, read from the
    source (``import x``, ``from x import y``, ``from . import y``, ``from mypkg.x import y`` in a module of
    ``mypkg``; nothing is executed). A script beside the demonstrations that they do not import (a launcher, a
    report) is not among them, so editing it keeps the cache.
    Not seen: imports built at run time (``importlib.import_module(name)``) and data files."""
    import ast

    root, found, todo = path.parent, [], [path]
    while todo:
        file = todo.pop()
        if file in found:
            continue
        found.append(file)
        try:
            tree = ast.parse(file.read_bytes(), filename=str(file))
        except (SyntaxError, ValueError):
            continue  # loading the file reports it, naming the file
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [base] if base else []
                names += [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            else:
                continue
            for name in names:
                # every tail of the dotted name too: in a package's module, ``from mypkg.prompts import X`` names the
                # sibling ``prompts.py`` (one file too many only hashes more; one too few would keep a stale cache)
                parts = name.split(".")
                for i in range(len(parts)):
                    for k in range(i + 1, len(parts) + 1):
                        for candidate in (root.joinpath(*parts[i:k]).with_suffix(".py"),
                                          root.joinpath(*parts[i:k], "__init__.py")):
                            if candidate.is_file():
                                todo.append(candidate)
    return sorted(found)


def load_demos(spec: str) -> Callable[..., Any]:
    """The demonstrations function of ``spec`` (``file.py:function`` or ``module:function``), imported.

    Raises:
        ValueError: naming :data:`DEMOS_KEY`, the file or module and the function: no such file or module, an
            import that fails, or a name that is not callable.
    """
    _demos_file(spec)  # a module's too: the cache key hashes its file
    return load_function(spec, DEMOS_KEY)


# ------------------------------------------------------------------------------------------ paths


def base_models(spec: OwnSpec) -> dict[str, tuple[str, str]]:
    """(model dir, tokenizer dir) per agent of the first model of its base chain: an agent based on another starts
    from that agent's checkpoint, whose architecture is that agent's base's (the launcher's checks read it there
    before it is built)."""
    out: dict[str, tuple[str, str]] = {}
    for agent in spec.agents:
        out[agent.name] = out[agent.base] if agent.base in out else build.base_model(agent.base)
    return out


def cache_key(spec: OwnSpec) -> str:
    """Hash of the settings, each agent's base (its model's identity, or the agent it starts from), :data:`VERSION`
    and the demos code (:func:`demos_code`); not the tools (:class:`StaleTools`)."""
    from mgrpo_verl.models.tiny import content_key

    bases, names = base_models(spec), set()
    idents = {}
    for agent in spec.agents:
        idents[agent.name] = (f"agent:{agent.base}" if agent.base in names
                              else [build.base_identity(p) for p in bases[agent.name]])
        names.add(agent.name)
    settings = {k: v for k, v in asdict(spec).items() if k != "demos"}  # its folder's path is not hashed
    return content_key({"v": VERSION, "spec": settings, "bases": idents, "demos": demos_code(spec.demos)})


def target_dir(spec: OwnSpec, root: Optional[str | Path] = None) -> Path:
    """Where the warm start of ``spec`` is published under ``root`` (default ``<cache>/warmstart``), built or not."""
    return Path(root or build.default_root()) / f"own-{cache_key(spec)}"


def published(target: Path, tools: Optional[Mapping[str, list[dict]]] = None) -> Optional[OwnWarmStart]:
    """The warm start published at ``target`` once :func:`~mgrpo_verl.warmstart.build.verify` passes and, when
    ``tools`` is given, its recorded tools are those; ``None`` when there is none.

    Raises:
        WarmStartCorrupt: a file differs from the manifest's record.
        StaleTools: an agent was trained with other tools, naming it and the folder to delete.
    """
    manifest_path = target / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    build.verify(target, manifest)
    for agent, schemas in json.loads(json.dumps(dict(tools or {}))).items():
        recorded = manifest["tools"].get(agent)
        if recorded != schemas:
            names = [s.get("function", {}).get("name") for s in schemas]
            was = None if recorded is None else [s.get("function", {}).get("name") for s in recorded]
            raise StaleTools(
                f"warm start {target}: agent {agent!r} was fine-tuned with other tools than the run offers it now "
                f"(the run: {names}; the warm start: {was}; or their schemas differ). The cache key cannot see the "
                f"tools; delete {target} to build it again with the run's (rm -rf {target})."
            )
    return OwnWarmStart(target, {a: target / a for a in manifest["agents"]}, manifest)


# ------------------------------------------------------------------------------------------ tools


def _schema(tool: Any) -> dict[str, Any]:
    """A tool's schema as verl's tool loop hands it to the chat template."""
    return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)


def agent_tools(plan: Any, agents: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The tool schemas each of ``agents`` is offered in the run of ``plan`` (a :class:`~mgrpo_verl.config.plan
    .RunPlan`), as the rollout offers them: the tools of its model owner's config
    (``actor_rollout_ref.rollout.multi_turn.tool_config_path`` / ``function_tool_path``, verl's ``load_all_tools``),
    and for the main agent ``ask_<sub>`` for each sub-agent after them, in the plan's order (what
    ``ToolDelegationLoop`` appends). A run of one model (no ``multi_agent``) has one agent, ``main``. MAGRPO's
    cooperative loop (``multi_agent.algorithm: magrpo``) offers no tools: every agent gets none.

    Raises:
        ValueError: an agent the run does not have, one that shares another's model (fine-tune that one), or a main
            agent tool with the name of a delegation tool.
    """
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.import_utils import resolve_config_path

    from mgrpo_verl.agent_loops.tool_delegation import DelegationTool
    from mgrpo_verl.config import setting

    ma = plan.multi_agent
    main, subs = (ma.main, ma.sub_agents) if ma is not None else ("main", ())
    known = list(ma.agents) if ma is not None else ["main"]
    out = {}
    for agent in agents:
        if agent not in known:
            raise ValueError(f"mgrpo_verl.warmstart.agents.{agent}: the run has no agent {agent!r}; its agents are "
                             f"{known}")
        owner = ma.owner_of(agent) if ma is not None else agent
        if owner != agent:
            raise ValueError(f"mgrpo_verl.warmstart.agents.{agent}: {agent!r} plays {owner!r}'s model "
                             f"(multi_agent.agents.{agent}.share_model_with): fine-tune {owner!r} instead")
        if ma is not None and ma.algorithm == "magrpo":
            out[agent] = []  # CooperativeLoop renders every prompt without tools
            continue
        config = plan.agent_configs[agent] if ma is not None else plan.config
        paths = [setting(config, f"actor_rollout_ref.rollout.multi_turn.{k}", None)
                 for k in ("tool_config_path", "function_tool_path")]  # fmt: skip
        tools = load_all_tools(*(resolve_config_path(p) if p else None for p in paths))
        schemas = [_schema(tool) for tool in tools]
        if agent == main:
            own = {tool.name for tool in tools}
            for sub in subs:
                delegation = DelegationTool.for_agent(sub)
                if delegation.name in own:
                    raise ValueError(f"the main agent's own tools already have a tool named {delegation.name!r}, the "
                                     f"delegation tool of sub-agent {sub!r}; rename that tool")
                schemas.append(_schema(delegation))
        out[agent] = schemas
    return out


# ------------------------------------------------------------------------------------------ the demonstrations


def _tool_call(call: Any, offered: list[str], where: str) -> dict[str, Any]:
    """One tool call in verl's layout, ``arguments`` a JSON string (a dict is written as the chat template's
    ``tojson`` writes it: ``json.dumps`` with ``ensure_ascii=False``)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or call.get("type", "function") != "function":
        raise ValueError(f"{where}: a tool call is {{'type': 'function', 'function': {{'name': ..., "
                         f"'arguments': ...}}}}, got {call!r}")
    name, arguments = function.get("name"), function.get("arguments", {})
    if name not in offered:
        raise ValueError(f"{where}: a call to {name!r}, a tool this agent is not offered in the run; its tools: "
                         f"{offered}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as err:
            raise ValueError(f"{where}: the arguments of {name} are not JSON: {err}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}: the arguments of {name} must be a JSON object, got {arguments!r}")
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _message(message: Any, offered: list[str], where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ValueError(f"{where}: a message is a dict with 'role' and 'content', got {type(message).__name__}")
    unknown = sorted(set(message) - set(MESSAGE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; a message has {list(MESSAGE_KEYS)}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"{where}: unknown role {role!r}; roles are {list(ROLES)}")
    out = dict(message)
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise ValueError(f"{where}: tool_calls must be a list, on an assistant message, got {calls!r} on {role}")
        out["tool_calls"] = [_tool_call(c, offered, f"{where}, tool call {k}") for k, c in enumerate(calls)]
    content = message.get("content")
    if role == "assistant" and not content and not calls:
        raise ValueError(f"{where}: an assistant turn without content nor tool_calls")
    if content is None and role == "assistant":
        out["content"] = ""
    elif not isinstance(content, str):
        raise ValueError(f"{where}: content must be a string, got {type(content).__name__}")
    return out


def check(episodes: Any, tools: Mapping[str, list[dict]], where: str) -> dict[str, list[tuple[int, list[dict]]]]:
    """``demonstrations(...)``'s result, checked and normalised: per agent of ``tools`` (the agents fine-tuned),
    ``(episode index, messages)``. ``where`` names the call (the function, its arguments) in errors.

    Raises:
        ValueError: not a list of dicts, an agent not fine-tuned, a conversation that is not a non-empty list or has
            no assistant turn, two tool responses in a row, a bad message (:data:`MESSAGE_KEYS`, :data:`ROLES`, an
            assistant turn without content nor tool calls, a call to a tool the agent is not offered), or an agent
            with no demonstration at all.
    """
    if not isinstance(episodes, list):
        raise ValueError(f"{where} returned {type(episodes).__name__}, not a list of episodes "
                         f"({{agent: messages}} each)")
    offered = {agent: [s["function"]["name"] for s in schemas] for agent, schemas in tools.items()}
    out: dict[str, list[tuple[int, list[dict]]]] = {agent: [] for agent in tools}
    for i, episode in enumerate(episodes):
        if not isinstance(episode, dict):
            raise ValueError(f"{where}: episode {i} is {type(episode).__name__}, not a dict agent -> messages")
        for agent, messages in episode.items():
            here = f"{where}: episode {i}, agent {agent!r}"
            if agent not in tools:
                raise ValueError(f"{here}: not an agent fine-tuned here (mgrpo_verl.warmstart.agents: {list(tools)})")
            if not isinstance(messages, list) or not messages:
                raise ValueError(f"{here}: its conversation must be a non-empty list of messages, got {messages!r}")
            checked = [_message(m, offered[agent], f"{here}, message {j}") for j, m in enumerate(messages)]
            if not any(m["role"] == "assistant" for m in checked):
                raise ValueError(f"{here}: no assistant turn (the SFT trains on assistant turns only)")
            for j in range(1, len(checked)):
                if checked[j - 1]["role"] == checked[j]["role"] == "tool":
                    # verl's MultiTurnSFTDataset renders each message on its own, the chat template merges the
                    # responses of one turn's calls into one block: verl refuses the row with an assertion
                    raise ValueError(f"{here}, messages {j - 1}-{j}: two tool responses in a row (calls made in "
                                     f"one turn). verl's SFT dataset cannot render them as the rollout does: "
                                     f"demonstrate one tool call per assistant turn")
            out[agent].append((i, checked))
    for agent, rows in out.items():
        if not rows:
            raise ValueError(f"{where}: agent {agent!r} has no demonstration at all (mgrpo_verl.warmstart.agents "
                             f"lists it: give it some, or remove it there)")
    return out


def write_datasets(
    directory: Path, spec: OwnSpec, tools: Mapping[str, list[dict]], demonstrations: Callable[..., Any]
) -> tuple[dict[str, dict[str, Optional[Path]]], dict[str, dict[str, int]]]:
    """``<directory>/<agent>/{train,val}.parquet`` in verl's multi-turn layout (``messages``, ``tools`` as JSON text:
    :mod:`mgrpo_verl.warmstart.dataset`) from ``demonstrations(n, seed, split)``; val is None with ``n_val`` 0.
    Returns ``{agent: {split: path}}`` and ``{agent: {split: rows}}`` (an episode may leave an agent out)."""
    import pandas as pd

    paths: dict[str, dict[str, Optional[Path]]] = {agent: {"train": None, "val": None} for agent in spec.names}
    counts: dict[str, dict[str, int]] = {agent: {"train": 0, "val": 0} for agent in spec.names}
    for split, n in (("train", spec.n_train), ("val", spec.n_val)):
        if n == 0:
            continue
        where = f"{DEMOS_KEY}={spec.demos} called with (n={n}, seed={spec.data_seed}, split={split!r})"
        try:
            episodes = demonstrations(n, spec.data_seed, split)
        except Exception as err:
            raise RuntimeError(f"{where} raised {type(err).__name__}: {err}") from err
        for agent, rows in check(episodes, tools, where).items():
            (directory / agent).mkdir(parents=True, exist_ok=True)
            path = directory / agent / f"{split}.parquet"
            pd.DataFrame([{MESSAGES_KEY: messages, TOOLS_KEY: json.dumps(tools[agent]), "split": split, "index": i}
                          for i, messages in rows]).to_parquet(path)  # fmt: skip
            paths[agent][split], counts[agent][split] = path, len(rows)
    return paths, counts


# ------------------------------------------------------------------------------------------ the build


def warm_start(spec: OwnSpec, tools: Mapping[str, list[dict]], root: Optional[str | Path] = None,
               log=print) -> OwnWarmStart:
    """The warm start of ``spec`` with each agent's ``tools`` (:func:`agent_tools`): the published one when it
    exists (its tools checked: :class:`StaleTools`), else built and published now."""
    from mgrpo_verl.models.tiny import build_once

    missing = [a for a in spec.names if a not in tools]
    if missing:
        raise ValueError(f"no tools given for agents {missing} (agent_tools(plan, spec.names) computes them)")
    tools = {agent: tools[agent] for agent in spec.names}
    target = target_dir(spec, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    found = published(target, tools)
    if found is not None:
        log(f"warm start: cached at {target}")
        return found
    demonstrations = load_demos(spec.demos)  # before the lock: a bad spec waits for no one
    with build.terminate_as_exit():
        build_once(target, lambda tmp: _build(spec, tools, demonstrations, tmp, target, log))
    result = published(target, tools)
    assert result is not None
    return result


def _build(spec: OwnSpec, tools: Mapping[str, list[dict]], demonstrations: Callable[..., Any], tmp: Path,
           target: Path, log) -> None:
    """Build everything into ``tmp`` (renamed to ``target`` by the caller); paths in the manifest are final."""
    start = time.monotonic()
    log(f"warm start: your demonstrations ({spec.demos}, {spec.n_train} train / {spec.n_val} val) -> {tmp / 'data'}")
    data, counts = write_datasets(tmp / "data", spec, tools, demonstrations)
    for agent in spec.agents:  # verl's SFT dataloaders drop an incomplete last batch (drop_last=True)
        train, val = counts[agent.name]["train"], counts[agent.name]["val"]
        if agent.sft.steps + agent.restart_steps > 0 and train < agent.sft.batch_size:
            raise ValueError(f"warm start: agent {agent.name!r} has {train} train demonstrations, fewer than "
                             f"mgrpo_verl.warmstart.batch_size ({agent.sft.batch_size}): verl's SFT trainer drops an "
                             f"incomplete batch, so it would train on none; raise n_train or lower batch_size")
        if 0 < val < agent.sft.batch_size:
            log(f"warm start: agent {agent.name!r} has {val} val demonstrations, fewer than the batch "
                f"({agent.sft.batch_size}): verl's SFT computes no val loss for it")
    (tmp / "logs").mkdir()
    bases = base_models(spec)
    agents: dict[str, Any] = {}
    for agent in spec.agents:  # in the order listed: an agent may start from an earlier one's checkpoint
        if agent.base in agents:
            model_dir = tokenizer_dir = str(tmp / agent.base)
            base_label = str(target / agent.base)
        else:
            model_dir, tokenizer_dir = bases[agent.name]
            base_label = model_dir
        figures = build.train_agent(agent.name, model_dir, tokenizer_dir, base_label, data[agent.name], agent.sft,
                                    agent.restart_steps, tmp, spec.device, log)  # fmt: skip
        agents[agent.name] = {
            "base_model": base_label,
            "tokenizer": tokenizer_dir if tokenizer_dir != model_dir else base_label,
            "sft_steps": agent.sft.steps,
            "restart_steps": agent.restart_steps,
            "checkpoint": str(target / agent.name),
            "demonstrations": counts[agent.name],
            **figures,
        }
    shutil.rmtree(tmp / "sft", ignore_errors=True)  # the published copies are all that is needed
    manifest = {
        "version": VERSION,
        "kind": "own",
        "spec": asdict(spec),
        "demos": demos_code(spec.demos),
        "directory": str(target),
        "agents": agents,
        "tools": dict(tools),
        "seconds": round(time.monotonic() - start, 1),
        "files": build.file_records(tmp),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    fsync_tree(tmp)  # on disk before the caller's rename publishes it
