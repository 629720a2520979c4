"""Evaluation metrics of MAGRPO's coding collaboration: pass@k, acc@k, coop@k (pure numpy functions).

``pass@k`` is Chen et al.'s unbiased estimator, ``acc@k`` the best test-pass fraction (as the paper's authors
compute it), ``coop@k`` a binary passes-and-cooperates rate (the authors grade cooperation), each over the
first k samples or every k-subset (``subset="all"``). The definitions, and where and why they differ from the
authors' scripts: ``docs/magrpo.md``, "Coding metrics".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

Subset = Literal["first", "all"]
_SUBSETS = ("first", "all")


def _as_counts(name: str, x: Any) -> np.ndarray:
    """``x`` as an int64 array of values >= 0 (an input of :func:`pass_at_k`), or an error naming ``name``."""
    arr = np.asarray(x)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise TypeError(f"pass_at_k: {name} must be integer counts, got dtype {arr.dtype} ({x!r:.80})")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            raise ValueError(f"pass_at_k: {name} must be whole numbers, got {float(arr[bad].flat[0])}")
    arr = arr.astype(np.int64)
    if (arr < 0).any():
        raise ValueError(f"pass_at_k: {name} must be >= 0, got {int(arr[arr < 0].flat[0])}")
    return arr


def _binomial_ratio(a: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``C(a, k) / C(n, k)`` for ``0 <= a <= n``, ``1 <= k <= n`` (arrays broadcast together).

    Product form ``prod_{j=0}^{k-1} (a - j) / (n - j)``: every factor lies in [0, 1], so no factorial or
    large binomial is formed (a factor with ``a - j < 0`` is 0: then ``C(a, k) = 0``). Memory is
    O(size * max k).
    """
    a, n, k = np.broadcast_arrays(a, n, k)
    kmax = int(k.max()) if k.size else 0
    j = np.arange(kmax, dtype=np.float64)
    used = j < k[..., None]
    num = np.clip(a[..., None] - j, 0.0, None)
    den = np.maximum(n[..., None] - j, 1.0)  # n - j >= 1 wherever the factor is used (j < k <= n)
    return np.where(used, num / den, 1.0).prod(axis=-1)


def pass_at_k(n: Any, c: Any, k: Any) -> np.ndarray | np.float64:
    """Unbiased pass@k estimator of Chen et al. (2021), vectorised over problems.

    ``pass@k = 1 - C(n - c, k) / C(n, k)``: the probability that k samples drawn without replacement from
    the n generated ones contain at least one of the c correct ones. Computed as
    ``1 - prod_{j=0}^{k-1} (n - c - j) / (n - j)`` (equal to Chen et al.'s
    ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``), with factors in [0, 1]: stable for large n, no overflow.
    ``n - c < k`` gives exactly 1.

    Args:
        n: (...) samples per problem.
        c: (...) correct samples per problem, ``0 <= c <= n``.
        k: (...) budget, ``1 <= k <= n``; ``n``, ``c``, ``k`` broadcast together (typically ``n``, ``c``
            of shape (P,) and a scalar ``k``).

    Returns:
        float64 array of the broadcast shape (a numpy scalar for scalar inputs), values in [0, 1].

    Raises:
        TypeError: a non-numeric (or boolean) input.
        ValueError: a negative or fractional count, ``c > n``, ``k > n``, ``k < 1``, or shapes that do not
            broadcast; the message names the input.
    """
    n_, c_, k_ = _as_counts("n", n), _as_counts("c", c), _as_counts("k", k)
    try:
        n_, c_, k_ = np.broadcast_arrays(n_, c_, k_)
    except ValueError as e:
        shapes = f"n {np.shape(n)}, c {np.shape(c)}, k {np.shape(k)}"
        raise ValueError(f"pass_at_k: shapes of {shapes} do not broadcast") from e
    if (k_ < 1).any():
        raise ValueError(f"pass_at_k: k must be >= 1, got {int(k_[k_ < 1].flat[0])}")
    if (c_ > n_).any():
        i = tuple(int(j) for j in np.argwhere(c_ > n_)[0])
        where = f" at index {i}" if i else ""
        raise ValueError(f"pass_at_k: c must be <= n, got c={int(c_[i])} > n={int(n_[i])}{where}")
    if (k_ > n_).any():
        i = tuple(int(j) for j in np.argwhere(k_ > n_)[0])
        where = f" at index {i}" if i else ""
        raise ValueError(f"pass_at_k: k must be <= n, got k={int(k_[i])} > n={int(n_[i])}{where}")
    out = 1.0 - _binomial_ratio(n_ - c_, n_, k_)
    return np.clip(out, 0.0, 1.0)[()]


