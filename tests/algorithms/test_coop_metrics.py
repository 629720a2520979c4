"""pass@k / acc@k / coop@k of MAGRPO's coding collaboration (mgrpo_verl/algorithms/coop_metrics.py).

Every expected value is worked out in the comment beside it; C(a, b) is the binomial coefficient.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo_verl.algorithms.coop_metrics import SampleRecord, acc_at_k, coop_at_k, pass_at_k, summarize_samples

# ------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_hand_values():
    # n=5, c=2, k=1: 1 - C(3,1)/C(5,1) = 1 - 3/5 = 0.4 (the plain success rate c/n)
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4, abs=1e-15)
    # k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9, abs=1e-15)
    # k=4: n - c = 3 < 4, every 4-subset holds a correct sample -> 1 exactly
    assert pass_at_k(5, 2, 4) == 1.0
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12 = 0.916666...
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12, rel=1e-14)


def test_pass_at_k_edges():
    # c = 0: no correct sample -> 0 for every k; c = n -> 1; k = n: 1 iff c >= 1
    assert [float(pass_at_k(4, 0, k)) for k in (1, 2, 3, 4)] == [0.0, 0.0, 0.0, 0.0]
    assert [float(pass_at_k(4, 4, k)) for k in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 1.0]
    assert float(pass_at_k(4, 1, 4)) == 1.0 and float(pass_at_k(4, 0, 4)) == 0.0
    # n = k = 1: the one sample decides
    assert float(pass_at_k(1, 1, 1)) == 1.0 and float(pass_at_k(1, 0, 1)) == 0.0


def test_pass_at_k_vectorised_and_scalar_types():
    # per problem (n, c) = (5, 2), (10, 3), (3, 0) with k = 2:
    # 1 - C(3,2)/C(5,2) = .7 ; 1 - C(7,2)/C(10,2) = 1 - 21/45 = 24/45 ; 1 - C(3,2)/C(3,2) = 0
    got = pass_at_k(np.array([5, 10, 3]), np.array([2, 3, 0]), 2)
    assert isinstance(got, np.ndarray) and got.shape == (3,) and got.dtype == np.float64
    np.testing.assert_allclose(got, [0.7, 24 / 45, 0.0], rtol=1e-14)
    # k broadcasts too: (5, 2) with k = 1, 2, 3 -> .4, .7, .9
    np.testing.assert_allclose(pass_at_k(5, 2, np.array([1, 2, 3])), [0.4, 0.7, 0.9], rtol=1e-14)
    assert isinstance(pass_at_k(5, 2, 1), np.floating)
    # whole floats are accepted as counts
    assert pass_at_k(5.0, 2.0, 2) == pytest.approx(0.7)


def test_pass_at_k_is_stable_for_large_n():
    # C(10000, 100) ~ 1e241 and C(200, 50) ~ 4.5e47: the product form never builds them.
    # n=200, c=3, k=50: exact 1 - C(197,50)/C(200,50) by rational arithmetic
    exact = 1 - Fraction(math.comb(197, 50), math.comb(200, 50))
    assert pass_at_k(200, 3, 50) == pytest.approx(float(exact), rel=1e-12)
    # n=10000, c=1, k=1 -> 1/10000; c=1, k=n -> 1
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-12)
    assert pass_at_k(10_000, 1, 10_000) == 1.0
    # n=10000, c=10, k=100: exact value, and no nan/inf
    exact = 1 - Fraction(math.comb(9990, 100), math.comb(10000, 100))
    got = pass_at_k(10_000, 10, 100)
    assert np.isfinite(got) and got == pytest.approx(float(exact), rel=1e-10)


@pytest.mark.parametrize(
    "n, c, k, err, match",
    [
        (5, 2, 6, ValueError, "k must be <= n"),
        (5, 6, 1, ValueError, "c must be <= n"),
        (-1, 0, 1, ValueError, "n must be >= 0"),
        (5, -1, 1, ValueError, "c must be >= 0"),
        (5, 2, 0, ValueError, "k must be >= 1"),
        (5, 2, -2, ValueError, "k must be >= 0"),
        (5, 2.5, 1, ValueError, "c must be whole numbers"),
        (float("nan"), 2, 1, ValueError, "n must be whole numbers"),
        ("5", 2, 1, TypeError, "n must be integer counts"),
        (5, True, 1, TypeError, "c must be integer counts"),
        ([5, 5], [1, 2, 3], 1, ValueError, "do not broadcast"),
        ([5, 5], [1, 6], 1, ValueError, "c=6 > n=5"),
    ],
)
def test_pass_at_k_bad_input(n, c, k, err, match):
    with pytest.raises(err, match=match):
        pass_at_k(n, c, k)


# ------------------------------------------------------------------------------------------- acc@k


def test_acc_at_k_first_and_all_hand_values():
    x = [[0.2, 0.5, 1.0, 0.0], [0.0, 0.0, 0.25, 0.0]]
    # first k=1: [.2, 0] ; k=2: max(.2,.5)=.5, max(0,0)=0 ; k=3: 1, .25 ; k=4: 1, .25
    np.testing.assert_allclose(acc_at_k(x, 1), [0.2, 0.0])
    np.testing.assert_allclose(acc_at_k(x, 2), [0.5, 0.0])
    np.testing.assert_allclose(acc_at_k(x, 3), [1.0, 0.25])
    # all, k=2, row 0: sorted (0, .2, .5, 1); P(max = i-th smallest) = C(i-1,1)/C(4,2) = 0, 1/6, 2/6, 3/6
    # -> (0*0 + .2*1 + .5*2 + 1*3) / 6 = 4.2/6 = .7 ; row 1: sorted (0,0,0,.25) -> .25*3/6 = .125
    np.testing.assert_allclose(acc_at_k(x, 2, "all"), [0.7, 0.125], rtol=1e-14)
    # all, k=1: the plain mean: (.2+.5+1+0)/4 = .425 ; .25/4 = .0625
    np.testing.assert_allclose(acc_at_k(x, 1, "all"), [0.425, 0.0625], rtol=1e-14)
    # k = n: the max, whatever the subset rule
    np.testing.assert_allclose(acc_at_k(x, 4, "all"), [1.0, 0.25], rtol=1e-14)


def test_acc_at_k_all_reduces_to_pass_at_k_on_binary_fractions():
    # fractions 0/1 with c = 2 ones out of n = 5: E[max over a k-subset] = pass@k = .4, .7, .9 for k = 1, 2, 3
    x = [[0.0, 1.0, 0.0, 1.0, 0.0]]
    for k, want in ((1, 0.4), (2, 0.7), (3, 0.9)):
        assert acc_at_k(x, k, "all")[0] == pytest.approx(want, rel=1e-14)


@pytest.mark.parametrize(
    "x, k, subset, err, match",
    [
        ([0.5, 1.0], 1, "first", ValueError, "shape"),
        ([[]], 1, "first", ValueError, "n >= 1"),
        ([[0.5, 1.2]], 1, "first", ValueError, r"in \[0, 1\], got 1.2"),
        ([[0.5, float("nan")]], 1, "first", ValueError, r"in \[0, 1\]"),
        ([[True, False]], 1, "first", TypeError, "numbers"),
        ([[0.5, 1.0]], 3, "first", ValueError, r"k must be in \[1, n=2\]"),
        ([[0.5, 1.0]], 0, "first", ValueError, "k must be in"),
        ([[0.5, 1.0]], 1.0, "first", TypeError, "k must be an int"),
        ([[0.5, 1.0]], 1, "best", ValueError, "subset"),
    ],
)
def test_acc_at_k_bad_input(x, k, subset, err, match):
    with pytest.raises(err, match=match):
        acc_at_k(x, k, subset)


# ------------------------------------------------------------------------------------------ coop@k


def test_coop_at_k_hand_values():
    passed = [[True, False, True, True], [True, True, False, False]]
    coop = [[False, True, True, False], [False, False, True, True]]
    # joint = passed & coop: row 0 (F, F, T, F), row 1 (F, F, F, F)
    # first k=2: row 0 none in (F, F) -> 0 ; k=3: T -> 1 ; row 1 never -> 0
    np.testing.assert_array_equal(coop_at_k(passed, coop, 2), [0.0, 0.0])
    np.testing.assert_array_equal(coop_at_k(passed, coop, 3), [1.0, 0.0])
    # all, k=2: c = 1 of n = 4 -> 1 - C(3,2)/C(4,2) = 1 - 3/6 = .5 ; row 1: c = 0 -> 0
    np.testing.assert_allclose(coop_at_k(passed, coop, 2, "all"), [0.5, 0.0], rtol=1e-14)
    # coop@k never exceeds pass@k: row 0 passes 3 of 4 -> pass@2 = 1 - C(1,2)/C(4,2) = 1 >= .5
    assert coop_at_k(passed, coop, 2, "all")[0] <= pass_at_k(4, 3, 2)


def test_coop_at_k_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        coop_at_k([[True, False]], [[True]], 1)
    with pytest.raises(TypeError, match="passed must be booleans"):
        coop_at_k([[1, 0]], [[True, False]], 1)
    with pytest.raises(ValueError, match="k must be in"):
        coop_at_k([[True]], [[True]], 2)


# --------------------------------------------------------------------- brute force over all k-subsets


@st.composite
def samples(draw):
    """(passed, fractions, cooperated, k) for one problem with n <= 8 samples."""
    n = draw(st.integers(1, 8))
    passed = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    coop = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    fractions = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    k = draw(st.integers(1, n))
    return passed, fractions, coop, k


@settings(max_examples=300, deadline=None)
@given(samples())
def test_estimators_equal_brute_force_enumeration(s):
    passed, fractions, coop, k = s
    n = len(passed)
    subsets = list(itertools.combinations(range(n), k))
    # pass@k = P(a uniformly random k-subset holds a passing sample)
    want_pass = np.mean([any(passed[i] for i in sub) for sub in subsets])
    assert pass_at_k(n, sum(passed), k) == pytest.approx(want_pass, abs=1e-12)
    # acc@k (all) = E[max fraction over the subset]
    want_acc = np.mean([max(fractions[i] for i in sub) for sub in subsets])
    assert acc_at_k([fractions], k, "all")[0] == pytest.approx(want_acc, abs=1e-12)
    # coop@k (all) = P(the subset holds a passing and cooperating sample)
    want_coop = np.mean([any(passed[i] and coop[i] for i in sub) for sub in subsets])
    assert coop_at_k([passed], [coop], k, "all")[0] == pytest.approx(want_coop, abs=1e-12)
    # first-k rules are the first subset of the enumeration (indices 0..k-1)
    assert acc_at_k([fractions], k)[0] == max(fractions[:k])
    assert coop_at_k([passed], [coop], k)[0] == float(any(p and q for p, q in zip(passed[:k], coop[:k])))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.data())
def test_pass_at_k_matches_exact_rational(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
    # monotone in k and in c
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-15
    if c < n:
        assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k) - 1e-15


# ------------------------------------------------------------------------------------ summarize_samples


def _records():
    # problem "a": 5 samples; passed (T, F, F, T, F); fractions (1, .5, 0, 1, .2); coop (F, T, T, T, F)
    # problem "b": 5 samples; passed all F; fractions (.25, 0, .75, 0, .5); coop (T, T, F, F, F)
    a = [(True, 1.0, False), (False, 0.5, True), (False, 0.0, True), (True, 1.0, True), (False, 0.2, False)]
    b = [(False, 0.25, True), (False, 0.0, True), (False, 0.75, False), (False, 0.0, False), (False, 0.5, False)]
    out = []
    for pid, rows in (("a", a), ("b", b)):
        for i, (p, f, q) in enumerate(rows):
            out.append(SampleRecord(pid, p, f, q, {"main": float(i), "aux": 1.0 if p else 0.0}))
    return out


def test_summarize_samples_hand_values():
    t = summarize_samples(_records())
    # pass@1: a: c=2 of 5 -> .4 ; b: 0 -> mean .2
    # pass@5: a: k = n with c >= 1 -> 1 ; b: 0 -> mean .5 ; k=10 > n=5 is left out
    assert t["pass@1"] == pytest.approx(0.2) and t["pass@5"] == pytest.approx(0.5)
    assert "pass@10" not in t and "acc@10" not in t and "coop@10" not in t
    # acc@1 (first): a 1.0, b .25 -> .625 ; acc@5: a 1, b .75 -> .875
    assert t["acc@1"] == pytest.approx(0.625) and t["acc@5"] == pytest.approx(0.875)
    # coop@1 (first): a sample 0 passes but does not cooperate -> 0 ; b -> 0 => 0
    # coop@5: a sample 3 passes and cooperates -> 1 ; b never passes -> 0 => .5
    assert t["coop@1"] == 0.0 and t["coop@5"] == pytest.approx(0.5)
    # returns: main = 0..4 in both problems -> mean 2 ; aux = 1 for the 2 passing samples of 10 -> .2
    assert t["return/main"] == pytest.approx(2.0) and t["return/aux"] == pytest.approx(0.2)
    assert (t["n_problems"], t["n_samples"], t["n_min"]) == (2.0, 10.0, 5.0)


def test_summarize_samples_all_subsets_and_mappings():
    recs = [dict(problem_id=r.problem_id, passed=r.passed, test_fraction=r.test_fraction, cooperated=r.cooperated,
                 returns=dict(r.returns)) for r in _records()]
    t = summarize_samples(recs, ks=(1, 2), subset="all")
    # coop@1 (all): a: c = 1 (sample 3) of 5 -> .2 ; b: 0 -> mean .1
    assert t["coop@1"] == pytest.approx(0.1)
    # acc@1 (all) = mean fraction: a (1+.5+0+1+.2)/5 = .54 ; b (.25+0+.75+0+.5)/5 = .3 -> .42
    assert t["acc@1"] == pytest.approx(0.42)
    # pass@2: a 1 - C(3,2)/C(5,2) = .7 ; b 0 -> .35 (the unbiased estimator whatever subset)
    assert t["pass@2"] == pytest.approx(0.35)


def test_summarize_samples_uneven_problems():
    # "x" has 1 sample (passed), "y" 3 (none passes): n_min = 1 -> only k = 1 is reported
    recs = [SampleRecord("x", True, 1.0, True)] + [SampleRecord("y", False, 0.0, False)] * 3
    t = summarize_samples(recs)
    assert t["pass@1"] == pytest.approx(0.5) and "pass@5" not in t and t["n_min"] == 1.0
    assert not any(k.startswith("return/") for k in t)


@pytest.mark.parametrize(
    "records, kw, err, match",
    [
        ([], {}, ValueError, "no records"),
        ([SampleRecord("a", 1, 1.0, True)], {}, TypeError, "record 0 passed must be a bool"),
        ([SampleRecord("a", True, 1.5, True)], {}, ValueError, r"record 0 test_fraction must be in \[0, 1\]"),
        ([SampleRecord("a", True, float("nan"), True)], {}, ValueError, "test_fraction"),
        ([{"problem_id": "a", "passed": True}], {}, ValueError, "record 0 lacks"),
        ([("a", True, 1.0, True)], {}, TypeError, "record 0 must be a SampleRecord"),
        ([SampleRecord("a", True, 1.0, True, {"m": 1.0}), SampleRecord("a", True, 1.0, True, {"x": 1.0})], {},
         ValueError, "record 1 has returns"),
        ([SampleRecord("a", True, 1.0, True, {"m": float("inf")})], {}, ValueError, "agent 'm'"),
        ([SampleRecord(["a"], True, 1.0, True)], {}, TypeError, "not hashable"),
        ([SampleRecord("a", True, 1.0, True)], {"ks": (0,)}, ValueError, "k must be an int >= 1"),
        ([SampleRecord("a", True, 1.0, True)], {"subset": "last"}, ValueError, "subset"),
    ],
)
def test_summarize_samples_bad_input(records, kw, err, match):
    with pytest.raises(err, match=match):
        summarize_samples(records, **kw)
