"""Models on disjoint resource pools update concurrently, with the same results as one after the other.

Drives the real ``MultiAgentTrainer._train_models`` (verl's balance / old-log-prob / reference / update
methods, verl's padding, our aligned copies) with in-process fakes of TransferQueue and of each model's
worker group (``benchmarks/fake_step.py``), which record what every model received.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fake_step import FakeTransferQueue, FakeWorkerGroup, make_trainer, write_step  # noqa: E402

from mgrpo_verl.trainer.per_agent import AgentUpdateError  # noqa: E402

PAD = re.compile(r"^pad[0-9a-f]{32}_")


def _normalise(keys: list[str]) -> list[str]:
    """verl names its padding rows ``pad<uuid4>_<i>_0``: number the uuids by first appearance."""
    seen: dict[str, str] = {}

    def one(key: str) -> str:
        m = PAD.match(key)
        if not m:
            return key
        return seen.setdefault(m.group(0), f"pad#{len(seen)}_") + key[m.end():]

    return [one(k) for k in keys]


def _step(agents: list[str], concurrent_updates, *, work=None, fail_on: dict | None = None, shared_pool=False):
    store = FakeTransferQueue()
    with store.installed():
        groups = {
            name: FakeWorkerGroup(name, store, scale=1.0 + i, work=work, fail_on=(fail_on or {}).get(name))
            for i, name in enumerate(agents)
        }
        trainer = make_trainer(groups, concurrent_updates=concurrent_updates, shared_pool=shared_pool)
        batch, table, updates = write_step(store, agents, seed=3)
        metrics, timing = {}, {}
        out = {"groups": groups, "store": store, "metrics": metrics, "timing": timing, "batch": batch}
        try:
            out["keys"], out["tags"] = trainer._train_models(batch, table, updates, metrics, timing)
        except AgentUpdateError as err:
            out["error"] = err
    return out


def _calls(group: FakeWorkerGroup) -> list[dict]:
    return [{**c, "keys": _normalise(c["keys"])} for c in group.calls]


@pytest.mark.parametrize("agents", [["main", "sub"], ["main", "search", "code", "math"]])
def test_concurrent_step_equals_sequential_step(agents):
    # every model's compute_log_prob waits for all the others: the concurrent run passes only if the
    # models' chains really overlap (a sequential run would time out here)
    barrier = threading.Barrier(len(agents), timeout=30)
    seq = _step(agents, False)
    conc = _step(agents, "auto", work=lambda method: barrier.wait() if method == "compute_log_prob" else None)
    assert "error" not in seq and "error" not in conc

    for name in agents:
        assert seq["groups"][name].threads == {"MainThread"}
        assert len(conc["groups"][name].threads) == 1 and "MainThread" not in conc["groups"][name].threads
        # identical inputs: keys (in order), batch settings, and the fields the update read
        assert _calls(conc["groups"][name]) == _calls(seq["groups"][name])
    assert len(set.union(*(conc["groups"][n].threads for n in agents))) == len(agents)

    assert seq["metrics"].pop("mgrpo/concurrent_updates") == 0.0
    assert conc["metrics"].pop("mgrpo/concurrent_updates") == 1.0
    assert list(conc["metrics"].items()) == list(seq["metrics"].items())  # same keys, values and order
    assert _normalise(conc["keys"]) == _normalise(seq["keys"])
    assert conc["tags"] == seq["tags"]
    assert set(conc["timing"]) == set(seq["timing"]) == {"agent_updates"} | {
        f"agent/{n}/{phase}" for n in agents for phase in ("align", "old_log_prob", "ref", "update_actor")
    }


def test_each_model_gets_its_own_rows_config_and_tokenizer():
    run = _step(["main", "sub"], "auto")
    main, sub = run["groups"]["main"], run["groups"]["sub"]
    # main: 8 rows (4 queries x 2 rollouts); verl pads to a multiple of lcm(dp 2, mini-batch 3) = 6 -> 12.
    # sub: D_max 2 slots per main row = 16 rows; lcm(2, mini-batch 5) = 10 -> 20.
    assert [len(c["keys"]) for c in main.calls] == [12, 12, 12]
    assert [len(c["keys"]) for c in sub.calls] == [20, 20, 20]
    assert run["metrics"]["agent/main/update_rows"] == 8.0 and run["metrics"]["agent/sub/update_rows"] == 16.0
    assert main.calls[-1]["extra_info"]["global_batch_size"] == 3
    assert sub.calls[-1]["extra_info"]["global_batch_size"] == 5
    assert all(k.startswith("u") and k.endswith("_0") for k in main.calls[0]["keys"] if not PAD.match(k))
    for group, eos in ((main, 90), (sub, 91)):
        pads = [k for k in group.calls[0]["keys"] if PAD.match(k)]
        assert len(pads) == 4
        for key in pads:  # verl's padding row is built from the model's own tokenizer
            assert torch.equal(run["store"].rows[("train", key)]["input_ids"], torch.full((128,), eos))
        # and its advantages are zeros of its own response length (1 token)
        read = group.calls[-1]["read"]
        idx = [group.calls[-1]["keys"].index(k) for k in pads]
        assert [read["advantages"][i] for i in idx] == [0.0] * len(pads)
    # per-agent metrics from verl's methods, prefixed: entropy = the fake's constant per model
    assert run["metrics"]["agent/main/actor/entropy"] == pytest.approx(1.0)
    assert run["metrics"]["agent/sub/actor/entropy"] == pytest.approx(2.0)
    # the returned keys: the real rows, then per model its aligned copies and verl's padding rows
    real = run["batch"].keys
    copies = [k for k in sub.calls[0]["keys"] if k not in real and not PAD.match(k)]
    assert copies and all(int(k.rsplit("_", 1)[1]) >= 100_000 for k in copies)
    keys, n = run["keys"], len(real)
    assert keys[:n] == real
    assert set(keys[n : n + 4]) == {k for k in main.calls[0]["keys"] if PAD.match(k)}
    assert set(keys[n + 4 : n + 4 + len(copies)]) == set(copies)
    assert set(keys[n + 4 + len(copies) :]) == {k for k in sub.calls[0]["keys"] if PAD.match(k)}
    assert len(keys) == n + 4 + len(copies) + 4 and len(run["tags"]) == len(keys)


def test_shared_pool_and_single_model_stay_sequential():
    shared = _step(["main", "sub"], "auto", shared_pool=True)
    assert shared["metrics"]["mgrpo/concurrent_updates"] == 0.0
    assert all(g.threads == {"MainThread"} for g in shared["groups"].values())
    single = _step(["main"], "auto")
    assert single["metrics"]["mgrpo/concurrent_updates"] == 0.0
    assert single["groups"]["main"].threads == {"MainThread"}


def test_a_model_without_rows_is_skipped_and_the_others_still_run_concurrently():
    store = FakeTransferQueue()
    with store.installed():
        groups = {name: FakeWorkerGroup(name, store, scale=1.0) for name in ("main", "sub", "idle")}
        trainer = make_trainer(groups)
        batch, table, updates = write_step(store, ["main", "sub"], seed=3)
        metrics = {}
        trainer._train_models(batch, table, updates, metrics, {})
    assert metrics["agent/idle/skipped"] == 1.0 and not groups["idle"].calls
    assert metrics["mgrpo/concurrent_updates"] == 1.0


@pytest.mark.parametrize("mode", ["auto", False])
def test_a_failing_model_fails_the_step_with_its_name(mode):
    run = _step(["main", "sub"], mode, fail_on={"sub": "compute_ref_log_prob"})
    err = run["error"]
    assert err.agent == "sub" and "'sub'" in str(err) and "failed on purpose" in str(err)
    assert isinstance(err.__cause__, RuntimeError)
    # the other model's chain ran to its end (concurrent: it was waited for; sequential: it came first)
    assert [c["method"] for c in run["groups"]["main"].calls] == ["compute_log_prob", "compute_ref_log_prob", "update_actor"]
    assert "keys" not in run  # nothing returned: the step fails


def test_two_failing_models_name_both():
    run = _step(["main", "sub"], "auto", fail_on={"main": "update_actor", "sub": "compute_log_prob"})
    err = run["error"]
    assert err.agent == "main"
    assert any("'sub'" in note for note in getattr(err, "__notes__", []))


def test_concurrent_updates_rejects_other_values():
    with pytest.raises(ValueError, match=r"multi_agent\.concurrent_updates must be 'auto' or false, got 'yes'"):
        _step(["main", "sub"], "yes")
