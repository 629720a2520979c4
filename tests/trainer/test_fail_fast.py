"""Bad values of the default config are refused by ``mgrpo_verl.main_ppo.run`` before Ray starts, in seconds,
with a message naming the key and the value (without the checks each one failed 50-210 s later, inside Ray).

Each case composes ``mgrpo_trainer`` with ``task=relay`` (named: the cases rely on the relay, whatever the
default task) with Hydra as ``python -m mgrpo_verl.main_ppo`` does, runs ``run(config)`` with verl's ``run_ppo``
replaced by a sentinel (reaching it means every check passed), and asserts that Ray was never initialized. The
time bound is generous (10 s; the checks themselves take well under a second once the modules are imported)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from hydra import compose, initialize_config_module

import verl.trainer.main_ppo  # imported once here, so that the timed calls measure the checks, not the imports

from mgrpo_verl import main_ppo
from mgrpo_verl.launcher.resolvers import register_resolvers
from mgrpo_verl.config.plan import RunPlan, build_plan
from mgrpo_verl.launcher.preflight import check_model_paths

register_resolvers()

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 10.0
SUB_SIDE = ("multi_agent.decoupled.role=sub", "trainer.val_before_train=false", "trainer.test_freq=-1")


class ReachedRay(Exception):
    """verl's run_ppo was called: every check before Ray passed."""


def _compose(*overrides: str, tmp_path: Path, name: str = "mgrpo_trainer"):
    task = ["task=relay"] if name == "mgrpo_trainer" else []
    with initialize_config_module("mgrpo_verl.config", version_base=None):
        return compose(name, overrides=[*task, f"trainer.default_local_dir={tmp_path}", *overrides])


@pytest.fixture
def run(monkeypatch, tmp_path):
    """``run(*overrides)``: compose and run; returns the exception raised and the seconds ``run`` took."""

    def reached(*args, **kwargs):
        raise ReachedRay()

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", reached)
    inits = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: inits.append((a, k)))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id passes our checks; nothing may download it

    def call(*overrides: str, name: str = "mgrpo_trainer") -> tuple[BaseException, float]:
        config = _compose(*overrides, tmp_path=tmp_path, name=name)
        ray_before = ray.is_initialized()  # an earlier test of this process may have left Ray up
        start = time.monotonic()
        with pytest.raises(BaseException) as info:
            main_ppo.run(config)
        seconds = time.monotonic() - start
        assert not inits, "the run called ray.init before refusing"
        assert ray.is_initialized() == ray_before, "the run changed Ray's state (a caller's Ray stays up)"
        return info.value, seconds

    return call


def _refused(run, *overrides: str, names: tuple[str, ...], config_name: str = "mgrpo_trainer") -> str:
    err, seconds = run(*overrides, name=config_name)
    assert isinstance(err, ValueError), f"{overrides}: expected a ValueError before Ray, got {err!r}"
    message = str(err)
    for name in names:
        assert name in message, f"{name!r} not in {message!r}"
    assert seconds < BOUND_S, f"{overrides}: refused after {seconds:.1f} s"
    return message


@pytest.mark.parametrize("n", ["0", "-2"])
def test_rollout_n_below_one(run, n):
    _refused(run, f"actor_rollout_ref.rollout.n={n}", names=("actor_rollout_ref.rollout.n", n, ">= 1"))


