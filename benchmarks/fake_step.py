"""An in-process stand-in for the update phase of one M-GRPO step, for ``bench_step_concurrency.py`` and
``tests/trainer/test_concurrent_updates.py``.

It drives the real :meth:`MultiAgentTrainer._train_models` (and through it verl's real
``_balance_batch`` / ``_compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_update_actor``,
verl's padding helper and our row copies) with two fakes in place of the Ray cluster:

- :class:`FakeTransferQueue`: a dict of rows behind ``transfer_queue.kv_batch_get`` / ``kv_batch_put``
  (thread-safe, as the real client is); per-token fields come back as jagged tensors, as TransferQueue
  returns them;
- :class:`FakeWorkerGroup`: one per model; records every call (keys, batch settings, the fields the
  update reads) and writes deterministic log-probs, optionally after a fixed cost (``work``: a sleep, or
  a Ray actor that sleeps).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
import transfer_queue
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict
from transfer_queue import KVBatchMeta

from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from mgrpo_verl.algorithms.alignment import plan_resolved_alignment
from mgrpo_verl.algorithms.config import MGRPOConfig
from mgrpo_verl.trainer.agents import AgentRuntime
from mgrpo_verl.trainer.per_agent import MultiAgentTrainer
from mgrpo_verl.config.schema import load_multi_agent
from mgrpo_verl.rowmeta import ROW_META, RowMeta
from mgrpo_verl.trainer.rows import build_row_table, plan_update_sets, scalar_advantages, write_row_values


class FakeTransferQueue:
    """Rows keyed by (partition, key): ``{field: tensor or object}`` plus a tag."""

    def __init__(self):
        self.rows: dict[tuple[str, str], dict] = {}
        self.tags: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None, data_parser=None):
        keys = list(keys)
        with self.lock:
            for i, key in enumerate(keys):
                row = self.rows.setdefault((partition_id, key), {})
                if fields is not None:
                    one = fields[i]
                    for name in fields.keys():
                        value = one[name]
                        row[name] = value.clone() if isinstance(value, torch.Tensor) else value
                if tags is not None:
                    self.tags[(partition_id, key)] = dict(tags[i])
                self.tags.setdefault((partition_id, key), {})
            names = sorted(set.intersection(*(set(self.rows[(partition_id, k)]) for k in keys))) if keys else []
            return KVBatchMeta(keys=keys, tags=[dict(self.tags[(partition_id, k)]) for k in keys],
                               partition_id=partition_id, fields=names)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        keys = [keys] if isinstance(keys, str) else list(keys)
        with self.lock:
            rows = [self.rows[(partition_id, k)] for k in keys]
            names = list(rows[0]) if select_fields is None else (
                [select_fields] if isinstance(select_fields, str) else list(select_fields))
            out = {}
            for name in names:
                values = [row[name] for row in rows]  # KeyError: a field never written, as TransferQueue refuses
                if all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in values):
                    out[name] = torch.nested.as_nested_tensor([v.clone() for v in values], layout=torch.jagged)
                elif all(isinstance(v, torch.Tensor) for v in values):
                    out[name] = torch.stack(values)
                else:
                    out[name] = NonTensorStack(*values)
            return TensorDict(out, batch_size=len(keys))

    @contextmanager
    def installed(self):
        """Route ``transfer_queue.kv_batch_get`` / ``kv_batch_put`` here (verl and our rows module look
        them up on the module at call time)."""
        saved = transfer_queue.kv_batch_get, transfer_queue.kv_batch_put
        transfer_queue.kv_batch_get, transfer_queue.kv_batch_put = self.kv_batch_get, self.kv_batch_put
        try:
            yield self
        finally:
            transfer_queue.kv_batch_get, transfer_queue.kv_batch_put = saved


class FakeWorkerGroup:
    """One model's worker group: ``dp`` data-parallel ranks; deterministic outputs; every call recorded.

    ``work(method)`` runs inside every call before its output is written (a fixed cost, a barrier...).
    ``fail_on``: name of a method that raises instead."""

    def __init__(self, name: str, store: FakeTransferQueue, scale: float, dp: int = 2,
                 work: Callable[[str], None] | None = None, fail_on: str | None = None):
        self.name, self.store, self.scale, self.dp = name, store, scale, dp
        self.work, self.fail_on = work, fail_on
        self._dispatch_info: dict = {}
        self.calls: list[dict] = []
        self.threads: set[str] = set()

    def _query_dispatch_info(self, role):
        return list(range(self.dp))  # one worker per data-parallel rank

    def _enter(self, method: str, batch: KVBatchMeta) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append({"method": method, "keys": list(batch.keys), "extra_info": dict(batch.extra_info)})
        if self.work is not None:
            self.work(method)
        if method == self.fail_on:
            raise RuntimeError(f"{self.name}: {method} failed on purpose")

    def _write_log_probs(self, batch: KVBatchMeta, offset: float) -> None:
        data = self.store.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["input_ids"])
        ids = list(data["input_ids"].unbind(0))
        log_probs = [-(self.scale * (x.to(torch.float32) % 7) + offset) / 10 for x in ids]
        fields = {"log_probs": torch.nested.as_nested_tensor(log_probs, layout=torch.jagged)}
        if offset == 0:
            fields["entropy"] = torch.nested.as_nested_tensor([torch.full(x.shape, self.scale) for x in ids],
                                                              layout=torch.jagged)
        self.store.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                                fields=TensorDict(fields, batch_size=len(batch)))

    def compute_log_prob(self, batch: KVBatchMeta):
        self._enter("compute_log_prob", batch)
        self._write_log_probs(batch, 0.0)
        return batch

    def compute_ref_log_prob(self, batch: KVBatchMeta):
        self._enter("compute_ref_log_prob", batch)
        self._write_log_probs(batch, 1.0)
        return batch

    def update_actor(self, batch: KVBatchMeta):
        self._enter("update_actor", batch)
        names = ["advantages", "old_log_probs", "ref_log_prob", "response_mask"]
        data = self.store.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                       select_fields=[n for n in names
                                                      if n in self.store.rows[(batch.partition_id, batch.keys[0])]])
        seen = {n: [round(float(t.sum()), 6) for t in data[n].unbind(0)] for n in data.keys()}
        self.calls[-1]["read"] = seen
        loss = sum(a * o for a, o in zip(seen["advantages"], seen["old_log_probs"]))
        return {"metrics": {"pg_loss": [loss, loss / 2], "grad_norm": [self.scale], "mfu": [0.5]}}


def agent_config(mini_batch: int, concurrent_updates=None):
    cfg = {
        "actor_rollout_ref": {
            "rollout": {"temperature": 1.0, "calculate_log_probs": False, "n": 1},
            "actor": {"ppo_mini_batch_size": mini_batch, "ppo_epochs": 1, "data_loader_seed": 7, "shuffle": False,
                      "calculate_entropy": False, "entropy_coeff": 0.0, "loss_agg_mode": "token-mean",
                      "loss_scale_factor": None},
        },
        "algorithm": {"rollout_correction": None},
        "trainer": {"critic_warmup": 0},
        "multi_agent": {"enable": True},
    }
    if concurrent_updates is not None:
        cfg["multi_agent"]["concurrent_updates"] = concurrent_updates
    return OmegaConf.create(cfg)


class _PoolManager:
    def __init__(self, pools: dict):
        self.pools = pools

    def get_resource_pool(self, role):
        return self.pools[role]


def make_trainer(groups: dict[str, FakeWorkerGroup], *, shared_pool: bool = False, concurrent_updates=None,
                 use_reference_policy=True, mini_batches: dict[str, int] | None = None) -> MultiAgentTrainer:
    """A :class:`MultiAgentTrainer` without Ray: one trainable model per worker group (first: the main
    agent's), each with its own tokenizer (``eos_token_id`` 90 + index) and mini-batch size (3 + 2 * index), its own
    resource pool unless ``shared_pool``."""
    trainer = object.__new__(MultiAgentTrainer)  # no __init__: nothing of Ray or the dataloader
    trainer.config = agent_config(4, concurrent_updates)
    trainer.multi_agent = load_multi_agent(trainer.config)  # the section as _setup's plan types it
    trainer.agents = {}
    pools, shared = {}, object()
    for i, (name, wg) in enumerate(groups.items()):
        rt = AgentRuntime(
            name=name, trainable=True, config=agent_config((mini_batches or {}).get(name, 3 + 2 * i)), plays=(name,),
            worker_group=wg, tokenizer=SimpleNamespace(eos_token_id=90 + i), use_reference_policy=use_reference_policy,
        )
        trainer.agents[name] = rt
        pools[(name, MultiAgentTrainer._role(rt))] = shared if shared_pool else object()
    trainer.resource_pool_manager = _PoolManager(pools)
    first = next(iter(trainer.agents.values()))
    trainer.actor_rollout_wg = trainer.ref_policy_wg = first.worker_group  # as _setup leaves them
    trainer.tokenizer = SimpleNamespace(eos_token_id=1)
    trainer.use_reference_policy = False
    trainer.use_critic, trainer.ref_in_actor, trainer.distillation_config = False, False, None
    trainer.global_steps = 1
    return trainer


def write_step(store: FakeTransferQueue, agents: list[str], queries: int = 4, rollouts: int = 2, seed: int = 0,
               d_max: int = 2, partition: str = "train"):
    """Rows of one step in ``store``: ``agents[0]`` is the main agent (``rollouts`` rows per query), every
    other agent a sub-agent called 0..3 times per main row (so the alignment duplicates, borrows, pads and
    drops). Returns (batch, table, updates) as ``_step_once`` hands them to ``_train_models``."""
    rng = np.random.default_rng(seed)
    main, subs = agents[0], agents[1:]
    keys, tags, rows = [], [], []

    def add(key, uid, agent, traj, parent, score, prompt_len, response_len):
        ids = torch.from_numpy(rng.integers(2, 60, prompt_len + response_len))
        keys.append(key)
        tags.append({"seq_len": prompt_len + response_len, "prompt_len": prompt_len, "response_len": response_len})
        rows.append({
            "prompts": ids[:prompt_len].clone(), "responses": ids[prompt_len:].clone(), "input_ids": ids,
            "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(len(ids)),
            "response_mask": torch.ones(response_len, dtype=torch.int64),
            "rm_scores": torch.zeros(response_len), "uid": uid,
            "extra_fields": {ROW_META: RowMeta(agent=agent, traj_id=traj, parent_traj_id=parent, score=score).write()},
        })

    for q in range(queries):
        for r in range(rollouts):
            prefix = f"u{q}_{r}"
            add(f"{prefix}_0", f"u{q}", main, f"{prefix}/m", "", float(rng.random()), int(rng.integers(4, 9)),
                int(rng.integers(2, 7)))
            j = 1
            for sub in subs:
                for c in range(int(rng.integers(0, 4))):
                    add(f"{prefix}_{j}", f"u{q}", sub, f"{prefix}/{sub}{c}", f"{prefix}/m", float(rng.random()),
                        int(rng.integers(4, 9)), int(rng.integers(2, 7)))
                    j += 1
    store.kv_batch_put(keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(rows), tags=tags)
    batch = KVBatchMeta(partition_id=partition, keys=keys, tags=tags)
    table = build_row_table(keys, [r["uid"] for r in rows], [r["extra_fields"] for r in rows])
    advantage = scalar_advantages(table, "mgrpo", MGRPOConfig())
    write_row_values(keys, partition, {"rm_scores": table.score, "advantages": advantage, "returns": advantage})
    alignment = (plan_resolved_alignment(table.parent_row, table.agent, table.uid, d_max, seed=seed)
                 if (~table.is_main).any() else None)
    updates = plan_update_sets(table, alignment, advantage, {a: a for a in agents})
    return batch, table, updates


def sleeping_work(seconds: float) -> Callable[[str], None]:
    """A fixed cost per worker-group call, spent waiting (as a driver waits on Ray)."""
    return lambda method: time.sleep(seconds)


def ray_work(seconds: float, n_agents: int) -> tuple[Callable[[str], None], list]:
    """Per model a Ray actor whose ``work`` sleeps ``seconds``; returns (factory of the per-model work
    callable, the actors). The driver blocks in ``ray.get`` as with verl's worker groups."""
    import ray

    @ray.remote(num_cpus=0)
    class Worker:
        def work(self, s: float) -> float:
            time.sleep(s)
            return s

    actors = [Worker.remote() for _ in range(n_agents)]
    ray.get([a.work.remote(0) for a in actors])
    return (lambda i: (lambda method: ray.get(actors[i].work.remote(seconds)))), actors
