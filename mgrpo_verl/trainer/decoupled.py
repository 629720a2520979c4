"""Decoupled M-GRPO: the main side and the sub side, each its own ``python -m mgrpo_verl.main_ppo``.

Two trainer modes registered with verl's trainer registry, ``mgrpo_decoupled_main`` (:class:`DecoupledMainTrainer`)
and ``mgrpo_decoupled_sub`` (:class:`DecoupledSubTrainer`), both the synchronous
:class:`~mgrpo_verl.trainer.per_agent.MultiAgentTrainer` with one side's models; verl has no such split. They
exchange only delegation calls (text over HTTP) and one record per main trajectory through the store, never a
tensor, so each side trains on its own cluster. The sub side's step, exactly once and the store:
``docs/decoupled.md``, "How a step runs".
"""

from __future__ import annotations

import logging
import time

import numpy as np
import ray
import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.utils.debug import marked_timer

from mgrpo_verl.config.schema import TRAINER_MODES
from mgrpo_verl.agent_loops.remote_sub import RemoteCallError, RemoteSubAgent, shared_secret
# the module, not its names: sub_service imports verl's v1 trainer package, whose import hook (our plugin) may
# import this module while sub_service is still half-imported
from mgrpo_verl.agent_loops import sub_service
from mgrpo_verl.rowmeta import RowMeta
from mgrpo_verl.store import TrajectoryStat, open_store
from mgrpo_verl.trainer.per_agent import MultiAgentTrainer
from mgrpo_verl.trainer.rows import (
    RowTable,
    as_list,
    decoupled_sub_table,
    row_metrics,
    scalar_advantages,
    write_row_values,
)

logger = logging.getLogger(__name__)


@register_trainer(TRAINER_MODES["main"])
class DecoupledMainTrainer(MultiAgentTrainer):
    """The main side of decoupled M-GRPO (``docs/decoupled.md``)."""

    ROLE = "main"

    def _setup(self):
        super()._setup()
        self.store = open_store(self.multi_agent.decoupled.store)
        d = self.multi_agent.decoupled
        timeout = self.multi_agent.delegation.timeout_s
        secret = shared_secret(d.secret_file)
        self.remote = {name: RemoteSubAgent(name, url, timeout, secret) for name, url in d.sub_urls.items()}

    def get_llm_client(self):
        from mgrpo_verl.agent_loops.multi_client import MultiAgentLLMClient

        ma = self.multi_agent
        clients = {}
        for name in ma.agents:
            owner = ma.owner_of(name)
            clients[name] = self.agents[owner].llm.get_client() if owner in self.agents else self.remote[name]
        return MultiAgentLLMClient(clients, main=ma.main)

    def on_init_end(self):
        super().on_init_end()
        for remote in self.remote.values():
            logger.info("waiting for the sub side of %r at %s", remote.agent, remote.url)
            health = remote.wait_ready(self.multi_agent.decoupled.connect_timeout_s)
            logger.info("sub side of %r ready: %s", remote.agent, health)

    def on_validate_begin(self):
        for remote in self.remote.values():
            remote.set_validating(True)

    def on_validate_end(self):
        for remote in self.remote.values():
            remote.set_validating(False)

    def fit(self, agent_loop_manager):
        """verl's loop; afterwards (final validation included) the sub sides are told that the main side is
        done, so that they stop serving and exit."""
        try:
            super().fit(agent_loop_manager)
        finally:
            for remote in self.remote.values():
                try:
                    remote.announce_finished(self.global_steps)
                except RemoteCallError as err:  # the sub side may be gone already: nothing to tell it
                    logger.warning("could not tell %s that the main side finished: %s", remote.url, err)

    def on_advantages(self, table: RowTable, batch: KVBatchMeta) -> None:
        """Publish one record per main trajectory before training, so that the sub sides can start."""
        main = np.flatnonzero(table.is_main & (table.agent == self.multi_agent.main))
        keys = [table.keys[i] for i in main]
        extra = as_list(tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                                        select_fields=["extra_fields"])["extra_fields"])
        records = []
        for i, fields in zip(main, extra):
            meta = RowMeta.read(fields, table.keys[i])
            if meta.sub_calls is None or meta.session is None:
                raise ValueError(
                    f"main row {table.traj_id[i]!r} lacks 'session' / 'sub_calls' in its row metadata: its agent loop "
                    f"did not delegate through a remote sub-agent (decoupled mode needs the mgrpo_relay loop)"
                )
            records.append(
                TrajectoryStat(
                    traj_id=meta.traj_id,
                    uid=str(table.uid[i]),
                    agent=meta.agent,
                    score=meta.score,
                    step=self.global_steps,
                    policy_version=self.global_steps,
                    extra={"session": meta.session, "sub_calls": list(meta.sub_calls)},
                )
            )
        self.store.put(records)


