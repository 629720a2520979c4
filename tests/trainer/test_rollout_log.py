"""The rollout dump's pieces (mgrpo_verl/trainer/rollout_log.py) on hand-built rows: turns from the response mask,
tool calls from hostile model text, the alignment fate of each row from a hand-built plan, the rows themselves
(each decoded with its own agent's tokenizer), the TransferQueue read, the JSON lines, the replay-buffer recorder
of validation, and the trackers' tables through verl's real ``Tracking`` (tensorboard read back; wandb disabled).

The alignment plan (D_max = 2; rows of the table):

    row  role  traj  parent  agent      what the plan does with it
    0    main  m0    -       main       made 3 calls of a (s0, s1, s2) and 1 of b (t0)
    1    main  m1    -       main       made none: its a slots borrow s1 twice, its b slots are padding
    2    sub   s0    m0      a          slot (m0, a, 0): ORIGINAL                      -> kept
    3    sub   s1    m0      a          in no slot of m0 (3 calls > D_max), borrowed   -> dropped, borrowed x2
    4    sub   s2    m0      a          slot (m0, a, 1): ORIGINAL                      -> kept
    5    sub   t0    m0      b          slots (m0, b, 0) ORIGINAL and (m0, b, 1) DUPLICATE -> duplicated x1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transfer_queue import KVBatchMeta

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fake_tq  # noqa: E402

from mgrpo_verl.algorithms.alignment import (  # noqa: E402
    BORROWED,
    DUPLICATE,
    ORIGINAL,
    PADDING,
    AlignmentPlan,
    BatchAlignment,
    plan_resolved_alignment,
)
from mgrpo_verl.rowmeta import ROW_META, RowMeta  # noqa: E402
from mgrpo_verl.trainer import rollout_log  # noqa: E402
from mgrpo_verl.trainer.rollout_log import (  # noqa: E402
    DROPPED,
    DUPLICATED,
    ENV,
    KEPT,
    MODEL,
    alignment_fates,
    build_rows,
    decode_turns,
    extract_tool_calls,
    fate_label,
    log_sample_tables,
    read_rollouts,
    sample_rows,
    split_turns,
    write_rows,
)

HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="alert(1)">'


class CharTokenizer:
    """Token id i is the character ``chr(i)``; ids >= 0x110000 raise; ``SPECIAL`` is skipped on request."""

    SPECIAL = 1

    def __init__(self, tag: str = ""):
        self.tag = tag

    def decode(self, ids, skip_special_tokens=False):
        ids = [i for i in ids if not (skip_special_tokens and i == self.SPECIAL)]
        return self.tag + "".join("<|im_end|>" if i == self.SPECIAL else chr(i) for i in ids)


def enc(text: str) -> list[int]:
    return [ord(c) for c in text]


# ----------------------------------------------------------------------------------------------- turns


def test_split_turns_follows_the_response_mask():
    assert split_turns([1, 2, 3, 4, 5, 6], [1, 1, 0, 0, 1, 1]) == [(MODEL, [1, 2]), (ENV, [3, 4]), (MODEL, [5, 6])]
    assert split_turns([7, 8], [0, 0]) == [(ENV, [7, 8])]
    assert split_turns([], []) == []
    # a mask shorter than the ids counts as 0 for the rest
    assert split_turns([1, 2, 3], [1]) == [(MODEL, [1]), (ENV, [2, 3])]


def test_decode_turns_keeps_text_verbatim_and_reads_calls_of_model_turns_only():
    plan, obs, answer = "plan", f"Helper said: {HOSTILE}", '<tool_call>{"name": "ask_sub", "arguments": {"task": "x"}}</tool_call>'
    ids = enc(plan) + [CharTokenizer.SPECIAL] + enc(obs) + enc(answer) + [CharTokenizer.SPECIAL]
    mask = [1] * (len(plan) + 1) + [0] * len(obs) + [1] * (len(answer) + 1)
    turns = decode_turns(CharTokenizer(), ids, mask)
    assert [t["role"] for t in turns] == [MODEL, ENV, MODEL]
    assert turns[0]["text"] == "plan" and turns[0]["tokens"] == 5  # special token out of the text, counted
    assert turns[1]["text"] == obs and "tool_calls" not in turns[1]  # hostile text kept as it is, escaped later
    assert turns[2]["tool_calls"] == [{"name": "ask_sub", "arguments": {"task": "x"}}]
    # an environment span that looks like a call is not the model's call
    env_call = decode_turns(CharTokenizer(), enc(answer), [0] * len(answer))
    assert "tool_calls" not in env_call[0]


def test_decode_turns_survives_a_tokenizer_that_raises():
    class Broken:
        def decode(self, ids, skip_special_tokens=False):
            raise ValueError("id out of range")

    turns = decode_turns(Broken(), [5, 6, 7], [1, 1, 0])
    assert turns[0]["text"].startswith("<2 tokens the tokenizer could not decode") and turns[1]["tokens"] == 1


def test_decode_turns_with_the_tiny_tokenizer():
    from transformers import AutoTokenizer

    from mgrpo_verl.models.tiny import build_tiny_tokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_tokenizer())
    call = '<tool_call>{"name": "read_a", "arguments": {"k": 1}}</tool_call>'
    ids = tok.encode("ok " + call) + tok.encode("<|im_end|>")
    turns = decode_turns(tok, ids, [1] * len(ids))
    assert turns[0]["text"] == "ok " + call
    assert turns[0]["tool_calls"] == [{"name": "read_a", "arguments": {"k": 1}}]


# ------------------------------------------------------------------------------------------ tool calls


@pytest.mark.parametrize("text, expected", [
    ("no call at all", []),
    ('<tool_call>{"name": "f", "arguments": {"a": [1, 2]}}</tool_call>', [{"name": "f", "arguments": {"a": [1, 2]}}]),
    # arguments written as a JSON string: decoded
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', [{"name": "f", "arguments": {"a": 1}}]),
    # arguments as a string that is not JSON: kept as text
    ('<tool_call>{"name": "f", "arguments": "not json"}</tool_call>', [{"name": "f", "arguments": "not json"}]),
    # two calls, text around them
    ('a <tool_call>{"name": "f"}</tool_call> b <tool_call>{"name": "g", "arguments": {}}</tool_call>',
     [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]),
])
def test_extract_tool_calls(text, expected):
    assert extract_tool_calls(text) == expected


@pytest.mark.parametrize("body", [
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"arguments": {}}</tool_call>',  # no name
    '<tool_call>["f"]</tool_call>',
    '<tool_call>{"name": "f"',  # never closed
    f'<tool_call>{HOSTILE}</tool_call>',
    "<tool_call>" + "[" * 100_000 + "</tool_call>",  # longer than the parser reads
    "<tool_call>" + "[" * 5_000 + "]" * 5_000 + "</tool_call>",  # nested deeper than the JSON decoder goes
    '<tool_call>{"name": "f", "arguments": {"n": 1' + "0" * 5_000 + "}}</tool_call>",  # an int too long to read
])
def test_extract_tool_calls_keeps_what_it_cannot_read_as_raw_text(body):
    calls = extract_tool_calls(body)
    assert len(calls) == 1 and calls[0]["name"] == "" and calls[0]["error"], calls
    assert calls[0]["raw"] == body.removeprefix("<tool_call>").removesuffix("</tool_call>")[:rollout_log.RAW_CHARS]


# ------------------------------------------------------------------------------------------- alignment


def hand_plan() -> BatchAlignment:
    """The plan of the module docstring."""
    source = np.array([[[0, 2], [3, 3]], [[1, 1], [-1, -1]]])
    kind = np.array([[[ORIGINAL, ORIGINAL], [ORIGINAL, DUPLICATE]], [[BORROWED, BORROWED], [PADDING, PADDING]]], dtype=np.int8)
    plan = AlignmentPlan(source=source, kind=kind, calls=np.array([[3, 1], [0, 0]]), d_max=2)
    return BatchAlignment(main_rows=np.array([0, 1]), sub_rows=np.array([2, 3, 4, 5]), sub_agent=np.array([0, 0, 0, 1]),
                          agent_names=np.array(["a", "b"], dtype=object), plan=plan)


def test_alignment_fates_of_a_hand_built_plan():
    fates = alignment_fates(6, hand_plan())
    assert fates == [
        {"kind": KEPT, "d_max": 2},
        {"kind": KEPT, "d_max": 2, "borrowed_in": {"a": 2}, "padding": {"b": 2}},
        {"kind": KEPT, "copies": 0, "borrowed": 0, "d_max": 2},
        {"kind": DROPPED, "copies": 0, "borrowed": 2, "d_max": 2},
        {"kind": KEPT, "copies": 0, "borrowed": 0, "d_max": 2},
        {"kind": DUPLICATED, "copies": 1, "borrowed": 0, "d_max": 2},
    ]
    assert [fate_label(f) for f in fates] == ["kept", "kept", "kept", "dropped, borrowed x2", "kept", "duplicated x1"]
    assert fate_label(None) == ""
    assert alignment_fates(2, None) == [{"kind": KEPT}, {"kind": KEPT}]


def test_alignment_fates_account_for_every_slot_of_a_real_plan():
    # 2 main rows of one query; m0 calls "a" three times, m1 never: with D_max = 2, m0 keeps 2 and drops 1,
    # m1 borrows 2; whatever the draws, each slot is counted once
    parent = np.array([-1, -1, 0, 0, 0])
    alignment = plan_resolved_alignment(parent, np.array(["main", "main", "a", "a", "a"], dtype=object),
                                        np.array(["q"] * 5, dtype=object), 2, seed=3)
    fates = alignment_fates(5, alignment)
    subs = fates[2:]
    assert sorted(f["kind"] for f in subs) == [DROPPED, KEPT, KEPT]
    assert sum(f["borrowed"] for f in subs) == 2 == fates[1]["borrowed_in"]["a"]
    assert "borrowed_in" not in fates[0]


# ----------------------------------------------------------------------------------------------- rows


def meta(agent, traj, parent, score, **kw) -> dict:
    return {ROW_META: RowMeta(agent=agent, traj_id=traj, parent_traj_id=parent, score=score, **kw).write()}


def step_fields():
    """A main row (plan, observation, answer) and its sub row, plus a row no multi-agent loop wrote."""
    keys = ["q_0_1", "q_0_0", "q_1_0"]
    main_resp = enc("plan") + enc("Helper said: 7") + enc("7")
    fields = {
        "uid": ["q", "q", "q"],
        "extra_fields": [
            {**meta("main", "q/0/main", "", 1.0, calls=1), "reward_extra_info": {"acc": 1.0, "answer": HOSTILE, "x": float("nan")}},
            {**meta("sub", "q/0/sub/0", "q/0/main", 0.5), "reward_extra_info": {"acc": 1.0}},
            {"reward_extra_info": {}},
        ],
        "prompts": [enc("main prompt"), enc("sub prompt"), enc("p")],
        "responses": [main_resp, enc("7"), enc("r")],
        "response_mask": [[1] * 4 + [0] * 14 + [1], [1], [1]],
        "reward_model": [{"ground_truth": "7"}, {"ground_truth": "7"}, None],
    }
    return keys, fields


def test_build_rows_training():
    keys, fields = step_fields()
    tokenizers = {"main": CharTokenizer("M:"), "sub": CharTokenizer("S:")}
    rows = build_rows(3, "train", keys, fields, lambda a: tokenizers.get(a, CharTokenizer("?:")),
                      advantage=[0.25, -0.5, float("nan")], fates=[{"kind": KEPT}] * 3, trainable=lambda a: a == "main")
    main, sub, stray = rows
    assert {k: main[k] for k in ("step", "split", "key", "uid", "traj_id", "parent_traj_id", "agent", "score", "advantage",
                                 "calls", "failed_calls", "trainable", "ground_truth")} == {
        "step": 3, "split": "train", "key": "q_0_1", "uid": "q", "traj_id": "q/0/main", "parent_traj_id": "",
        "agent": "main", "score": 1.0, "advantage": 0.25, "calls": 1, "failed_calls": 0, "trainable": True,
        "ground_truth": "7"}
    assert main["prompt"] == "M:main prompt" and main["prompt_tokens"] == 11
    assert [(t["role"], t["text"]) for t in main["turns"]] == [(MODEL, "M:plan"), (ENV, "M:Helper said: 7"), (MODEL, "M:7")]
    # the rollout's statistics on the main row only, NaN as null
    assert main["reward_extra_info"] == {"acc": 1.0, "answer": HOSTILE, "x": None} and "reward_extra_info" not in sub
    # the sub row decoded with the sub-agent's own tokenizer, its own score
    assert sub["prompt"] == "S:sub prompt" and sub["score"] == 0.5 and sub["parent_traj_id"] == "q/0/main"
    assert sub["trainable"] is False and sub["advantage"] == -0.5
    # a row without the row contract does not fail the dump; a NaN advantage is null
    assert stray["agent"] == "?" and stray["traj_id"] == "q_1_0" and "extra_fields" in stray["error"]
    assert stray["advantage"] is None and "ground_truth" not in stray


def test_build_rows_validation_has_no_advantage_and_no_fate():
    keys, fields = step_fields()
    rows = build_rows(0, "val", keys[:2], {k: v[:2] for k, v in fields.items()}, lambda a: CharTokenizer())
    assert [(r["split"], r["advantage"], r["fate"]) for r in rows] == [("val", None, None)] * 2
    assert "trainable" not in rows[0]


def test_read_rollouts_from_transfer_queue(monkeypatch):
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    store = fake_tq.install(monkeypatch)
    keys, fields = step_fields()
    keys, n = keys[:2], 2
    rows = [{"uid": fields["uid"][i], "extra_fields": fields["extra_fields"][i], "reward_model": fields["reward_model"][i],
             "prompts": torch.tensor(fields["prompts"][i]), "responses": torch.tensor(fields["responses"][i]),
             "response_mask": torch.tensor(fields["response_mask"][i])} for i in range(n)]
    store.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(rows))
    got = read_rollouts(keys, "train", 1, "train", lambda a: CharTokenizer(), advantage=[1.0, 2.0], fates=[{"kind": KEPT}] * 2)
    assert [r["traj_id"] for r in got] == ["q/0/main", "q/0/sub/0"]
    assert [len(r["turns"]) for r in got] == [3, 1] and got[0]["turns"][1]["text"] == "Helper said: 7"
    assert read_rollouts([], "train", 1, "train", lambda a: CharTokenizer()) == []


def test_write_rows_is_json_lines_any_text_included(tmp_path):
    keys, fields = step_fields()
    rows = build_rows(2, "train", keys, fields, lambda a: CharTokenizer(), advantage=[0.0] * 3, fates=[None] * 3)
    rows[0]["turns"][0]["text"] += "\ud800 lone surrogate, 中文"
    path = write_rows(rows, rollout_log.dump_path(str(tmp_path / "dump"), 2, "train"))
    assert path == str(tmp_path / "dump" / "2.jsonl") and not Path(path + ".tmp").exists()
    back = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert back == rows
    assert rollout_log.dump_path("d", 4, "val") == "d/agents/4.jsonl"


def test_sample_recorder_reads_each_sampled_batch_and_forwards_the_rest():
    class Buffer:
        other = "attribute"

        def sample(self, global_steps, partition_id, batch_size):
            return KVBatchMeta(keys=[f"k{global_steps}"], tags=[{}], partition_id=partition_id), {"m": 1}

    recorder = rollout_log.SampleRecorder(Buffer(), lambda batch: [{"key": k} for k in batch.keys])
    batch, metrics = recorder.sample(global_steps=4, partition_id="val", batch_size=1)
    recorder.sample(global_steps=5, partition_id="val", batch_size=1)
    assert batch.keys == ["k4"] and metrics == {"m": 1} and recorder.other == "attribute"
    assert recorder.rows == [{"key": "k4"}, {"key": "k5"}]


# ---------------------------------------------------------------------------------------------- trackers


def many_rows() -> list[dict]:
    """3 rollouts (main m0..m2), each with 2 sub calls; the sub rows of m2 sort first by key."""
    rows = []
    for m in range(3):
        rows.append({"step": 1, "key": f"q_{m}_9", "agent": "main", "traj_id": f"q/{m}/main", "parent_traj_id": "",
                     "score": 1.0, "advantage": 0.5, "fate": {"kind": KEPT}, "prompt": "p", "turns": [{"role": MODEL, "text": HOSTILE}]})
        for j in range(2):
            rows.append({"step": 1, "key": f"a{2 - m}_{j}", "agent": "sub", "traj_id": f"q/{m}/sub/{j}",
                         "parent_traj_id": f"q/{m}/main", "score": 0.0, "advantage": -1.0,
                         "fate": {"kind": DUPLICATED, "copies": 1}, "prompt": "sp", "turns": [{"role": MODEL, "text": "x"}]})
    return rows


def test_sample_rows_keeps_the_trees_of_the_chosen_rollouts():
    got = sample_rows(many_rows(), per_agent=2)
    assert [r["traj_id"] for r in got["main"]] == ["q/0/main", "q/1/main"]
    # the sub-agent's calls of m0 and m1 come first, though m2's sort first by key
    assert {r["parent_traj_id"] for r in got["sub"]} <= {"q/0/main", "q/1/main"} and len(got["sub"]) == 2


def test_log_sample_tables_through_verls_tracking(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from verl.utils.tracking import Tracking

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    tracking = Tracking("p", "e", default_backend=["console", "wandb", "tensorboard"], config={"trainer": {}})
    wandb = tracking.logger["wandb"]
    logged = []
    monkeypatch.setattr(wandb, "log", lambda data, step: logged.append((data, step)))
    try:
        assert log_sample_tables(tracking, many_rows(), "train", 7, per_agent=2) == ["wandb", "tensorboard"]
    finally:
        tracking.finish()
    (tables, step), = logged
    assert step == 7 and sorted(tables) == ["rollouts/train/main", "rollouts/train/sub"]
    main = tables["rollouts/train/main"]
    assert list(main.columns) == list(rollout_log.TABLE_COLUMNS) and len(main.data) == 2
    assert main.data[0][:7] == [1, "main", "q/0/main", "", 1.0, 0.5, "kept"] and HOSTILE in main.data[0][8]
    assert tables["rollouts/train/sub"].data[0][6] == "duplicated x1"
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert sorted(events.Tags()["tensors"]) == ["rollouts/train/main/text_summary", "rollouts/train/sub/text_summary"]
    (text,) = events.Tensors("rollouts/train/main/text_summary")
    body = text.tensor_proto.string_val[0].decode()
    assert text.step == 7 and "### q/0/main" in body and "    [model] " + HOSTILE in body  # verbatim (indented) block


def test_log_sample_tables_is_best_effort():
    class Writer:
        def add_text(self, *args):
            raise OSError("disk full")

    class Board:
        writer = Writer()

    class Tracking:
        logger = {"console": object(), "tensorboard": Board()}

    assert log_sample_tables(Tracking(), many_rows(), "val", 1) == []  # logged as a warning, never raised
    assert log_sample_tables(type("T", (), {"logger": {"console": 1}})(), many_rows(), "val", 1) == []
    assert log_sample_tables(None, many_rows(), "val", 1) == []


# ---------------------------------------------------------------------------------------------- the trainer


def bare_trainer(**config):
    """A MultiAgentTrainer without its setup: the attributes the dump methods read."""
    from concurrent.futures import ThreadPoolExecutor

    from omegaconf import OmegaConf

    from mgrpo_verl.trainer.per_agent import MultiAgentTrainer

    trainer = MultiAgentTrainer.__new__(MultiAgentTrainer)
    trainer.config = OmegaConf.create({"trainer": config})
    trainer.global_steps, trainer.step_rows = 3, None
    trainer._dump_executor, trainer._dump_futures = ThreadPoolExecutor(1), []
    return trainer


def test_a_step_without_step_rows_gets_verls_dump(monkeypatch):
    """The decoupled sub side keeps no StepRows (nor does a step of an older step): verl's own dump runs."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    calls = []
    monkeypatch.setattr(PPOTrainer, "_log_rollout_data", lambda self, batch, timing_raw, rollout_data_dir: calls.append(rollout_data_dir))
    trainer = bare_trainer()
    trainer._log_rollout_data(KVBatchMeta(keys=[], tags=[], partition_id="train"), {}, "d")
    trainer.step_rows = rollout_log.StepRows(2, "train", None, np.zeros(0), None)  # the step before
    trainer._log_rollout_data(KVBatchMeta(keys=[], tags=[], partition_id="train"), {}, "d")
    assert calls == ["d", "d"]