def _check_k_subset(k: Any, n: int, subset: str, who: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{who}: k must be an int, got {k!r}")
    if not 1 <= k <= n:
        raise ValueError(f"{who}: k must be in [1, n={n}], got {k}")
    if subset not in _SUBSETS:
        raise ValueError(f"{who}: subset must be one of {_SUBSETS}, got {subset!r}")
    return int(k)


def _as_matrix(name: str, x: Any, kind: str, who: str) -> np.ndarray:
    """``x`` as a (P, n) array with n >= 1: booleans (``kind="b"``) or fractions in [0, 1] (``"f"``)."""
    arr = np.asarray(x)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"{who}: {name} must have shape (P, n) with n >= 1, got shape {arr.shape}")
    if kind == "b":
        if arr.dtype != bool:
            raise TypeError(f"{who}: {name} must be booleans, got dtype {arr.dtype}")
        return arr
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise TypeError(f"{who}: {name} must be numbers in [0, 1], got dtype {arr.dtype}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr) | (arr < 0) | (arr > 1)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{who}: {name} must be in [0, 1], got {float(arr[where])} at index {where}")
    return arr


def acc_at_k(test_fraction: Any, k: int, subset: Subset = "first") -> np.ndarray:
    """Per-problem acc@k: the test-pass fraction of the best of k joint samples.

    - ``subset="first"``: ``acc@k = max(test_fraction[p, :k])`` (the authors' "Accuracy@k"; depends on the
      order of the samples).
    - ``subset="all"``: the expectation of ``max`` over a uniformly random k-subset of the n samples. With
      the fractions sorted ``x_(1) <= ... <= x_(n)``, ``P(max = x_(i)) = C(i-1, k-1) / C(n, k)``, computed
      as ``F(i) - F(i-1)`` with ``F(i) = C(i, k) / C(n, k)`` in the stable product form of
      :func:`pass_at_k`; for 0/1 fractions this is exactly pass@k.

    The benchmark number is the mean of the result over problems.

    Args:
        test_fraction: (P, n) fraction of tests each sample passed, in [0, 1].
        k: 1 <= k <= n.
        subset: ``"first"`` or ``"all"``.

    Returns:
        (P,) float64 in [0, 1].

    Raises:
        TypeError / ValueError: a bad shape, dtype, value, ``k`` or ``subset``; the message names it.
    """
    who = "acc_at_k"
    x = _as_matrix("test_fraction", test_fraction, "f", who)
    k = _check_k_subset(k, x.shape[1], subset, who)
    if subset == "first":
        return x[:, :k].max(axis=1)
    n = x.shape[1]
    cdf = _binomial_ratio(np.arange(n + 1), np.int64(n), np.int64(k))  # F(0..n), F(n) = 1
    weights = np.diff(cdf)  # (n,) weight of the i-th smallest value
    return np.clip(np.sort(x, axis=1) @ weights, 0.0, 1.0)


