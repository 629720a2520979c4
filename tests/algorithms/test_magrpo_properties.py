"""Property tests of MAGRPO over random joint-action trees (hypothesis).

A batch: 1-3 tasks, each a tree of up to ``num_turns`` = 1-3 turns with 1-4 children per expanded node
and random early termination; 1-3 agents, one row per agent per node, rows shuffled.
"""

from __future__ import annotations

import collections

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl import compute_magrpo_advantage
from mgrpo_verl.testing import make_batch


def random_forest(seed: int, n_agents: int, num_turns: int, branching: int, discrete: bool):
    rng = np.random.default_rng(seed)
    nodes = []  # (uid, node_id, parent, turn, reward)
    for u in range(int(rng.integers(1, 4))):
        frontier = [("", 0)]
        counter = 0
        while frontier:
            parent, turn = frontier.pop()
            for _ in range(branching):
                counter += 1
                nid = f"n{counter}"
                r = float(rng.choice([0.0, 1.0])) if discrete else float(rng.normal())
                nodes.append((f"q{u}", nid, parent, turn, r))
                # expand unless at the last turn or terminated early (prob .3)
                if turn + 1 < num_turns and rng.random() > 0.3:
                    frontier.append((nid, turn + 1))
    rows = [(*node, f"agent{a}") for node in nodes for a in range(n_agents)]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    uid, nid, parent, turn, reward, agent = (list(c) for c in zip(*rows))
    length = 3
    data = make_batch(
        reward,
        response_length=length,
        mask_lengths=rng.integers(1, length + 1, size=len(rows)).tolist(),
        uid=uid,
        node_id=nid,
        parent_node_id=parent,
        turn=turn,
        agent=agent,
    )
    return data, nodes


def reference_returns(nodes, gamma):
    """Plain recursive R(node) = r + gamma * mean(R(children)), leaf R = r."""
    children = collections.defaultdict(list)
    reward = {}
    for uid, nid, parent, _, r in nodes:
        reward[(uid, nid)] = np.float32(r).item()  # rewards are stored as float32
        children[(uid, parent)].append((uid, nid))

    def ret(key):
        kids = children.get(key, [])
        return reward[key] + (gamma * float(np.mean([ret(c) for c in kids])) if kids else 0.0)

    return {key: ret(key) for key in reward}


trees = st.fixed_dictionaries(
    dict(
        seed=st.integers(0, 2**32 - 1),
        n_agents=st.integers(1, 3),
        num_turns=st.integers(1, 3),
        branching=st.integers(1, 4),
        discrete=st.booleans(),
        gamma=st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    )
)


def node_values(data):
    """{(uid, node_id): (advantage, return)} from the rows, checking all agents' rows agree."""
    uid = np.asarray(data.non_tensor_batch["uid"]).tolist()
    nid = np.asarray(data.non_tensor_batch["node_id"]).tolist()
    adv = data.batch["advantages"][:, 0].double().tolist()
    ret = data.batch["returns"][:, 0].double().tolist()
    out = {}
    for key, a, r in zip(zip(uid, nid), adv, ret):
        if key in out:
            assert out[key] == (a, r), "every agent's row at a node gets the node's values"
        out[key] = (a, r)
    return out


@settings(max_examples=80, deadline=None)
@given(trees)
def test_mean_baseline_sibling_advantages_sum_to_zero(p):
    data, nodes = random_forest(p["seed"], p["n_agents"], p["num_turns"], p["branching"], p["discrete"])
    out = compute_magrpo_advantage(data, {"gamma": p["gamma"], "baseline": "mean"})
    values = node_values(out)
    groups = collections.defaultdict(list)
    for uid, nid, parent, _, _ in nodes:
        groups[(uid, parent)].append(values[(uid, nid)][0])
    for key, advs in groups.items():
        assert abs(sum(advs)) <= 1e-4 * max(1.0, max(abs(a) for a in advs)) * len(advs), (key, advs)
    # returns follow the recursion
    ref = reference_returns(nodes, p["gamma"])
    for key, (_, r) in values.items():
        assert r == np.float32(ref[key]).item() or abs(r - ref[key]) <= 1e-5 * max(1.0, abs(ref[key]))


@settings(max_examples=60, deadline=None)
@given(trees)
def test_gamma_zero_returns_equal_rewards(p):
    data, _ = random_forest(p["seed"], p["n_agents"], p["num_turns"], p["branching"], p["discrete"])
    rewards, mask = data.batch["token_level_rewards"].clone(), data.batch["response_mask"]
    out = compute_magrpo_advantage(data, {"gamma": 0.0})
    torch.testing.assert_close(out.batch["returns"], rewards.sum(-1, keepdim=True) * mask)


@settings(max_examples=60, deadline=None)
@given(trees, st.sampled_from(["mean", "max", "rloo", "raw"]), st.booleans())
def test_baselines_relations(p, baseline, norm):
    data, nodes = random_forest(p["seed"], p["n_agents"], p["num_turns"], p["branching"], p["discrete"])
    cfg = {"gamma": p["gamma"], "baseline": baseline, "norm_adv_by_std": norm}
    out = compute_magrpo_advantage(data, cfg)
    values = node_values(out)
    mask = out.batch["response_mask"]
    # both outputs are the node scalar times the row's mask
    assert torch.equal(out.batch["advantages"], out.batch["advantages"][:, :1] * mask)
    assert torch.equal(out.batch["returns"], out.batch["returns"][:, :1] * mask)
    groups = collections.defaultdict(list)
    for uid, nid, parent, _, _ in nodes:
        groups[(uid, parent)].append(values[(uid, nid)])
    for sib in groups.values():
        a = np.array([v[0] for v in sib])
        r = np.array([v[1] for v in sib])
        n = len(r)
        if n > 1:
            scale = (np.std(r, ddof=1) + 1e-6) if norm else 1.0
        else:
            scale = (1.0 + 1e-6) if norm else 1.0
        if baseline == "mean":
            expected = (r - r.mean()) / scale
        elif baseline == "max":
            expected = (r - r.max()) / scale
            assert (a <= 1e-6).all()  # nobody beats the best sibling
        elif baseline == "rloo":
            expected = (r - (r.sum() - r) / (n - 1)) / scale if n > 1 else np.zeros(1)
        else:
            expected = r / scale
        np.testing.assert_allclose(a, expected, rtol=1e-4, atol=1e-4)
