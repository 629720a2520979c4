"""verl's sync ``ReplayBuffer`` with a configurable TransferQueue poll interval.

verl 0.9.1's ``ReplayBuffer.sample`` checks TransferQueue for finished rollouts and, when the batch is
not complete yet, sleeps ``poll_interval`` seconds, a constructor argument that defaults to 2.0 and
that no config key reaches. On CPU the rollout of a step takes tens of milliseconds, so every step
waited 2 s for nothing (benchmarks/bench_cpu_step.py: 2.0 of 2.8 s per step). verl's extension point
for the sampler is ``trainer.v1.sampler.custom_sampler``; this class is selected there by our YAML and
reads its settings from ``trainer.v1.sampler.sampler_kwargs``.

verl hands a custom sampler only the generic arguments: the batch sizes and DAPO group filtering that
it configures for its built-in sampler must therefore come through ``sampler_kwargs`` too (our YAML
interpolates them from ``data.*``). DAPO filtering (``algorithm.filter_groups``) and
``sync_refill_failed_groups`` are not supported here and are refused with a clear error, never
silently dropped.
"""

from __future__ import annotations

from typing import Any

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

#: Keys this sampler reads from ``trainer.v1.sampler.sampler_kwargs``.
SAMPLER_KEYS = ("poll_interval", "train_batch_size", "gen_batch_size", "filter_groups")


class QuickPollReplayBuffer(ReplayBuffer):
    """``ReplayBuffer`` for the sync trainer that polls every ``sampler_kwargs.poll_interval`` seconds."""

    def __init__(self, *, trainer_mode: str, sampler_kwargs: Any = None, **kwargs: Any) -> None:
        opts = dict(sampler_kwargs or {})
        unknown = sorted(set(opts) - set(SAMPLER_KEYS))
        if unknown:
            raise ValueError(f"QuickPollReplayBuffer: unknown sampler_kwargs {unknown}; known: {list(SAMPLER_KEYS)}")
        if trainer_mode != "sync":
            raise ValueError(f"QuickPollReplayBuffer serves verl's sync trainer, not trainer_mode={trainer_mode!r}")
        if opts.get("filter_groups"):
            raise ValueError(
                "QuickPollReplayBuffer does not implement DAPO group filtering (algorithm.filter_groups); "
                "set trainer.v1.sampler.custom_sampler.path=null to use verl's own sampler"
            )
        poll = float(opts.get("poll_interval", 2.0))
        if not poll > 0:
            raise ValueError(f"QuickPollReplayBuffer: poll_interval must be > 0 seconds, got {poll}")
        train_batch_size = opts.get("train_batch_size")
        super().__init__(
            trainer_mode=trainer_mode,
            sampler_kwargs=sampler_kwargs,
            poll_interval=poll,
            train_batch_size=train_batch_size,
            gen_batch_size=opts.get("gen_batch_size") or train_batch_size,
            max_inflight_gen_batches=1,
            **kwargs,
        )
