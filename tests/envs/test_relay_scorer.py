"""``multi_agent.delegation.scorer``: how the relay loop scores rows (mgrpo_verl/envs/relay.py)."""

import pytest

from mgrpo_verl.envs import relay


def test_default_scorer_is_the_relay_task():
    # "7777": 4 right digits in the 8-character window -> 4 / 8 = 0.5 for either role
    assert relay.load_scorer(None)("main", "7777", "7") == relay.main_score("7777", "7") == 0.5
    assert relay.load_scorer("")("sub", "7777", "7") == relay.sub_local_score("7777", "7") == 0.5


def test_module_and_file_scorers(tmp_path):
    f = tmp_path / "my_scorer.py"
    f.write_text("def score(role, text, gt):\n    return 1.0 if role == 'main' else len(text) / 10\n")
    scorer = relay.load_scorer(f"{f}:score")
    assert scorer("main", "abc", "1") == 1.0 and scorer("sub", "abcde", "1") == 0.5
    assert relay.load_scorer("mgrpo_verl.envs.relay:default_scorer") is relay.default_scorer


@pytest.mark.parametrize(
    "spec, match",
    [("no_colon", "must be"), ("mgrpo_verl.envs.relay:nope", "no function"), ("not_a_module_xyz:f", "No module"),
     ("/nonexistent/file.py:f", "scorer")],
)
def test_bad_scorer_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        relay.load_scorer(spec)


@pytest.mark.parametrize("text", ["７", "٧", "²", "߇", "𝟕"])
def test_exact_scorer_gives_no_format_credit_to_non_ascii_digits(text):
    # issue 29 item 5: str.isdigit() is True for a fullwidth 7, an Arabic-Indic 7, a superscript 2, an NKo 7
    # and a mathematical bold 7, so each earned EXACT_FORMAT_CREDIT as "another single digit"; the task's
    # digits are ASCII (and "7" itself still scores 1, another ASCII digit the credit)
    assert text.isdigit() and len(text) == 1
    assert relay.exact_scorer("main", text, "7") == 0.0
    assert relay.exact_scorer("main", "7", "7") == 1.0
    assert relay.exact_scorer("main", "3", "7") == relay.EXACT_FORMAT_CREDIT
