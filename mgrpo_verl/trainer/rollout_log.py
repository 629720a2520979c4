"""Rollouts people can read: every step's rows, training and validation, as JSON lines keyed by step, trajectory
and agent (docs/rollouts.md), and a small table of sample trajectories per agent for verl's ``Tracking``.

verl's own dump (``trainer.rollout_data_dir`` / ``trainer.validation_data_dir``) decodes every row with the main
model's tokenizer and carries no agent, no trajectory and no parent. The multi-agent trainer
(:class:`~mgrpo_verl.trainer.per_agent.MultiAgentTrainer`) writes these rows instead, for the training rows, and
beside verl's validation dump, from what its step computed (:class:`StepRows`: the row table, the advantages and
the alignment plan) and the rows' TransferQueue fields.

One row of a dump is one real trajectory row (aligned copies and verl's padding rows are not rows of their own:
a row's ``fate`` says what the alignment made of it). Model text is hostile: decoding and tool-call parsing never
raise, a call that cannot be read keeps its raw text.

The pure part (:func:`split_turns`, :func:`extract_tool_calls`, :func:`alignment_fates`, :func:`build_rows`,
:func:`sample_rows`, :func:`log_sample_tables`) is tested without Ray; :func:`read_rollouts` is the one
TransferQueue read.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mgrpo_verl.algorithms.alignment import BORROWED, DUPLICATE, ORIGINAL, PADDING, BatchAlignment
from mgrpo_verl.rowmeta import RowMeta
from mgrpo_verl.trainer.rows import RowTable, as_list

logger = logging.getLogger(__name__)

#: ``split`` of a training row and of a validation row.
TRAIN, VAL = "train", "val"

#: Sub-folder of ``trainer.validation_data_dir`` that holds our validation rows (verl's own validation dump stays
#: at ``<validation_data_dir>/<step>.jsonl``, which ``mgrpo_verl.experiments.research_eval`` reads).
VAL_SUBDIR = "agents"

#: ``turns[i]["role"]``: a span the model generated (``response_mask`` 1), and one the loop added (tool
#: responses, observations, chat-template text between turns; ``response_mask`` 0).
MODEL, ENV = "model", "env"

#: ``fate["kind"]`` of a row after trajectory alignment (D_max): in the update once as itself; as itself plus
#: ``copies`` duplicates in its own rollout's slots; not in its own rollout's slots (more calls than D_max). Any
#: of them may also be ``borrowed`` into rollouts of the same query that made no call of that sub-agent.
KEPT, DUPLICATED, DROPPED = "kept", "duplicated", "dropped"

#: TransferQueue fields a dump reads.
FIELDS = ("uid", "prompts", "responses", "response_mask", "extra_fields", "reward_model")

#: Characters of a tool call's raw text kept when it cannot be parsed, and of a text cell in a tracker table.
RAW_CHARS = 2_000
TABLE_CHARS = 2_000

#: Sample trajectories per agent in the trackers' tables (wandb, tensorboard) at each dump.
TABLE_ROWS_PER_AGENT = 4

#: Columns of the trackers' tables.
TABLE_COLUMNS = ("step", "agent", "traj_id", "parent_traj_id", "score", "advantage", "fate", "prompt", "response")


@dataclass(frozen=True)
class StepRows:
    """What a training step computed about its real rows, kept on the trainer for the step's dump."""

    step: int
    partition_id: str
    table: RowTable
    advantage: np.ndarray
    alignment: Optional[BatchAlignment]


# ---------------------------------------------------------------------------------------------- pure


def split_turns(ids: Sequence[int], mask: Sequence[int]) -> list[tuple[str, list[int]]]:
    """The response ``ids`` as its runs of equal ``mask``: ``(MODEL, ids)`` where the model generated them
    (mask 1), ``(ENV, ids)`` where the loop added them (mask 0). A mask shorter than ``ids`` counts as 0 for the
    rest (never raises)."""
    out: list[tuple[str, list[int]]] = []
    for i, token in enumerate(ids):
        role = MODEL if i < len(mask) and int(mask[i]) else ENV
        if out and out[-1][0] == role:
            out[-1][1].append(int(token))
        else:
            out.append((role, [int(token)]))
    return out