@register_trainer(TRAINER_MODES["sub"])
class DecoupledSubTrainer(MultiAgentTrainer):
    """The sub side of decoupled M-GRPO (``docs/decoupled.md``)."""

    ROLE = "sub"

    def _setup(self):
        super()._setup()
        d = self.multi_agent.decoupled
        self.rt = self.agents[d.train_agent]
        self.store = open_store(d.store)
        self.consumer = f"sub:{d.train_agent}"
        released = self.store.release_consumed(self.consumer, after_step=self.global_steps)
        if released:
            logger.info("resumed at step %d: released %d consumption marks of later steps", self.global_steps, released)
        self.served_agents = [a for a in self.rt.plays if a != self.multi_agent.main]

    def get_llm_client(self):
        return self.rt.llm.get_client()  # verl's agent-loop workers of this side get no prompts; the service uses it

    def on_init_end(self):
        super().on_init_end()
        d = self.multi_agent.decoupled
        service_cls = ray.remote(sub_service.SubAgentService)
        self.service = service_cls.options(name=f"mgrpo_sub_service_{d.train_agent}", max_concurrency=1000).remote(
            self.rt.config, self.rt.llm.get_client(), self.served_agents[0]
        )
        url = ray.get(self.service.start.remote(d.serve_host, d.serve_port, shared_secret(d.secret_file)))
        ray.get(self.service.resume.remote(self.global_steps))
        print(f"mgrpo_verl: sub-agent {self.served_agents[0]!r} served at {url}", flush=True)

    def fit(self, agent_loop_manager):
        """verl's loop, then serving on (the main side's final validation calls this model) until the main
        side says it is done, at most ``idle_timeout_s``."""
        super().fit(agent_loop_manager)
        d = self.multi_agent.decoupled
        deadline = time.monotonic() + d.idle_timeout_s
        stats = ray.get(self.service.stats.remote())
        while stats.get("main_finished_at") is None and time.monotonic() < deadline:
            time.sleep(0.5)
            stats = ray.get(self.service.stats.remote())
        if stats.get("main_finished_at") is None:
            logger.warning("the main side did not say it finished within %gs; stopping anyway", d.idle_timeout_s)
        ray.get(self.service.stop.remote())
        print(
            f"mgrpo_verl: sub side of {self.served_agents[0]!r} done; calls served {stats['served']}, validation "
            f"{stats['validation']}, failed {stats['failed']}, refused {stats['refused']}; rows left untrained "
            f"{stats['pending_rows']}",
            flush=True,
        )

    def prepare_step(self) -> dict:
        return {}  # no prompts of its own: rows come from the main side's delegation calls

    def on_sample_end(self):
        ray.get(self.service.pause.remote())
        super().on_sample_end()

    def on_step_end(self):
        super().on_step_end()
        ray.get(self.service.resume.remote(self.global_steps))

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        """The synchronous step on the rows of the main side's calls (``docs/decoupled.md``)."""
        # 1. sample: wait for served rows whose parents are in the store; close the gate
        with marked_timer("gen", timing_raw, color="red"):
            rows, mains = self._take_ready_rows(metrics)
            self.on_sample_end()
        with marked_timer("adv", timing_raw, color="brown"):
            # 2. score and advantages: the synchronous row table rebuilt from the rows and their main records
            table, advantage = self._compute_sub_advantages(rows, mains)
            # 3. align as the synchronous step; publish the audit records of this side's rows
            alignment, updates = self._plan_updates(table, advantage)
            self._publish_sub_records(table, advantage, rows)
        batch, row_tags = self._sub_rows(table)  # this side's rows, with their TransferQueue tags
        # 4. log: statistics of the agents this side serves, and the alignment
        metrics.update(self._served_metrics(table, advantage, row_tags, alignment))
        # 5. update this side's model (as the synchronous step)
        keys, tags = self._train_models(batch, table, updates, metrics, timing_raw)
        # 6. mark the rows consumed (exactly once)
        self.store.mark_consumed(self.consumer, [r.traj_id for r in rows], step=self.global_steps)
        return KVBatchMeta(partition_id="train", keys=keys, tags=tags)

    def _compute_sub_advantages(self, rows: list[sub_service.PendingRow], mains: dict) -> tuple[RowTable, np.ndarray]:
        """The synchronous row table of ``rows`` and their queries' main records, its M-GRPO advantages; this
        side's rows get theirs written back as ``rm_scores`` (own score), ``advantages`` and ``returns``."""
        table = decoupled_sub_table(rows, mains)
        advantage = scalar_advantages(table, "mgrpo", self.multi_agent.mgrpo)
        sub = np.flatnonzero(~table.is_main)
        write_row_values([str(k) for k in table.keys[sub]], "train",
                         {"rm_scores": table.score[sub], "advantages": advantage[sub], "returns": advantage[sub]})
        return table, advantage

    def _publish_sub_records(self, table: RowTable, advantage: np.ndarray, rows: list[sub_service.PendingRow]) -> None:
        """This side's own records: who was trained on, with which own score and advantage (an audit trail:
        the synchronous advantages can be recomputed from the store alone)."""
        version_of = {r.key: r.policy_version for r in rows}
        self.store.put([
            TrajectoryStat(traj_id=str(table.traj_id[i]), uid=str(table.uid[i]), agent=str(table.agent[i]),
                           parent_traj_id=str(table.parent_traj_id[i]), score=float(table.score[i]),
                           step=self.global_steps, policy_version=version_of[str(table.keys[i])],
                           extra={"advantage": float(advantage[i])})
            for i in np.flatnonzero(~table.is_main)
        ])

    @staticmethod
    def _sub_rows(table: RowTable) -> tuple[KVBatchMeta, list[dict]]:
        """This side's real rows of ``table`` as a batch (keys and TransferQueue tags), and the tag of every
        table row (``{}`` for the main rows, which live on the main side)."""
        sub_keys = [str(k) for k in table.keys[np.flatnonzero(~table.is_main)]]
        listed = tq.kv_list(partition_id="train").get("train", {})
        tag_of = {k: listed.get(k, {}) for k in sub_keys}
        row_tags = [tag_of.get(str(k), {}) for k in table.keys]
        return KVBatchMeta(partition_id="train", keys=sub_keys, tags=[tag_of[k] for k in sub_keys]), row_tags

    def _served_metrics(self, table: RowTable, advantage: np.ndarray, row_tags: list[dict], alignment) -> dict:
        """The synchronous step's row metrics of the agents this model plays, and the alignment's."""
        served = {f"agent/{a}/" for a in self.rt.plays}
        return {k: v for k, v in row_metrics(table, advantage, row_tags, alignment).items()
                if any(k.startswith(p) for p in served) or k.startswith("mgrpo/align/")}

    def _take_ready_rows(self, metrics: dict) -> tuple[list[sub_service.PendingRow], dict]:
        """Pending rows whose parents are in the store (at least one), and their queries' main records.

        Rows that cannot be trained on are dropped from the service and TransferQueue, and counted in
        ``decoupled/*`` metrics (``docs/decoupled.md``)."""
        d = self.multi_agent.decoupled
        counts = dict.fromkeys(("missing_parent", "stale_parent", "unclaimed", "already_consumed"), 0)
        start = time.monotonic()
        while True:
            pending = [sub_service.PendingRow(**r) for r in ray.get(self.service.pending_rows.remote())]
            status = ray.get(self.service.stats.remote())
            ready, dropped = [], []
            if pending:
                parents = self.store.get({r.parent_traj_id for r in pending})
                lag = d.max_policy_lag
                newest = max((p.policy_version for p in parents.values()), default=0)
                oldest_ok = 0 if lag is None else newest - lag
                now = time.time()
                for r in pending:
                    parent = parents.get(r.parent_traj_id)
                    if parent is None:
                        if now - r.created > d.wait_timeout_s:
                            dropped.append(r)
                            counts["missing_parent"] += 1
                    elif parent.policy_version < oldest_ok:
                        dropped.append(r)
                        counts["stale_parent"] += 1
                    elif r.traj_id not in set(parent.extra.get("sub_calls", ())):
                        dropped.append(r)
                        counts["unclaimed"] += 1
                    else:
                        ready.append(r)
                if dropped and d.missing_policy == "error" and (counts["missing_parent"] or counts["stale_parent"]):
                    raise ValueError(
                        f"decoupled sub side: rows {[r.traj_id for r in dropped[:5]]} have no usable parent in the "
                        f"store "
                        f"(missing after {d.wait_timeout_s:g}s or older than max_policy_lag={d.max_policy_lag}) and "
                        f"multi_agent.decoupled.missing_policy is 'error'"
                    )
                done = self.store.consumed(self.consumer, [r.traj_id for r in ready])
                if done:
                    counts["already_consumed"] += len(done)
                    dropped += [r for r in ready if r.traj_id in done]
                    ready = [r for r in ready if r.traj_id not in done]
                if dropped:
                    ray.get(self.service.take.remote([r.key for r in dropped]))
                    tq.kv_clear(keys=[r.key for r in dropped], partition_id="train")
                if ready:
                    break
            if status.get("main_finished_at") is not None:
                raise RuntimeError(
                    f"decoupled sub side: the main side finished at its step {status['main_finished_at']} while this "
                    f"side waits for rows of its step {self.global_steps}; give both sides the same "
                    f"trainer.total_training_steps"
                )
            if time.monotonic() - start > d.idle_timeout_s:
                raise TimeoutError(
                    f"decoupled sub side: no delegation call with a published parent in {d.idle_timeout_s:g}s "
                    f"({len(pending)} rows pending); is the main side running with "
                    f"multi_agent.decoupled.sub_urls.{self.served_agents[0]} pointing here and the same store "
                    f"({d.store})?"
                )
            time.sleep(d.poll_s)
        ray.get(self.service.take.remote([r.key for r in ready]))
        waited = time.monotonic() - start
        mains = self.store.main_scores({r.uid for r in ready})
        metrics.update({f"decoupled/{k}_rows": float(v) for k, v in counts.items()})
        metrics["decoupled/ready_rows"] = float(len(ready))
        metrics["decoupled/wait_s"] = waited
        metrics["decoupled/parent_version_lag"] = float(
            self.global_steps - min(m.policy_version for g in mains.values() for m in g.values())
        ) if mains else 0.0
        return ready, mains