def coop_at_k(passed: Any, cooperated: Any, k: int, subset: Subset = "first") -> np.ndarray:
    """Per-problem coop@k: does at least one of k joint samples pass every test *and* cooperate?

    A sample cooperates when the main function calls the auxiliary agent's ``aux`` and uses its result
    (decided by the caller, e.g. by static analysis of the main function).

    - ``subset="first"``: ``coop@k = any(passed[p, :k] & cooperated[p, :k])``.
    - ``subset="all"``: ``pass@k`` (:func:`pass_at_k`) with ``c = sum(passed & cooperated)``: the
      probability over uniformly random k-subsets.

    The benchmark number is the mean of the result over problems; coop@k <= pass@k of the same subset rule.

    Args:
        passed: (P, n) bool, the sample passed every test.
        cooperated: (P, n) bool, the sample's main function used ``aux``.
        k: 1 <= k <= n.
        subset: ``"first"`` or ``"all"``.

    Returns:
        (P,) float64 in [0, 1].

    Raises:
        TypeError / ValueError: a bad shape, dtype, ``k`` or ``subset``; the message names it.
    """
    who = "coop_at_k"
    p = _as_matrix("passed", passed, "b", who)
    q = _as_matrix("cooperated", cooperated, "b", who)
    if p.shape != q.shape:
        raise ValueError(f"{who}: passed {p.shape} and cooperated {q.shape} must have the same shape")
    k = _check_k_subset(k, p.shape[1], subset, who)
    joint = p & q
    if subset == "first":
        return joint[:, :k].any(axis=1).astype(np.float64)
    return np.atleast_1d(pass_at_k(np.full(len(joint), joint.shape[1]), joint.sum(axis=1), k)).astype(np.float64)


# ----------------------------------------------------------------------------------------------------
# per-sample records -> table


@dataclass(frozen=True)
class SampleRecord:
    """One evaluated joint sample of a coding problem (a mapping with these keys is accepted too)."""

    #: Problem the sample answers (any hashable id); records of one problem are in sample order.
    problem_id: Any
    #: The joint program passed every test.
    passed: bool
    #: Fraction of the problem's tests it passed, in [0, 1].
    test_fraction: float
    #: The main function called ``aux`` and used its result.
    cooperated: bool
    #: Return of each agent on this sample (agent name -> float); the same agents in every record.
    returns: Mapping[str, float] = field(default_factory=dict)


_RECORD_KEYS = ("problem_id", "passed", "test_fraction", "cooperated")