def extract_tool_calls(text: str) -> list[dict[str, Any]]:
    """Every ``<tool_call>...</tool_call>`` block of a model span (verl's hermes format, as our
    ``hermes_strict`` parser reads it): ``{"name", "arguments"}`` with the arguments decoded when they are JSON,
    else kept as text; a block that cannot be read is ``{"name": "", "error", "raw"}`` (its text, cut to
    :data:`RAW_CHARS`). Never raises."""
    from mgrpo_verl.agent_loops.tool_parser import CALL_BLOCK, parse_call

    if "<tool_call>" not in text:
        return []
    calls = []
    for body, closed in CALL_BLOCK.findall(text):
        try:
            call = parse_call(body, closed)
            name, arguments, error = call.name, call.arguments, getattr(call, "error", None)
        except Exception as err:  # parse_call never raises on model output; a dump must not fail if it does
            name, arguments, error = "", "", f"{type(err).__name__}: {err}"
        if error:
            calls.append({"name": "", "error": str(error), "raw": body[:RAW_CHARS]})
            continue
        try:
            decoded = json.loads(arguments) if isinstance(arguments, str) else arguments
        except Exception:
            decoded = arguments
        calls.append({"name": str(name), "arguments": decoded})
    return calls


def _decode(tokenizer: Any, ids: list[int], skip_special_tokens: bool) -> str:
    try:
        return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
    except Exception as err:  # ids the tokenizer cannot decode: the dump shows that instead
        return f"<{len(ids)} tokens the tokenizer could not decode: {type(err).__name__}>"


def decode_turns(tokenizer: Any, ids: Sequence[int], mask: Sequence[int]) -> list[dict[str, Any]]:
    """:func:`split_turns`, each span decoded with ``tokenizer`` (special tokens left out of ``text``); a model
    span's tool calls (:func:`extract_tool_calls`, read from its text with special tokens, where a tokenizer
    may count ``<tool_call>`` as one) under ``tool_calls``."""
    turns = []
    for role, span in split_turns(ids, mask):
        turn: dict[str, Any] = {"role": role, "text": _decode(tokenizer, span, True), "tokens": len(span)}
        if role == MODEL:
            calls = extract_tool_calls(_decode(tokenizer, span, False))
            if calls:
                turn["tool_calls"] = calls
        turns.append(turn)
    return turns


def alignment_fates(n_rows: int, alignment: Optional[BatchAlignment]) -> list[dict[str, Any]]:
    """What the step's alignment plan made of each of the ``n_rows`` table rows.

    A sub row: ``{"kind": KEPT | DUPLICATED | DROPPED, "copies": duplicates in its own rollout's slots,
    "borrowed": copies in other rollouts' slots, "d_max"}``. A main row (it passes through): ``{"kind": KEPT}``,
    plus, per sub-agent, ``borrowed_in`` (its slots filled with other rollouts' calls) and ``padding`` (its
    zero-mask slots: no call of that sub-agent for the whole query) when not zero. ``alignment`` None: every
    row is a main row, kept.
    """
    fates: list[dict[str, Any]] = [{"kind": KEPT} for _ in range(n_rows)]
    if alignment is None:
        return fates
    plan = alignment.plan
    n_sub = len(alignment.sub_rows)
    source, kind = plan.source.reshape(-1), plan.kind.reshape(-1)

    def count(k: int) -> np.ndarray:
        return np.bincount(source[kind == k], minlength=n_sub) if n_sub else np.zeros(0, np.int64)

    kept, copies, borrowed = count(ORIGINAL), count(DUPLICATE), count(BORROWED)
    for s, row in enumerate(alignment.sub_rows):
        label = DROPPED if not kept[s] else DUPLICATED if copies[s] else KEPT
        fates[int(row)] = {"kind": label, "copies": int(copies[s]), "borrowed": int(borrowed[s]), "d_max": plan.d_max}
    for m, row in enumerate(alignment.main_rows):
        fate: dict[str, Any] = {"kind": KEPT, "d_max": plan.d_max}
        for a, name in enumerate(alignment.agent_names):
            for key, k in (("borrowed_in", BORROWED), ("padding", PADDING)):
                n = int((plan.kind[m, a] == k).sum())
                if n:
                    fate.setdefault(key, {})[str(name)] = n
        fates[int(row)] = fate
    return fates


