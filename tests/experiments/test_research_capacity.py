"""The research capacity probe's pieces: shapes, the evidence each mode shows, the report."""

from __future__ import annotations

import pytest

from mgrpo_verl.experiments import research_capacity as rc


def test_a_shape_is_layers_by_hidden_with_heads_of_16_dimensions():
    # 4x128: 4 layers, hidden 128 -> 128 / 16 = 8 heads, 4 KV heads, MLP 4 * 128 = 512
    assert rc.parse_shape("4x128") == {"num_hidden_layers": 4, "hidden_size": 128, "intermediate_size": 512,
                                       "num_attention_heads": 8, "num_key_value_heads": 4}  # fmt: skip
    # the built-in tiny shape: 64 / 16 = 4 heads, 2 KV heads, as tiny_qwen2_config has them
    assert rc.parse_shape(rc.TINY_SHAPE)["num_attention_heads"] == 4
    for bad in ("4", "4x", "x64", "0x64", "2x48", "two"):
        with pytest.raises(ValueError, match="shape"):
            rc.parse_shape(bad)


def test_the_page_mode_shows_the_answer_and_the_visit_call_the_rollout_would_make():
    data = rc.examples(3, 3, seed=0, evidence="page")
    for row in data["train"] + data["val"]:
        call, page = row["messages"][-2], row["messages"][-1]
        assert call["tool_calls"][0]["function"]["name"] == "visit" and page["role"] == "tool"
        assert row["answer_in_prompt"] and row["target"] == f"Answer: {row['answers'][0]}"
        # the page's second line is the description (corpus.page_text)
        assert page["content"].split("\n")[2] == row["answers"][0]


def test_the_hits_mode_is_the_cpu_recipes_prompt():
    from mgrpo_verl.envs.research import prompts

    row = rc.examples(1, 1, seed=0, evidence="hits")["val"][0]
    question = row["messages"][0]["content"].split("Task: ")[1].split("\n")[0]
    assert row["messages"] == prompts.sub_messages_with_evidence("sub", question)
    with pytest.raises(ValueError, match="evidence must be one of"):
        rc.examples(1, 1, seed=0, evidence="web")


def test_the_report_gives_start_end_and_best_of_each_shape():
    curve = [{"step": 0, "f1": 0.0, "em": 0.0}, {"step": 10, "f1": 0.5, "em": 0.25}, {"step": 20, "f1": 0.4, "em": 0.125}]
    setting = {"n_train": 10, "n_val": 4, "seed": 0, "evidence": "page", "batch": 2, "lr": 1e-3, "seconds": 5.0,
               "answer_in_prompt_val": 1.0, "median_prompt_tokens": 400, "median_target_tokens": 12}  # fmt: skip
    md = rc.report({"setting": setting, "shapes": [{"shape": "2x64", "parameters": 260_000, "steps": 20, "curve": curve}]})
    assert "| 2x64 | 0.26 M | 20 | 0.000 / 0.400 (0.500) | 0.125 (0.250) |" in md
    assert "appears verbatim in 100% of the held-out prompts" in md