def test_rollout_n_one_is_a_warning_not_an_error(run, caplog):
    """n=1: verl's GRPO gives a group of one mean 0 and std 1 (advantage = raw score), a valid if weak setting,
    so it is allowed, with a warning (MAGRPO even requires n=1)."""
    with caplog.at_level(logging.WARNING, logger="mgrpo_verl.launcher.preflight"):
        err, _ = run("actor_rollout_ref.rollout.n=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                     *MICRO_BATCHES_OF_4)
    assert isinstance(err, ReachedRay), err
    assert any("rollout.n=1" in r.getMessage() and "raw score" in r.getMessage() for r in caplog.records)


#: micro-batches that divide the 4 rows per GPU of a run with 4 prompts and n=1
MICRO_BATCHES_OF_4 = ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")


@pytest.mark.parametrize("n, per_gpu", [("1", 4), ("2", 8)])
def test_rollout_n_that_leaves_a_partial_micro_batch(run, n, per_gpu):
    """task=relay's 4 prompts x n rows per model, log-prob micro-batches of 16: with n=1 or 2 verl's workers
    asserted "data size must be divisible by ... micro_batch_size_per_gpu" at step 1, naming no key (issue 29)."""
    _refused(run, f"actor_rollout_ref.rollout.n={n}",
             names=("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu is 16", f"{per_gpu} rows per GPU",
                    f"a divisor of {per_gpu}"))


def test_single_agent_rollout_n_that_leaves_a_partial_micro_batch(run):
    """``--config-name single_agent``: 8 prompts x n rows on one GPU, micro-batches of 16. n=1 reached Ray and
    verl's step-1 assertion; the plan's rule now covers the one model too, naming the key. n=2 (16 rows) divides
    the micro-batch and reaches Ray, as the default n=8 does."""
    _refused(run, "actor_rollout_ref.rollout.n=1", config_name="single_agent",
             names=("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu is 16", "the model gets",
                    "8 rows per GPU", "a divisor of 8"))
    _refused(run, "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", config_name="single_agent",
             names=("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is 32", "one mini-batch", "16 rows per GPU"))
    for ok in ("actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.n=8"):
        err, _ = run(ok, name="single_agent")
        assert isinstance(err, ReachedRay), (ok, err)


def test_shared_placement_on_two_gpus_leaves_a_partial_micro_batch_and_on_one_reaches_ray(run):
    """placement=shared gives every agent's model all the GPUs: on task=relay's 2 logical GPUs each gets 16 / 2 = 8
    rows per GPU, under the micro-batch of 16 (the step-1 assertion the issue reported, traced); the one-GPU layout
    (trainer.n_gpus_per_node=1, which trains: measured 2026-11-27, 1 step, exit 0) passes."""
    _refused(run, "multi_agent.placement=shared",
             names=("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu is 16", "over 2 GPU(s)", "divisor of 8"))
    err, _ = run("multi_agent.placement=shared", "trainer.n_gpus_per_node=1")
    assert isinstance(err, ReachedRay), err


def test_an_agents_micro_batch_override_is_named(run):
    _refused(run, "+multi_agent.agents.sub.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
             names=("multi_agent.agents.sub.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is 3", "'sub'",
                    "divisor of 16"))


@pytest.mark.parametrize("override, key, value", [
    ("trainer.total_training_steps=-5", "trainer.total_training_steps", "-5"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps", "0"),
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr", "-1"),
    ("data.max_response_length=0", "data.max_response_length", "0"),
    ("+multi_agent.agents.sub.actor_rollout_ref.actor.optim.lr=-0.1", "multi_agent.agents.sub.actor_rollout_ref.actor.optim.lr",
     "-0.1"),
    ("+multi_agent.agents.sub.actor_rollout_ref.model.lora_rank=-4", "multi_agent.agents.sub.actor_rollout_ref.model.lora_rank",
     "-4"),
])
def test_values_verl_misuses_are_refused_naming_the_key(run, override, key, value):
    """Each of these trained (a negative horizon, a negative per-agent LoRA rank: the full model) or failed inside a
    worker minutes later (issue 29)."""
    _refused(run, override, names=(f"{key} must be", f"got {value}"))


def test_a_logger_list_without_file_is_refused(run):
    """The step lines and the summary follow verl's file logger; without it a run showed nothing after "starting Ray"
    for minutes (trainer.logger=[console], 2026-12-06). With it beside another logger the run reaches Ray."""
    _refused(run, "trainer.logger=[console]", names=("trainer.logger must include 'file'", "['console']"))
    err, _ = run("trainer.logger=[file,console]")
    assert isinstance(err, ReachedRay), err


def test_a_typo_is_refused_before_the_warm_start_is_built(run, monkeypatch):
    """task=relay_tools on a machine without its warm start: a bad value is refused at once, the SFT (minutes) never
    starts; with no bad value the launcher reaches the warm-start stage, after every check and before Ray."""
    from mgrpo_verl.warmstart import build

    class ReachedWarmStart(Exception):
        pass

    def fake_warm_start(*args, **kwargs):
        raise ReachedWarmStart()

    monkeypatch.setattr(build, "cached", lambda *a, **k: None)  # as on a fresh machine
    monkeypatch.setattr(build, "warm_start", fake_warm_start)
    _refused(run, "task=relay_tools", "multi_agent.d_max=autox", names=("multi_agent.d_max", "autox"))
    err, _ = run("task=relay_tools")
    assert isinstance(err, ReachedWarmStart), err


def test_default_config_reaches_ray(run):
    """The control: the shipped config (task=relay) passes every check (so the refusals below come from the bad values)."""
    err, seconds = run()
    assert isinstance(err, ReachedRay), err
    assert seconds < BOUND_S


def test_lora_agents_on_one_interpolated_base_reach_ray(run):
    """The sub-agent's base written as ``${actor_rollout_ref.model.path}`` (two adapters, one base) passes every
    check; checked unresolved, one pre-flight found it recursive (CI of stop 26)."""
    err, _ = run("actor_rollout_ref.model.lora_rank=4",
                 "multi_agent.agents.sub.actor_rollout_ref.model.path=${actor_rollout_ref.model.path}",
                 "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=${actor_rollout_ref.model.tokenizer_path}")
    assert isinstance(err, ReachedRay), err


def test_missing_model_path(run):
    _refused(run, "actor_rollout_ref.model.path=/nonexistent/model",
             names=("actor_rollout_ref.model.path", "/nonexistent/model", "no such local path"))


def test_missing_tokenizer_path(run):
    _refused(run, "actor_rollout_ref.model.tokenizer_path=/nonexistent/tokenizer",
             names=("actor_rollout_ref.model.tokenizer_path", "/nonexistent/tokenizer"))


def test_missing_model_path_of_one_agent(run):
    _refused(run, "multi_agent.agents.sub.actor_rollout_ref.model.path=/nonexistent/sub",
             names=("multi_agent.agents.sub.actor_rollout_ref.model.path", "/nonexistent/sub"))


def test_missing_tokenizer_path_of_one_agent(run):
    _refused(run, "multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path=/nonexistent/subtok",
             names=("multi_agent.agents.sub.actor_rollout_ref.model.tokenizer_path", "/nonexistent/subtok"))


def test_hub_id_passes_without_contacting_the_hub(run):
    """``org/name`` that is not a local path is a Hugging Face repo id verl may download: allowed through (with
    HF_HUB_OFFLINE=1 set, so that nothing before Ray could have downloaded it)."""
    err, _ = run("actor_rollout_ref.model.path=someorg/some-model",
                 "multi_agent.agents.sub.actor_rollout_ref.model.path=someorg/other-model")
    assert isinstance(err, ReachedRay), err


def test_model_path_rules(tmp_path):
    """Directly: local paths that exist, ``hdfs://`` and repo ids pass; a trailing '/', a missing absolute or
    relative path with more than one '/', and '~' (which verl does not expand) are refused."""
    from omegaconf import OmegaConf

    def check(path, tokenizer=None):
        check_model_paths(RunPlan(OmegaConf.create({"actor_rollout_ref": {"model": {"path": path, "tokenizer_path": tokenizer}}})))

    for ok in (str(tmp_path), "gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "hdfs://cluster/models/x"):
        check(ok)
    for bad in ("/nonexistent/model", "models/nested/too/deep", f"{tmp_path}/", "~/models/x", "", None, "a b/c"):
        with pytest.raises(ValueError, match="actor_rollout_ref.model.path"):
            check(bad)
    with pytest.raises(ValueError, match="actor_rollout_ref.model.tokenizer_path='/nope'"):
        check(str(tmp_path), "/nope")


def test_unknown_key_in_agent_override(run):
    message = _refused(run, "+multi_agent.agents.sub.actor_rollout_ref.rollout.temprature=0.5",
                       names=("multi_agent.agents.sub.actor_rollout_ref.rollout.temprature", "0.5"))
    assert "did you mean 'temperature'" in message


def test_unknown_nested_key_in_agent_override(run):
    """Nested sections are checked against their own dataclass (``actor.optim`` -> verl's optimizer config)."""
    _refused(run, "+multi_agent.agents.main.actor_rollout_ref.actor.optim.learning_rate=1e-5",
             names=("multi_agent.agents.main.actor_rollout_ref.actor.optim.learning_rate", "1e-05"))
    _refused(run, "+multi_agent.agents.sub.actor_rollout_ref.modle.path=x",
             names=("multi_agent.agents.sub.actor_rollout_ref.modle", "did you mean 'model'"))


def test_known_keys_in_agent_override_pass(tmp_path):
    """Keys verl has (a dataclass field, a key of the top-level section, a free-form dict's entries) pass."""
    config = _compose(
        "+multi_agent.agents.sub.actor_rollout_ref.rollout.temperature=0.7",
        "+multi_agent.agents.sub.actor_rollout_ref.actor.optim.lr=1e-5",
        "+multi_agent.agents.sub.actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "+multi_agent.agents.sub.actor_rollout_ref.rollout.custom.anything=1",
        tmp_path=tmp_path,
    )
    build_plan(config)


def test_every_top_level_key_is_accepted_as_an_agent_override(tmp_path):
    """No false positives: each leaf of the composed top-level ``actor_rollout_ref`` (420-odd keys, some of them
    not fields of verl's dataclasses, e.g. ``ref.log_prob_micro_batch_size``), and the whole section at once,
    pass as one agent's override."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from mgrpo_verl.config.rules import check_override_keys

    config = _compose(tmp_path=tmp_path)
    top = OmegaConf.to_container(config.actor_rollout_ref, resolve=False)

    def leaves(node, prefix=()):
        for key, value in node.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, prefix + (key,))
            else:
                yield prefix + (key,), value

    count = 0
    for path, value in leaves(top):
        override = cursor = {}
        for key in path[:-1]:
            cursor = cursor.setdefault(key, {})
        cursor[path[-1]] = value
        check_override_keys(config, [SimpleNamespace(name="sub", actor_rollout_ref=override)])
        count += 1
    check_override_keys(config, [SimpleNamespace(name="sub", actor_rollout_ref=top)])
    assert count > 100


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "sqlite:///nonexistent/dir/x.db"])
def test_unreachable_store(run, url):
    _refused(run, *SUB_SIDE, f"multi_agent.decoupled.store={url}", names=("multi_agent.decoupled.store", url))


def test_redis_that_never_answers(run, monkeypatch):
    """A server that accepts the connection but never replies: refused after the probe's ~2 s time-out, not after
    redis-py's default (none: it would wait for ever). With a password, so that the probe is what refuses it (every
    Redis URL needs one: without it the store is refused before any connection)."""
    pytest.importorskip("redis")
    monkeypatch.setenv("MGRPO_REDIS_PASSWORD", "x" * 16)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or writes
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        _refused(run, *SUB_SIDE, f"multi_agent.decoupled.store={url}", names=("multi_agent.decoupled.store", url))


def test_a_decoupled_side_without_its_shared_secret_is_refused_before_ray(run, tmp_path, monkeypatch):
    """Both sides need the secret the sub side's service checks on every request (docs/decoupled.md); without
    one the launcher refuses naming the key and the variable, with one (a file) the side reaches Ray."""
    from mgrpo_verl.agent_loops.remote_sub import SECRET_ENV

    monkeypatch.delenv(SECRET_ENV, raising=False)
    store = f"multi_agent.decoupled.store=sqlite://{tmp_path}/stats.db"
    _refused(run, *SUB_SIDE, store, names=("multi_agent.decoupled.secret_file", SECRET_ENV))
    (tmp_path / "secret").write_text("x" * 32)
    err, _ = run(*SUB_SIDE, store, f"multi_agent.decoupled.secret_file={tmp_path / 'secret'}")
    assert isinstance(err, ReachedRay), err


def test_reachable_sqlite_store_passes(run, tmp_path):
    err, _ = run(*SUB_SIDE, f"multi_agent.decoupled.store=sqlite://{tmp_path}/stats.db")
    assert isinstance(err, ReachedRay), err


def test_main_ppo_process_refuses_rollout_n_zero(tmp_path):
    """The real command line: exits non-zero, names the key and value, and never starts Ray (the refusal's time,
    interpreter start and imports included, is a benchmark's business; the timeout only bounds a hang)."""
    proc = subprocess.run(
        [sys.executable, "-m", "mgrpo_verl.main_ppo", "task=relay", "actor_rollout_ref.rollout.n=0",
         f"trainer.default_local_dir={tmp_path}", f"hydra.run.dir={tmp_path}/hydra"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    assert "actor_rollout_ref.rollout.n must be an int >= 1" in output and "got 0" in output, output[-3000:]
    assert "Started a local Ray instance" not in output and "ray.init" not in output


@pytest.mark.parametrize("up_before", [False, True])
def test_ray_environment_shuts_down_only_its_own_ray(monkeypatch, up_before):
    """verl's run_ppo reuses a Ray the caller already initialized; the run must leave that one up, and shut
    down the one it started (the state flips to up inside the block, as ray.init does)."""
    state = {"up": up_before}
    shutdowns = []
    monkeypatch.setattr(ray, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    with main_ppo.ray_environment(on_cpu=False, env={}):
        state["up"] = True
    assert shutdowns == ([] if up_before else [1])


@pytest.mark.parametrize("joins_cluster", [False, True])
def test_a_ray_the_run_starts_is_closed_on_an_accelerator_too(monkeypatch, joins_cluster):
    """Issue 29: on GPU machines too, a Ray the run starts itself gets token authentication with its token in a
    private temporary directory (not ~/.ray) and loopback only, and so do the process groups' and vLLM's sockets
    (gloo, NCCL's bootstrap, vLLM's host address); a driver joining a `ray start` cluster keeps the cluster's settings
    (docs/multinode.md). (The sockets themselves are checked on CPU: test_ray_session.py.)"""
    import os

    transport = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "VLLM_HOST_IP")
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", *transport):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with main_ppo.ray_environment(on_cpu=False, env={}, joins_cluster=joins_cluster):
        seen = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
        sockets = {k: os.environ.get(k) for k in transport}
        token = Path(seen["RAY_AUTH_TOKEN_PATH"]) if seen["RAY_AUTH_TOKEN_PATH"] else None
        if token is not None:
            assert token.is_file() and token.stat().st_mode & 0o777 == 0o600
            assert not str(token).startswith(str(Path.home() / ".ray"))
    if joins_cluster:
        assert seen == {"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN_PATH": None, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": None}
        assert sockets == dict.fromkeys(transport)  # the nodes of a cluster must reach each other
    else:
        assert seen["RAY_AUTH_MODE"] == "token" and seen["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and token is not None
        assert sockets == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "VLLM_HOST_IP": "127.0.0.1"}
        assert not token.exists()  # the private directory went with the run
    assert os.environ.get("RAY_AUTH_MODE") is None and os.environ.get("NCCL_SOCKET_IFNAME") is None  # restored


def test_three_agents_on_three_logical_gpus_reach_ray(run):
    """Three agents, each its own model on one logical GPU (separate placement): verl's batch rule holds per model
    (16 rows on 1 GPU each). Checked on the top-level config it asked the 16 rows to divide by 3 GPUs and refused the
    run ("real_train_batch_size (16) must be divisible by minimal possible batch size (3)"), the issue-31 example's
    first error."""
    third = ("+multi_agent.agents.third.trainable=true",
             "+multi_agent.agents.third.actor_rollout_ref.model.path=${mgrpo_model:tiny_sub}")
    err, _ = run(*third, "trainer.n_gpus_per_node=3")
    assert isinstance(err, ReachedRay), err
