"""The rollout server: a Ray actor that generates with Hugging Face transformers (CPU, or one CUDA GPU).

verl 0.9.1 has rollout servers for vLLM, SGLang and TRT-LLM only; this one implements the methods verl calls on
them (``generate``, the sleep / wake-up / KV-cache / abort calls, ``get_server_address`` ...) plus the
weight-update endpoint our in-worker adapter drives, batching the queued requests on one worker thread. Unlike
vLLM it frees nothing on ``sleep``. The contract, batching, the ``engine_kwargs.hf`` options and the device:
``docs/cpu.md``, "The hf rollout server".
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from typing import TYPE_CHECKING

from mgrpo_verl.config import setting

# torch, transformers and verl are imported where they are used, not here: every process that receives a handle
# of this actor imports this module to rebuild the handle (Ray does so on deserialising it), the request router
# (trainer/balancer.py) among them, which should stay a ~70 MiB process
if TYPE_CHECKING:
    from mgrpo_verl.hf_rollout.engine import GenerationRequest, GenerationResult, HFGenerationEngine

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

ENGINE_KWARGS_KEY = "hf"
#: Values of ``engine_kwargs.hf.device``.
DEVICE_CHOICES = ("auto", "cpu", "cuda")
_ENGINE_OPTIONS = {
    "dtype",
    "device",
    "attn_implementation",
    "num_threads",
    "max_batch_size",
    "batch_wait_ms",
    "max_batch_wait_ms",
    # after every weight update, report (and log) a sha256 fingerprint of the weights; costs one pass
    # over the weights, so off by default (the end-to-end test uses it)
    "fingerprint_weights",
}


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future
    enqueued_at: float = field(default_factory=time.perf_counter)


def resolve_rollout_device(requested: Any, worker_device: str) -> str:
    """The torch device of a replica's model: ``"cpu"`` or ``"cuda"``.

    ``requested`` is ``engine_kwargs.hf.device`` (``None`` / ``"auto"``: ``worker_device``), and
    ``worker_device`` is verl's device name in the replica's first actor worker (``"cpu"`` on our CPU
    platform, ``"cuda"`` on NVIDIA). ``cpu`` is always allowed (weights are synced through host memory
    anyway); ``cuda`` only where the worker trains on CUDA.

    Raises:
        ValueError: an unknown value, ``cuda`` without a CUDA worker, or a worker device other than
            cpu / cuda (e.g. ``npu``: the HF rollout has never been run there).
    """
    choice = "auto" if requested is None else str(requested).strip().lower()
    if choice not in DEVICE_CHOICES:
        raise ValueError(
            f"rollout.engine_kwargs.{ENGINE_KWARGS_KEY}.device={requested!r}: expected one of {DEVICE_CHOICES}"
        )
    worker = str(worker_device).strip().lower()
    if choice == "cpu":
        return "cpu"
    if worker not in ("cpu", "cuda"):
        raise ValueError(
            f"the HF rollout supports the cpu and cuda devices; the actor worker trains on {worker_device!r} "
            f"(set rollout.engine_kwargs.{ENGINE_KWARGS_KEY}.device=cpu to generate on the host)"
        )
    if choice == "cuda" and worker != "cuda":
        raise ValueError(
            f"rollout.engine_kwargs.{ENGINE_KWARGS_KEY}.device=cuda, but the actor worker trains on {worker!r}"
        )
    return worker


def cuda_index(gpu_id: str | None, visible: str | None) -> int:
    """Index among this process's visible CUDA devices of the GPU Ray gave the actor worker.

    ``gpu_id`` is the worker's ``ray.get_runtime_context().get_accelerator_ids()["GPU"][0]`` (``None``:
    no worker, take the first visible device); ``visible`` is this process's ``CUDA_VISIBLE_DEVICES``
    (``None``: every device visible, so ids are indices). The replica starts the server with Ray's
    ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` so that Ray leaves the variable as the node has it.

    Raises:
        RuntimeError: no visible device, or the worker's GPU is not among the visible ones.
    """
    if gpu_id is None or str(gpu_id).strip() == "":
        return 0
    gpu_id = str(gpu_id).strip()
    if visible is None:
        return int(gpu_id)
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not ids:
        raise RuntimeError("CUDA_VISIBLE_DEVICES is empty in the HF rollout server: it cannot see its worker's GPU")
    if gpu_id not in ids:
        raise RuntimeError(
            f"the actor worker's GPU {gpu_id!r} is not visible to the HF rollout server "
            f"(CUDA_VISIBLE_DEVICES={visible!r})"
        )
    return ids.index(gpu_id)



class HFRolloutServer:
    """Token-in / token-out generation server (wrap with ``ray.remote``; see :class:`HFReplica`).

    The constructor takes the same arguments as verl's ``vLLMHttpServer`` so the replica code mirrors
    verl's; ``workers``, ``node_rank``, ``gpus_per_node`` and ``nnodes`` are recorded but unused (one
    server per replica, no tensor parallelism). ``device`` (resolved by the replica) is where the model
    lives; with ``cuda``, ``cuda_visible_devices`` is the worker's GPU id (the first of a list), mapped to
    a torch device by :func:`cuda_index` when the model is loaded.
    """

    def __init__(
        self,
        config: Any,
        model_config: Any,
        rollout_mode: Any = None,
        workers: list | None = None,
        replica_rank: int = 0,
        node_rank: int = 0,
        gpus_per_node: int = 1,
        nnodes: int = 1,
        cuda_visible_devices: str | None = None,
        server_name: str | None = None,
        device: str = "cpu",
    ):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig

        from mgrpo_verl.hf_rollout.sampling import LOGPROBS_MODES

        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.rollout_mode = rollout_mode
        self.workers = workers or []
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        self.server_name = server_name or f"hf_server_{replica_rank}_{node_rank}"
        self.global_steps = None
        if device not in ("cpu", "cuda"):
            raise ValueError(
                f"{self.server_name}: device must be 'cpu' or 'cuda' (resolved by HFReplica), got {device!r}"
            )
        self.device = device
        self.cuda_visible_devices = cuda_visible_devices

        engine_kwargs = setting(self.config, "engine_kwargs", {}) or {}
        opts = dict(engine_kwargs.get(ENGINE_KWARGS_KEY, {}) or {})
        unknown = sorted(set(opts) - _ENGINE_OPTIONS)
        if unknown:
            raise ValueError(
                f"unknown rollout.engine_kwargs.{ENGINE_KWARGS_KEY} option(s) {unknown}; "
                f"supported: {sorted(_ENGINE_OPTIONS)}"
            )
        self.opts = opts
        self.dtype = opts.get("dtype") or setting(self.config, "dtype", "float32")
        self.logprobs_mode = setting(self.config, "logprobs_mode", None) or "processed_logprobs"
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"rollout.logprobs_mode={self.logprobs_mode!r} is not supported by the HF rollout; "
                f"use one of {LOGPROBS_MODES}"
            )
        max_num_seqs = int(setting(self.config, "max_num_seqs", 256) or 256)
        self.max_batch_size = max(1, min(int(opts.get("max_batch_size", 256)), max_num_seqs))
        self.batch_wait_s = max(0.0, float(opts.get("batch_wait_ms", 5.0))) / 1000.0
        self.max_batch_wait_s = max(self.batch_wait_s, float(opts.get("max_batch_wait_ms", 30.0)) / 1000.0)
        self._arrivals = 0
        self.response_length = int(setting(self.config, "response_length", 512))
        self.prompt_length = int(setting(self.config, "prompt_length", 512))
        self.full_determinism = bool(setting(self.config, "full_determinism", False))
        self.seed = int(setting(self.config, "seed", 0)) + int(replica_rank)
        self._seed_step: int | None = None  # the global step _prompt_counts counts in
        self._prompt_counts: dict[tuple[str | None, bytes], int] = {}

        self.engine: HFGenerationEngine | None = None
        self.max_model_len: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-rollout")
        self._queue: list[_Pending] = []
        self._running: list[_Pending] = []
        self._has_work: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._weights_ready: asyncio.Event | None = None
        self._resume_event: asyncio.Event | None = None
        self._scheduler_task: asyncio.Task | None = None
        self._submission_paused = False
        self._rejecting = False
        self._asleep = False
        self._pending_unknown: list[str] = []
        self._loaded_names: set[str] = set()
        self._batch_sizes: list[int] = []
        self.weight_version = 0
        self.num_threads: int | None = None
        self._adapter_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ lifecycle

    async def launch_server(self, *args: Any, **kwargs: Any) -> None:
        """Load the model and start the batch scheduler. Idempotent."""
        if self.engine is not None:
            return
        import torch

        from mgrpo_verl.hf_rollout.engine import HFGenerationEngine

        # Measured on the 2-core CI machine: two intra-op threads make the small matmuls of these models
        # 4-50x slower than one (thread hand-off dominates), and replicas run side by side; so by default
        # a server takes half the cores.
        # (OpenMP thread counts are per calling thread: set it where the model runs, the executor thread.)
        num_threads = int(self.opts.get("num_threads") or max(1, (os.cpu_count() or 2) // 2))
        torch.set_num_threads(num_threads)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, torch.set_num_threads, num_threads)
        self.num_threads = await loop.run_in_executor(self._executor, torch.get_num_threads)
        tokenizer = self.model_config.tokenizer
        eos: set[int] = set()
        if tokenizer is not None and tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        gen_cfg = self.model_config.generation_config
        gen_eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        if gen_eos is not None:
            eos.update([int(gen_eos)] if isinstance(gen_eos, int) else [int(t) for t in gen_eos])
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        device = self.device
        if device == "cuda":
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"{self.server_name}: the HF rollout was placed on cuda but torch sees no CUDA device in the "
                    f"server process (CUDA_VISIBLE_DEVICES={visible!r}, torch {torch.__version__}, "
                    f"built for CUDA {torch.version.cuda})"
                )
            first_id = str(self.cuda_visible_devices).split(",")[0] if self.cuda_visible_devices else None
            index = cuda_index(first_id, visible)
            if index >= torch.cuda.device_count():
                raise RuntimeError(
                    f"{self.server_name}: GPU {first_id!r} maps to cuda:{index}, but torch sees "
                    f"{torch.cuda.device_count()} device(s) (CUDA_VISIBLE_DEVICES={visible!r})"
                )
            device = f"cuda:{index}"

        self.engine = await loop.run_in_executor(
            self._executor,
            lambda: HFGenerationEngine.from_pretrained(
                self.model_config.local_path,
                dtype=self.dtype,
                attn_implementation=self.opts.get("attn_implementation", "sdpa"),
                eos_token_ids=eos or None,
                pad_token_id=pad,
                seed=self.seed,
                logprobs_mode=self.logprobs_mode,
                trust_remote_code=bool(self.model_config.trust_remote_code),
                device=device,
            ),
        )
        max_pos = int(getattr(self.engine.model.config, "max_position_embeddings", 0) or 0)
        configured = setting(self.config, "max_model_len", None)
        if configured is None:
            self.max_model_len = max_pos or (self.prompt_length + self.response_length)
        else:
            if max_pos and int(configured) > max_pos:
                raise ValueError(
                    f"max_model_len ({configured}) should be less than or equal to max_position_embeddings ({max_pos})"
                )
            self.max_model_len = int(configured)

        self._has_work = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._weights_ready = asyncio.Event()
        self._weights_ready.set()
        self._resume_event = asyncio.Event()
        self._resume_event.set()
        self._scheduler_task = asyncio.create_task(self._scheduler())
        logger.info(
            "%s ready: model=%s device=%s dtype=%s threads=%d max_batch_size=%d max_model_len=%d",
            self.server_name,
            self.model_config.local_path,
            self.engine.device,
            self.engine.dtype,
            num_threads,
            self.max_batch_size,
            self.max_model_len,
        )

    def get_server_address(self) -> tuple[str, None]:
        """``(node ip, None)``: there is no HTTP endpoint; requests go through the Ray actor handle."""
        import ray

        return ray.util.get_node_ip_address().strip("[]"), None

    def get_master_address(self) -> tuple[None, None, None]:
        return None, None, None

    def get_rollout_config(self):
        return self.config

    def _require_engine(self) -> HFGenerationEngine:
        if self.engine is None:
            raise RuntimeError(f"{self.server_name}: launch_server() has not been called")
        return self.engine

    # ------------------------------------------------------------------ generation

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str | None = None,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        priority: int = 0,
        lora_name: str | None = None,
        **kwargs: Any,
    ):
        """Generate a continuation of ``prompt_ids``; returns verl's ``TokenOutput``.

        ``lora_name`` (our addition; verl's clients send no such keyword unless given one, see
        :class:`~mgrpo_verl.hf_rollout.adapters.AdapterLLMServerClient`) generates with that LoRA adapter
        (:meth:`update_adapter`) on the shared base; ``None``: the base model, refused once adapters are loaded
        (the engine then serves agents' adapters, and a request of an agent that names none is a routing bug: the
        main agent's turns were generated by the bare base so until 2026-11-26).

        ``token_ids`` holds the generated tokens (ending with the EOS / stop token when one ended the
        sequence), ``log_probs`` their log-probabilities when ``sampling_params["logprobs"]`` is truthy,
        ``stop_reason`` is ``"completed"`` or ``"aborted"`` and ``extra_fields`` carries ``global_steps``,
        ``finish_reason`` (``stop`` / ``length`` / ``abort``), ``num_cached_tokens`` (always 0) and, when
        ``prompt_logprobs`` was asked for, ``prompt_ids`` / ``prompt_logprobs`` in vLLM's layout.

        Raises:
            InvalidRequestError: empty or too long prompt, token ids outside the vocabulary, multi-modal
                data, or unsupported / out-of-range sampling parameters.
        """
        from verl.workers.rollout.replica import TokenOutput

        from mgrpo_verl.hf_rollout.engine import GenerationRequest
        from mgrpo_verl.hf_rollout.sampling import InvalidRequestError, parse_sampling_params, validate_prompt_ids

        engine = self._require_engine()
        request_id = request_id or uuid.uuid4().hex
        if kwargs:
            raise InvalidRequestError(f"unexpected generate() argument(s) {sorted(kwargs)} for the HF rollout")
        for name, value in (("image_data", image_data), ("video_data", video_data), ("audio_data", audio_data)):
            if value is not None and (not hasattr(value, "__len__") or len(value) > 0):
                raise InvalidRequestError(f"the HF rollout is text-only; got {name}")
        if sampling_params is None:
            sampling_params = {}
        if not isinstance(sampling_params, Mapping):
            raise InvalidRequestError(f"sampling_params must be a dict, got {type(sampling_params).__name__}")
        if lora_name is None and engine.adapters.names:
            raise InvalidRequestError(
                f"{self.server_name}: this engine serves the LoRA adapters of agents {list(engine.adapters.names)}; "
                f"a request must name one (lora_name)"
            )
        if lora_name is not None and lora_name not in engine.adapters.names:
            raise InvalidRequestError(
                f"{self.server_name}: no LoRA adapter {lora_name!r} loaded (loaded: {list(engine.adapters.names)}); "
                f"adapters arrive with the first weight sync of their agent"
            )
        prompt = validate_prompt_ids(prompt_ids, vocab_size=engine.vocab_size, max_model_len=self.max_model_len)
        default_max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt))
        params = parse_sampling_params(
            sampling_params,
            prompt_len=len(prompt),
            max_model_len=self.max_model_len,
            default_max_tokens=default_max_tokens,
            vocab_size=engine.vocab_size,
            default_seed=self.seed if self.full_determinism or "seed" in sampling_params
            else self._request_seed(prompt, lora_name),  # a request's own seed wins: no hash, no count
        )

        extra = {"global_steps": self.global_steps}
        while self._submission_paused:
            if self._rejecting:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=extra)
            await self._resume_event.wait()

        pending = _Pending(
            request=GenerationRequest(prompt_ids=prompt, params=params, request_id=request_id, adapter=lora_name),
            future=asyncio.get_running_loop().create_future(),
        )
        self._queue.append(pending)
        self._arrivals += 1
        self._has_work.set()
        try:
            result: GenerationResult = await pending.future
        except asyncio.CancelledError:
            pending.request.aborted = True
            raise

        extra = {
            "global_steps": self.global_steps,
            "finish_reason": result.finish_reason,
            "num_cached_tokens": 0,
        }
        if result.prompt_logprobs is not None:
            extra["prompt_ids"] = result.prompt_logprob_ids
            extra["prompt_logprobs"] = result.prompt_logprobs
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs,
            routed_experts=None,
            stop_reason="aborted" if result.finish_reason == "abort" else "completed",
            num_preempted=0,
            extra_fields=extra,
        )

    async def _scheduler(self) -> None:
        while True:
            try:
                await self._schedule_one_batch()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not leave callers waiting forever
                logger.exception("%s: scheduler error; failing queued requests", self.server_name)
                queued, self._queue = self._queue, []
                self._has_work.clear()
                for p in queued:
                    if not p.future.done():
                        p.future.set_exception(RuntimeError(f"{self.server_name}: scheduler error, see server log"))
                self._running = []
                self._idle.set()

    async def _schedule_one_batch(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self._require_engine()
        await self._has_work.wait()
        if self.batch_wait_s > 0:
            # let a burst of concurrent requests gather: wait for a quiet gap (bounded)
            deadline = loop.time() + self.max_batch_wait_s
            while len(self._queue) < self.max_batch_size:
                seen = self._arrivals
                await asyncio.sleep(self.batch_wait_s)
                if self._arrivals == seen or loop.time() >= deadline:
                    break
        await self._weights_ready.wait()
        # no await between here and _idle.clear(): a weight update that closed the gate either sees this
        # batch as running or stops us at the wait above.
        batch = self._queue[: self.max_batch_size]
        del self._queue[: self.max_batch_size]
        if not self._queue:
            self._has_work.clear()
        live = []
        for p in batch:
            if p.future.done():
                continue
            if p.request.aborted:
                self._finish_aborted(p)
                continue
            live.append(p)
        if not live:
            return
        self._running = live
        self._idle.clear()
        self._batch_sizes.append(len(live))
        try:
            results = await loop.run_in_executor(self._executor, engine.generate_batch, [p.request for p in live])
            for p, r in zip(live, results, strict=True):
                if not p.future.done():
                    p.future.set_result(r)
        except Exception as e:  # engine failure: fail this batch, keep serving
            logger.exception("%s: batch of %d failed", self.server_name, len(live))
            for p in live:
                if not p.future.done():
                    p.future.set_exception(e)
        finally:
            self._running = []
            self._idle.set()

    def _finish_aborted(self, p: _Pending) -> None:
        from mgrpo_verl.hf_rollout.engine import GenerationResult

        if not p.future.done():
            p.future.set_result(GenerationResult(token_ids=[], log_probs=None, finish_reason="abort"))

    # ------------------------------------------------------------------ control (RolloutReplica)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Weights stay where they are (host or GPU) and the KV cache lives only as long as a batch, so
        waking up only flips the state."""
        self._asleep = False

    async def sleep(self) -> None:
        """Wait for in-flight requests, then mark the server asleep (the KV cache of a batch is freed when
        the batch ends; weights stay on the server's device and are overwritten by the next weight update)."""
        await self.wait_for_requests_to_drain()
        self._asleep = True

    async def clear_kv_cache(self) -> None:
        """No prefix cache is kept between batches: nothing to clear."""

    async def release_kv_cache(self) -> None:
        """No persistent KV cache: nothing to release."""

    async def resume_kv_cache(self) -> None:
        """No persistent KV cache: nothing to restore."""

    async def start_profile(self, **kwargs: Any) -> None:
        """Profiling is not implemented for the HF rollout (no-op)."""

    async def stop_profile(self) -> None:
        """Profiling is not implemented for the HF rollout (no-op)."""

    def _request_seed(self, prompt: list[int], adapter: str | None) -> int:
        """The seed of a request that names none: a hash of the server's seed, the global step, the adapter, the
        prompt and how many requests for the same prompt and adapter came before it in this step. vLLM draws from
        one generator in scheduling order; so did this server, which made the samples depend on which requests
        shared a batch, hence on timing and machine load (docs/results/reproduce.md). With this seed a step's
        samples depend only on what was asked: the G copies of a group's prompt get G different seeds, the same
        ones on every run, whatever order they arrive in (which copy gets which is arrival order: the group's
        samples as a set are what reproduces). One server only: with several replicas of an agent, which
        replica a prompt goes to still depends on load. ``full_determinism`` keeps its meaning (one seed for
        every request, as verl's vLLM server), and a request's own ``seed`` wins over both."""
        if self.global_steps != self._seed_step:
            self._seed_step, self._prompt_counts = self.global_steps, {}
        digest = hashlib.blake2b(b",".join(str(t).encode() for t in prompt), digest_size=16).digest()
        count = self._prompt_counts.get((adapter, digest), 0)
        self._prompt_counts[(adapter, digest)] = count + 1
        material = f"{self.seed}|{self.global_steps}|{adapter}|{count}|".encode() + digest
        return int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little") >> 1

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wait_for_requests_to_drain(self) -> None:
        if self._idle is None:  # not launched
            return
        while self._queue or self._running:
            await self._idle.wait()
            await asyncio.sleep(0.001)

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """Abort queued and running requests (running ones return their partial tokens with
        ``stop_reason="aborted"``) and hold new requests until :meth:`resume_generation` (or fail them at
        once with ``reject_request=True``)."""
        self._submission_paused = True
        self._rejecting = reject_request
        self._resume_event.clear()
        ids = []
        for p in self._queue:
            p.request.aborted = True
            self._finish_aborted(p)
            ids.append(p.request.request_id)
        self._queue.clear()
        self._has_work.clear()
        for p in self._running:
            p.request.aborted = True
            ids.append(p.request.request_id)
        await self._idle.wait()
        return {"aborted_count": len(ids), "request_ids": ids}

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._submission_paused = False
        if self._resume_event is not None:
            self._resume_event.set()

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        for p in self._queue + self._running:
            if p.request.request_id == request_id:
                p.request.aborted = True
                if p in self._queue:
                    self._queue.remove(p)
                    self._finish_aborted(p)
                return {"aborted": True, "request_id": request_id}
        return {"aborted": False, "request_id": request_id, "error": f"Request {request_id} not found"}

    # ------------------------------------------------------------------ weight updates (our adapter)

    async def begin_weight_update(self) -> None:
        """Stop starting new batches and wait for the running one to finish."""
        self._require_engine()
        self._weights_ready.clear()
        await self._idle.wait()
        self._pending_unknown = []
        self._loaded_names = set()

    async def update_weights_bucket(self, named_tensors: list[tuple[str, Any]]) -> int:
        """Copy one bucket of ``(hf_name, tensor)`` pairs into the model; returns the bytes loaded."""
        engine = self._require_engine()
        if self._weights_ready.is_set():
            await self.begin_weight_update()
        loop = asyncio.get_running_loop()
        report = await loop.run_in_executor(self._executor, engine.load_weights, named_tensors)
        self._pending_unknown.extend(report["unknown"])
        self._loaded_names.update(report["loaded"])
        return report["bytes"]

    async def finish_weight_update(self, global_steps: int | None = None) -> dict:
        """Re-open the gate; fails if any received name matched no model parameter."""
        from mgrpo_verl.hf_rollout.engine import weights_fingerprint

        unknown, self._pending_unknown = self._pending_unknown, []
        loaded = len(self._loaded_names)
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        self._weights_ready.set()
        if unknown:
            raise ValueError(
                f"{self.server_name}: {len(unknown)} weight(s) match no parameter of the rollout model, e.g. "
                f"{unknown[:5]}; known names look like {self._require_engine().state_dict_names()[:3]}"
            )
        report = {"loaded": loaded, "weight_version": self.weight_version, "global_steps": self.global_steps}
        if self.opts.get("fingerprint_weights"):
            report["fingerprint"] = weights_fingerprint(self._require_engine().model)
        return report

    async def update_weights(self, named_tensors: list[tuple[str, Any]], global_steps: int | None = None) -> dict:
        """One-call weight update (begin + one bucket + finish)."""
        await self.begin_weight_update()
        await self.update_weights_bucket(named_tensors)
        return await self.finish_weight_update(global_steps)

    async def update_adapter(
        self, name: str, peft_config: dict, named_tensors: list[tuple[str, Any]], global_steps: int | None = None
    ) -> dict:
        """Load LoRA adapter ``name`` (added on first call) between batches; the base weights and the other
        adapters are untouched. Adapters of several agents may be pushed concurrently: each push waits for
        the running batch, as a full weight update does, and pushes run one at a time."""
        from mgrpo_verl.hf_rollout.adapters import base_fingerprint, tensors_fingerprint

        engine = self._require_engine()
        if self._adapter_lock is None:
            self._adapter_lock = asyncio.Lock()
        async with self._adapter_lock:
            await self.begin_weight_update()
            try:
                loop = asyncio.get_running_loop()
                report = await loop.run_in_executor(self._executor, engine.load_adapter, name, peft_config,
                                                    named_tensors)
            finally:
                self.weight_version += 1
                if global_steps is not None:
                    self.global_steps = global_steps
                self._weights_ready.set()
        report.update(adapter=name, weight_version=self.weight_version, global_steps=self.global_steps)
        if self.opts.get("fingerprint_weights"):
            report["base_fingerprint"] = base_fingerprint(engine.model)
            report["adapter_fingerprint"] = tensors_fingerprint(named_tensors)
        return report

    def get_adapter_weights(self, name: str) -> dict:
        """A CPU copy of adapter ``name``'s LoRA tensors, under peft's names (tests and debugging)."""
        from peft import get_peft_model_state_dict

        engine = self._require_engine()
        if name not in engine.adapters.names:
            raise ValueError(f"{self.server_name}: no LoRA adapter {name!r}; loaded: {list(engine.adapters.names)}")
        state = get_peft_model_state_dict(engine.adapters.model, adapter_name=name)
        return {k: v.detach().cpu().clone() for k, v in state.items()}

    def get_base_fingerprint(self) -> str:
        """:func:`~mgrpo_verl.hf_rollout.adapters.base_fingerprint` of the engine's base weights."""
        from mgrpo_verl.hf_rollout.adapters import base_fingerprint

        return base_fingerprint(self._require_engine().model)

    # ------------------------------------------------------------------ introspection

    def get_stats(self) -> dict:
        engine = self._require_engine()
        return {
            **engine.stats,
            "batch_sizes": list(self._batch_sizes),
            "weight_version": self.weight_version,
            "global_steps": self.global_steps,
            "asleep": self._asleep,
            "queued": len(self._queue),
            "running": len(self._running),
            "max_model_len": self.max_model_len,
            "num_threads": self.num_threads,
            "device": str(engine.device),
            "adapters": list(engine.adapters.names),
        }

    def get_weights(self) -> dict:
        """A CPU copy of the rollout model's weights (tests and debugging)."""
        return {k: v.detach().cpu().clone() for k, v in self._require_engine().model.state_dict().items()}
