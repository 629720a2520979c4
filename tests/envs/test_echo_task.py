"""The embedded echo task: reward values by hand, dataset layout."""

from __future__ import annotations

import pandas as pd
import pytest

from mgrpo_verl.envs import echo


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("77777777", 1.0),  # 8 right digits / 8
        ("7777777777", 1.0),  # only the first 8 characters count
        ("7", 1 / 8),  # one right digit, the rest of the window empty
        ("12", 0.25 * 2 / 8),  # two wrong digits at 0.25 each
        ("7a3 ", (1 + 0 + 0.25) / 8),  # stripped to "7a3": 1 + 0 + .25
        ("hello", 0.0),
        ("   ", 0.0),  # empty after strip
        ("", 0.0),
    ],
)
def test_score_by_hand(answer, expected):
    assert echo.compute_score(echo.DATA_SOURCE, answer, "7") == pytest.approx(expected)


def test_score_rejects_foreign_data_and_bad_ground_truth():
    with pytest.raises(ValueError, match="other/source"):
        echo.compute_score("other/source", "7", "7")
    with pytest.raises(ValueError, match="'77'"):
        echo.compute_score(echo.DATA_SOURCE, "7", "77")


def test_dataset_layout_and_determinism(tmp_path):
    train, val = echo.write_dataset(tmp_path, n_train=20, n_val=5, seed=3)
    df = pd.read_parquet(train)
    assert len(df) == 20 and len(pd.read_parquet(val)) == 5
    row = df.iloc[0]
    assert row["data_source"] == echo.DATA_SOURCE
    digit = row["reward_model"]["ground_truth"]
    assert row["prompt"][0]["content"] == f"Repeat the digit {digit}."
    again, _ = echo.write_dataset(tmp_path / "again", n_train=20, n_val=5, seed=3)
    pd.testing.assert_frame_equal(df, pd.read_parquet(again))