@pytest.mark.parametrize("fails", [False, True])
def test_validate_records_validation_rows_while_verl_samples_them(monkeypatch, tmp_path, fails):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    class Buffer:
        def sample(self, global_steps, partition_id, batch_size):
            return KVBatchMeta(keys=["v_0_0"], tags=[{}], partition_id=partition_id), {}

    seen = []

    def verl_validate(self):  # what verl's _validate does with the buffer: samples a batch (then clears it)
        seen.append(self.replay_buffer)
        self.replay_buffer.sample(global_steps=self.global_steps, partition_id="val", batch_size=1)
        if fails:
            raise RuntimeError("validation failed")
        return {"val-core/x": 1.0}

    monkeypatch.setattr(PPOTrainer, "_validate", verl_validate)
    trainer = bare_trainer(validation_data_dir=str(tmp_path / "val"))
    buffer = trainer.replay_buffer = Buffer()
    monkeypatch.setattr(trainer, "_read_validation_rows", lambda batch: [{"key": k, "split": "val"} for k in batch.keys], raising=False)
    if fails:
        with pytest.raises(RuntimeError):
            trainer._validate()
    else:
        assert trainer._validate() == {"val-core/x": 1.0}
        trainer._dump_executor.shutdown(wait=True)
        assert read_lines(tmp_path / "val" / "agents" / "3.jsonl") == [{"key": "v_0_0", "split": "val"}]
    assert isinstance(seen[0], rollout_log.SampleRecorder)
    assert trainer.replay_buffer is buffer  # restored, also when verl's validation raised
    if not fails:  # without the key: verl's validation alone, on the buffer itself
        plain = bare_trainer()
        plain.replay_buffer = buffer
        assert plain._validate() == {"val-core/x": 1.0} and seen[-1] is buffer


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