def _record_fields(i: int, record: Any) -> tuple[Any, bool, float, bool, dict[str, float]]:
    """The fields of record ``i``, validated; errors name the record."""
    if isinstance(record, SampleRecord):
        values = [getattr(record, key) for key in _RECORD_KEYS]
        returns = record.returns
    elif isinstance(record, Mapping):
        missing = [key for key in _RECORD_KEYS if key not in record]
        if missing:
            raise ValueError(f"summarize_samples: record {i} lacks {missing}")
        values = [record[key] for key in _RECORD_KEYS]
        returns = record.get("returns", {})
    else:
        raise TypeError(
            f"summarize_samples: record {i} must be a SampleRecord or a mapping, got {type(record).__name__}"
        )
    problem_id, passed, fraction, cooperated = values
    for name, flag in (("passed", passed), ("cooperated", cooperated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"summarize_samples: record {i} {name} must be a bool, got {flag!r}")
    if isinstance(fraction, (bool, np.bool_)) or not isinstance(fraction, (int, float, np.integer, np.floating)):
        raise TypeError(f"summarize_samples: record {i} test_fraction must be a number, got {fraction!r}")
    if not (0.0 <= float(fraction) <= 1.0):  # also rejects NaN
        raise ValueError(f"summarize_samples: record {i} test_fraction must be in [0, 1], got {fraction!r}")
    if not isinstance(returns, Mapping):
        raise TypeError(f"summarize_samples: record {i} returns must be a mapping agent -> float, got {returns!r}")
    clean = {}
    for agent, value in returns.items():
        number = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
        if not number or not np.isfinite(value):
            raise ValueError(
                f"summarize_samples: record {i} return of agent {agent!r} must be a finite number, got {value!r}"
            )
        clean[str(agent)] = float(value)
    return problem_id, bool(passed), float(fraction), bool(cooperated), clean


def summarize_samples(
    records: Iterable[SampleRecord | Mapping[str, Any]], ks: Sequence[int] = (1, 5, 10), subset: Subset = "first"
) -> dict[str, float]:
    """The evaluation table of a set of joint samples.

    Records are grouped by ``problem_id`` (in order of first appearance; within a problem, in record
    order, which is the sample order that ``subset="first"`` uses). For every k in ``ks`` with
    ``k <= n_min`` (the fewest samples any problem has) the table holds

    - ``pass@k``: mean over problems of :func:`pass_at_k` (``n`` = that problem's sample count,
      ``c`` = its passing samples; always the unbiased estimator, whatever ``subset``);
    - ``acc@k``: mean over problems of :func:`acc_at_k` with ``subset``;
    - ``coop@k``: mean over problems of :func:`coop_at_k` with ``subset``;

    and, whatever k, ``return/<agent>`` (each agent's mean return over all samples), ``n_problems``,
    ``n_samples`` and ``n_min``. A k larger than ``n_min`` is left out (it cannot be estimated).

    Args:
        records: per-sample :class:`SampleRecord` s or mappings with the same keys (``returns`` optional).
        ks: budgets, each an int >= 1.
        subset: ``"first"`` or ``"all"`` for acc@k and coop@k (see :func:`acc_at_k`).

    Raises:
        ValueError: no records, a bad field, a bad k, or records naming different agents; the message names
            the record.
        TypeError: a record or field of the wrong type.
    """
    if subset not in _SUBSETS:
        raise ValueError(f"summarize_samples: subset must be one of {_SUBSETS}, got {subset!r}")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"summarize_samples: every k must be an int >= 1, got {k!r}")
    groups: dict[Any, list[tuple[bool, float, bool]]] = {}
    returns: dict[str, list[float]] = {}
    agents: tuple[str, ...] | None = None
    n_samples = 0
    for i, record in enumerate(records):
        problem_id, passed, fraction, cooperated, ret = _record_fields(i, record)
        if agents is None:
            agents = tuple(sorted(ret))
            returns = {a: [] for a in agents}
        elif tuple(sorted(ret)) != agents:
            raise ValueError(
                f"summarize_samples: record {i} has returns for {sorted(ret)}, earlier records for {list(agents)}"
            )
        try:
            groups.setdefault(problem_id, []).append((passed, fraction, cooperated))
        except TypeError as e:
            raise TypeError(f"summarize_samples: record {i} problem_id {problem_id!r} is not hashable") from e
        for a, v in ret.items():
            returns[a].append(v)
        n_samples += 1
    if not groups:
        raise ValueError("summarize_samples: no records")

    table: dict[str, float] = {"n_problems": float(len(groups)), "n_samples": float(n_samples)}
    # one (1, n_p) row per problem: problems may have different sample counts
    passed = [np.array([[r[0] for r in rows]], dtype=bool) for rows in groups.values()]
    fraction = [np.array([[r[1] for r in rows]], dtype=np.float64) for rows in groups.values()]
    cooperated = [np.array([[r[2] for r in rows]], dtype=bool) for rows in groups.values()]
    counts = np.array([p.shape[1] for p in passed])
    correct = np.array([int(p.sum()) for p in passed])
    n_min = int(counts.min())
    table["n_min"] = float(n_min)
    for k in sorted({int(k) for k in ks}):
        if k > n_min:
            continue
        table[f"pass@{k}"] = float(np.mean(pass_at_k(counts, correct, k)))
        table[f"acc@{k}"] = float(np.mean([acc_at_k(f, k, subset)[0] for f in fraction]))
        table[f"coop@{k}"] = float(np.mean([coop_at_k(p, q, k, subset)[0] for p, q in zip(passed, cooperated)]))
    for a in agents or ():
        table[f"return/{a}"] = float(np.mean(returns[a]))
    return table
