"""The reward per sub-agent (issue 31): a scorer that takes the keyword ``agent`` is told which agent wrote the text
(inspected once, at load: ``relay.accepts_agent``, ``DelegationSettings.scorer_takes_agent``), so alice can be paid
for part A and bob for part B; ``f(role, text, ground_truth)`` scorers are called exactly as before. Checked on the
rows ``common.score_trajectory`` produces, by hand."""

from __future__ import annotations

from omegaconf import OmegaConf

from mgrpo_verl.agent_loops import common
from mgrpo_verl.envs import relay

GROUND_TRUTH = "37"  # part A is "3" (alice's tool reads it), part B is "7" (bob's)


def per_agent(role, text, ground_truth, agent):
    """Main: the whole answer. alice: part A only; bob: part B only; any other agent: nothing."""
    if role == "main":
        return 1.0 if text.strip() == ground_truth else 0.0
    part = {"alice": ground_truth[0], "bob": ground_truth[1]}.get(agent)
    return 1.0 if part is not None and text.strip() == part else 0.0


def _score(scorer, reports, answer="37", main="planner"):
    settings = common.DelegationSettings(main=main, sub_agents=("alice", "bob"), scorer=scorer)
    return settings, common.score_trajectory(settings, {"extra_info": {}}, "u/0", answer, GROUND_TRUTH, reports)


REPORTS = [
    common.SubReport("alice", 0, "3"),  # alice's part: paid
    common.SubReport("bob", 0, "7"),  # bob's part: paid
    common.SubReport("alice", 1, "7"),  # bob's part reported by alice: not alice's, 0
    common.SubReport("bob", 1, "3"),  # alice's part reported by bob: 0
    common.SubReport("bob", 2, None),  # a failed call: no row
]


def test_two_sub_agents_scored_differently_by_one_scorer():
    settings, scored = _score(per_agent, REPORTS)
    assert settings.scorer_takes_agent
    subs = [(m.agent, m.traj_id, m.score) for m in scored.subs if m is not None]
    assert subs == [("alice", "u/0/alice/0", 1.0), ("bob", "u/0/bob/0", 1.0),
                    ("alice", "u/0/alice/1", 0.0), ("bob", "u/0/bob/1", 0.0)]
    assert scored.subs[-1] is None
    assert (scored.main.agent, scored.main.score, scored.score) == ("planner", 1.0, 1.0)
    assert scored.reward_extra_info["reward/errors"] == 0


def test_the_scorer_sees_each_texts_agent_and_the_main_agents_name():
    seen = []

    def recorder(role, text, ground_truth, *, agent):
        seen.append((role, agent, text))
        return 0.0

    _score(recorder, REPORTS[:2], answer="x")
    assert seen == [("main", "planner", "x"), ("sub", "alice", "3"), ("sub", "bob", "7")]


def test_three_argument_scorers_are_called_as_before():
    seen = []

    def old(role, text, ground_truth):
        seen.append((role, text))
        return 0.5

    def with_kwargs(role, text, ground_truth, **extra):  # **kwargs does not opt in: called as before
        seen.append(extra)
        return 0.5

    settings, scored = _score(old, REPORTS[:2])
    assert not settings.scorer_takes_agent and seen == [("main", "37"), ("sub", "3"), ("sub", "7")]
    assert [m.score for m in scored.subs] == [0.5, 0.5]
    seen.clear()
    settings, _ = _score(with_kwargs, REPORTS[:1])
    assert not settings.scorer_takes_agent and seen == [{}, {}]
    assert not relay.accepts_agent(relay.default_scorer) and not relay.accepts_agent(len)


def test_a_file_scorer_with_agent_from_the_config_and_a_failing_one(tmp_path):
    path = tmp_path / "scores.py"
    path.write_text("def score(role, text, ground_truth, agent=None):\n"
                    "    if agent == 'bob':\n        raise RuntimeError('bob has no scorer')\n"
                    "    return {'main': 1.0, 'alice': 0.25}[agent]\n")
    config = OmegaConf.create({"multi_agent": {"main": "main", "agents": {"main": {}, "alice": {}, "bob": {}},
                                               "delegation": {"scorer": f"{path}:score"}}})
    settings = common.DelegationSettings.from_config(config)
    assert settings.scorer_takes_agent and settings.sub_agents == ("alice", "bob")
    scored = common.score_trajectory(settings, {}, "u/1", "a", "g", REPORTS[:2])
    assert [m.score for m in scored.subs] == [0.25, 0.0]  # bob's score raised: 0, counted
    assert scored.main.score == 1.0 and scored.reward_extra_info["reward/errors"] == 1