def _finite(value: Any) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _plain(value: Any) -> Any:
    """``value`` as JSON-able data (numpy scalars and arrays, tensors, anything else as its text)."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _finite(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return str(value)


def build_rows(
    step: int,
    split: str,
    keys: Sequence[str],
    fields: dict[str, Sequence[Any]],
    tokenizer_of: Callable[[str], Any],
    advantage: Optional[Sequence[float]] = None,
    fates: Optional[Sequence[dict]] = None,
    trainable: Optional[Callable[[str], bool]] = None,
) -> list[dict[str, Any]]:
    """The dump rows of ``keys`` (docs/rollouts.md, "Schema").

    Args:
        fields: per row, ``uid``, ``extra_fields``, ``prompts`` / ``responses`` / ``response_mask`` (token id
            sequences), optionally ``reward_model``.
        tokenizer_of: agent name -> its model's tokenizer (each row is decoded with its own agent's).
        advantage, fates: per row (training); None for validation rows (``advantage`` and ``fate`` null).
        trainable: agent name -> whether its model trains (training); None: not recorded.

    A row without the row contract (not written by a multi-agent loop) gets agent ``"?"`` and its key as
    ``traj_id``, with the error under ``error``, instead of failing the dump.
    """
    rows = []
    reward_models = fields.get("reward_model") or [None] * len(keys)
    for i, key in enumerate(keys):
        extra = fields["extra_fields"][i]
        error = None
        try:
            meta = RowMeta.read(extra, key)
        except ValueError as err:
            meta, error = RowMeta(agent="?", traj_id=str(key), parent_traj_id="", score=0.0), str(err)
        tokenizer = tokenizer_of(meta.agent)
        prompt = list(fields["prompts"][i])
        row: dict[str, Any] = {
            "step": int(step),
            "split": split,
            "key": str(key),
            "uid": str(fields["uid"][i]),
            "traj_id": meta.traj_id,
            "parent_traj_id": meta.parent_traj_id,
            "origin": meta.origin,  # "{split}/{index}/{session}": the same trajectory in another run's dump
            "agent": meta.agent,
            "score": _finite(meta.score),
            "advantage": None if advantage is None else _finite(advantage[i]),
            "fate": None if fates is None else fates[i],
            "calls": meta.calls,
            "failed_calls": meta.failed_calls,
            "prompt": _decode(tokenizer, prompt, False),
            "prompt_tokens": len(prompt),
            "turns": decode_turns(tokenizer, list(fields["responses"][i]), list(fields["response_mask"][i])),
        }
        if trainable is not None:
            row["trainable"] = bool(trainable(meta.agent))
        reward_model = reward_models[i]
        if isinstance(reward_model, dict) and "ground_truth" in reward_model:
            row["ground_truth"] = _plain(reward_model["ground_truth"])
        info = extra.get("reward_extra_info") if isinstance(extra, dict) else None
        if meta.is_main and isinstance(info, dict):  # the rollout's statistics (verl copies them onto every row)
            row["reward_extra_info"] = _plain(info)
        if error is not None:
            row["error"] = error
        rows.append(row)
    return rows


def response_text(row: dict[str, Any]) -> str:
    """A row's turns as one text, each turn headed ``[model]`` / ``[env]``."""
    return "\n".join(f"[{t['role']}] {t['text']}" for t in row.get("turns", []))


def fate_label(fate: Optional[dict[str, Any]]) -> str:
    """``"kept"``, ``"duplicated x2"``, ``"dropped, borrowed x1"``, ... (``""`` for no fate: validation)."""
    if not fate:
        return ""
    label = fate.get("kind", "")
    if fate.get("copies"):
        label += f" x{fate['copies']}"
    if fate.get("borrowed"):
        label += f", borrowed x{fate['borrowed']}"
    return label


def sample_rows(rows: Sequence[dict[str, Any]], per_agent: int = TABLE_ROWS_PER_AGENT) -> dict[str, list[dict]]:
    """agent -> up to ``per_agent`` rows: for a main agent its first rollouts by key; for each sub-agent, its
    calls in those same rollouts first (their trees), then the others by key."""
    ordered = sorted(rows, key=lambda r: r["key"])
    by_agent: dict[str, list[dict]] = defaultdict(list)
    for row in ordered:
        by_agent[row["agent"]].append(row)
    chosen = {r["traj_id"] for agent_rows in by_agent.values()
              for r in [r for r in agent_rows if not r["parent_traj_id"]][:per_agent]}
    out = {}
    for agent, agent_rows in by_agent.items():
        first = [r for r in agent_rows if r["traj_id"] in chosen or r["parent_traj_id"] in chosen]
        rest = [r for r in agent_rows if not (r["traj_id"] in chosen or r["parent_traj_id"] in chosen)]
        out[agent] = (first + rest)[:per_agent]
    return out


