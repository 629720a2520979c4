"""The relay task: scores by hand, prompts, dataset layout, registration."""

from __future__ import annotations

import pandas as pd
import pytest

from mgrpo_verl.envs import builtin, relay, rewards


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("44444444", 1.0),  # 8 right digits in the 8-character window: 8 / 8
        ("4444", 4 / 8),  # 4 right digits, rest of the window empty: 0.5
        ("43", (1 + 0.25) / 8),  # right digit 1, wrong digit 0.25: 0.15625
        (" 4x9 ", (1 + 0 + 0.25) / 8),  # stripped to "4x9": 1 + 0 + 0.25
        ("Helper", 0.0),  # no digit at all
        ("", 0.0),
    ],
)
def test_main_and_sub_scores_by_hand(answer, expected):
    assert relay.main_score(answer, "4") == pytest.approx(expected)
    assert relay.sub_local_score(answer, "4") == pytest.approx(expected)
    assert relay.compute_score(relay.DATA_SOURCE, answer, "4") == pytest.approx(expected)


def test_compute_score_rejects_foreign_data_source_and_bad_digit():
    with pytest.raises(ValueError, match="other/source"):
        relay.compute_score("other/source", "4", "4")
    with pytest.raises(ValueError, match="'42'"):
        relay.compute_score(relay.DATA_SOURCE, "4", "42")


def test_prompts():
    main_prompt = "Ask your helper for the secret digit, then write it."
    assert relay.main_messages() == [{"role": "user", "content": main_prompt}]
    assert relay.sub_messages("3", "ask") == [
        {"role": "user", "content": "The secret digit is 3. Repeat the digit 3.\nRequest: ask"}
    ]


def test_dataset_layout_and_determinism(tmp_path):
    train, val = relay.write_dataset(tmp_path, n_train=20, n_val=5, seed=3)
    df = pd.read_parquet(train)
    assert len(df) == 20 and len(pd.read_parquet(val)) == 5
    assert set(df.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info", "agent_name"}
    assert (df["agent_name"] == "mgrpo_relay").all()
    assert (df["data_source"] == relay.DATA_SOURCE).all()
    digits = {row["ground_truth"] for row in df["reward_model"]}
    assert len(digits) > 1 and all(len(g) == 1 and g.isdigit() for g in digits)
    for prompt in df["prompt"]:
        (message,) = prompt
        assert message["role"] == "user" and message["content"] == relay.MAIN_PROMPT
        assert not any(c.isdigit() for c in message["content"])  # the main agent never sees the digit
    row = df.iloc[7]
    assert row["reward_model"]["style"] == "rule"
    assert dict(row["extra_info"]) == {"split": "train", "index": 7}
    again, _ = relay.write_dataset(tmp_path / "again", n_train=20, n_val=5, seed=3)
    pd.testing.assert_frame_equal(df, pd.read_parquet(again))


def test_registered_as_builtin_task_and_scorer():
    assert builtin.TASKS["relay"] is relay.write_dataset
    assert rewards.compute_score(relay.DATA_SOURCE, "4", "4") == pytest.approx(1 / 8)