def _cut(text: str, limit: int = TABLE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"


def table_row(row: dict[str, Any]) -> list[Any]:
    """One row of a tracker table (:data:`TABLE_COLUMNS`)."""
    return [row["step"], row["agent"], row["traj_id"], row["parent_traj_id"], row["score"], row["advantage"],
            fate_label(row.get("fate")), _cut(row.get("prompt", "")), _cut(response_text(row))]


def _markdown(agent: str, rows: Sequence[dict[str, Any]]) -> str:
    """Tensorboard text: each row's fields, its prompt and response as indented (verbatim) blocks."""
    parts = [f"**{agent}**: {len(rows)} sample trajectories\n"]
    for row in rows:
        values = dict(zip(TABLE_COLUMNS, table_row(row)))
        parts.append(f"### {values['traj_id']}\n\nparent `{values['parent_traj_id'] or '-'}` "
                     f"· score {values['score']} · "
                     f"advantage {values['advantage']} · fate {values['fate'] or '-'}\n")
        for name in ("prompt", "response"):
            block = "\n".join("    " + line for line in str(values[name]).splitlines() or [""])
            parts.append(f"{name}:\n\n{block}\n")
    return "\n".join(parts)


def log_sample_tables(tracking: Any, rows: Sequence[dict[str, Any]], split: str, step: int,
                      per_agent: int = TABLE_ROWS_PER_AGENT) -> list[str]:
    """Through verl's ``Tracking`` (``tracking.logger``: backend name -> logger), a table of sample trajectories
    per agent (:func:`sample_rows`) under ``rollouts/<split>/<agent>``: a ``wandb.Table`` when ``wandb`` is on
    (as verl logs its validation generations), a text (``add_text``) when ``tensorboard`` is on. Best effort: a
    backend that fails is logged and skipped. Returns the backends that were written."""
    backends = getattr(tracking, "logger", None) or {}
    wanted = [name for name in ("wandb", "tensorboard") if name in backends]
    if not wanted or not rows:
        return []
    samples = sample_rows(rows, per_agent)
    done = []
    for name in wanted:
        try:
            if name == "wandb":
                wandb = backends["wandb"]
                if getattr(wandb, "run", None) is None:
                    continue
                tables = {f"rollouts/{split}/{agent}": wandb.Table(columns=list(TABLE_COLUMNS),
                                                                   data=[table_row(r) for r in rs])
                          for agent, rs in samples.items()}
                wandb.log(tables, step=step)
            else:
                writer = backends["tensorboard"].writer
                for agent, rs in samples.items():
                    writer.add_text(f"rollouts/{split}/{agent}", _markdown(agent, rs), step)
                writer.flush()
            done.append(name)
        except Exception as err:  # a tracker must never fail the run
            logger.warning("rollout table for %s at step %d not logged to %s: %s: %s", split, step, name,
                           type(err).__name__, err)
    return done


def dump_path(directory: str, step: int, split: str) -> str:
    """``<rollout_data_dir>/<step>.jsonl`` (training) or ``<validation_data_dir>/agents/<step>.jsonl``."""
    return (os.path.join(directory, f"{step}.jsonl") if split == TRAIN
            else os.path.join(directory, VAL_SUBDIR, f"{step}.jsonl"))


def write_rows(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Write ``rows`` as JSON lines to ``path`` (through a temporary file, so that a reader never sees half a
    file); returns ``path``. Non-ASCII text is escaped, so any decoded text (lone surrogates included) writes."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=True, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------------- TransferQueue I/O


def _sequences(value: Any) -> list[list[int]]:
    """A per-token TransferQueue field as one id list per row (a jagged nested tensor, as TransferQueue returns
    it, or a padded 2-D tensor, or lists)."""
    if getattr(value, "is_nested", False):
        return [t.tolist() for t in value.unbind(0)]
    if hasattr(value, "tolist"):
        return [list(v) for v in value.tolist()]
    return [list(v) for v in value]


def read_rollouts(keys: Sequence[str], partition_id: str, step: int, split: str, tokenizer_of: Callable[[str], Any],
                  **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`build_rows` of ``keys`` from one TransferQueue read (``kwargs``: its training arguments)."""
    import transfer_queue as tq

    if not keys:
        return []
    data = tq.kv_batch_get(keys=list(keys), partition_id=partition_id, select_fields=list(FIELDS))
    fields = {
        "uid": as_list(data["uid"]),
        "extra_fields": as_list(data["extra_fields"]),
        "reward_model": as_list(data["reward_model"]),
        **{name: _sequences(data[name]) for name in ("prompts", "responses", "response_mask")},
    }
    return build_rows(step, split, list(keys), fields, tokenizer_of, **kwargs)


class SampleRecorder:
    """verl's replay buffer as ``_validate`` uses it: each batch it samples is also read (``read(batch)`` -> rows)
    before verl clears it, and the rows are kept in :attr:`rows`. Anything else goes to the buffer."""

    def __init__(self, buffer: Any, read: Callable[[Any], list[dict[str, Any]]]):
        self._buffer, self._read = buffer, read
        self.rows: list[dict[str, Any]] = []

    def sample(self, *args: Any, **kwargs: Any):
        batch, metrics = self._buffer.sample(*args, **kwargs)
        self.rows.extend(self._read(batch))
        return batch, metrics

    def __getattr__(self, name: str):
        return getattr(self._buffer, name)
