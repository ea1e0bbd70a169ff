"""Test-process side of the OpInfo conformance suite: run one entry on the gloo pools,
merge the ranks' records, apply the expected-failure table, record for the coverage page.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from . import _cases as C
from ._check import run_entry
from .expected_failures import XFAILS, XFail

#: seconds one entry may take on one pool before the pool is restarted
TIMEOUT = 120

#: test file groups of the non-elementwise entries, by the registry family (YAML file) of
#: their first bound function
_FAMILY_GROUP = {
    "reduction": "reduction",
    "softmax": "reduction",
    "norm": "reduction",
    "loss": "reduction",
    "einsum": "matmul_view",
    "view": "matmul_view",
}


def group_of(op: Any) -> str:
    """Which test file runs the entry: ``unary`` / ``binary`` / ``binary_nondiff``
    (elementwise OpInfos, the last without autograd: comparisons, logical, bitwise...),
    ``reduction`` (reductions, softmax, norms, losses), ``matmul_view`` (products and
    views), ``other``."""
    names = {cls.__name__ for cls in type(op).__mro__}
    if "UnaryUfuncInfo" in names:
        return "unary"
    if C.is_elementwise(op):  # a BinaryUfuncInfo
        return "binary" if op.supports_autograd else "binary_nondiff"
    if "ReductionOpInfo" in names:
        return "reduction"
    return _FAMILY_GROUP.get(C.family(op), "other")


def keys(group: str) -> list[str]:
    """The bound entries of one group (see :func:`group_of`), op_db order. Entries with no
    dtype the suite runs (complex-only) get no test; the report lists them as not run."""
    return [
        k
        for k, op in C.entries().items()
        if group_of(op) == group and C.sample_dtype(op) is not None
    ]


@dataclass
class Verdict:
    key: str
    group: str
    runs: list[dict[str, Any]]  # one merged record per mesh
    expected: list[tuple[dict[str, Any], XFail]] = field(default_factory=list)
    unexpected: list[dict[str, Any]] = field(default_factory=list)
    unused: list[XFail] = field(default_factory=list)

    @property
    def cases(self) -> list[dict[str, Any]]:
        return [c for r in self.runs for c in r["cases"] if "combo" in c]

    @property
    def status(self) -> str:
        if self.unexpected or self.unused:
            return "FAILED"
        if self.expected:
            return "expected failure"
        return "passed" if self.cases else "not run"


_RANK = {"pass": 0, "refused": 1, "fail": 2}


def merge_ranks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from every rank's: a case fails if it failed on any rank."""
    out = dict(per_rank[0])
    cases = [dict(c) for c in per_rank[0]["cases"]]
    for other in per_rank[1:]:
        assert len(other["cases"]) == len(cases), "ranks ran different cases"
        for c, o in zip(cases, other["cases"]):
            if _RANK.get(o["status"], -1) > _RANK.get(c["status"], -1):
                c.update(status=o["status"], phase=o.get("phase"), msg=o["msg"])
            elif o.get("msg") and c.get("msg") == "failed on another rank":
                c["msg"] = o["msg"]
    out["cases"] = cases
    out["seconds"] = max(r["seconds"] for r in per_rank)
    return out


def _matches(rule: XFail, case: dict[str, Any], samples: dict[int, str]) -> bool:
    fields = {
        "msg": case.get("msg", ""),
        "combo": case.get("combo", ""),
        "variant": case.get("variant", ""),
        "sample": samples.get(case.get("sample", -1), ""),
    }
    for name, value in fields.items():
        pat = getattr(rule, name)
        if pat is not None and not re.search(pat, value):
            return False
    return True


def judge(key: str, group: str, runs: list[dict[str, Any]]) -> Verdict:
    rules = XFAILS.get(key, [])
    v = Verdict(key, group, runs)
    used: set[int] = set()
    for r in runs:
        for c in r["cases"]:
            if c["status"] != "fail":
                continue
            rule = next((x for x in rules if _matches(x, c, r["samples"])), None)
            if rule is None:
                v.unexpected.append(c)
            else:
                used.add(id(rule))
                v.expected.append((c, rule))
    v.unused = [x for x in rules if id(x) not in used]
    return v


def _fmt_case(c: dict[str, Any], samples: dict[int, str]) -> str:
    return (
        f"{c['variant']}({samples.get(c['sample'], c['sample'])}) placements [{c.get('combo')}] "
        f"{c.get('phase', '')}: {c['msg']}"
    )


def check_entry(key: str, group: str, dist2: Any, dist4: Any, coverage: Any) -> None:
    """The body of one conformance test: mesh of 2, then (2, 2); record; judge."""
    runs = [merge_ranks(pool.run(run_entry, key, timeout=TIMEOUT)) for pool in (dist2, dist4)]
    verdict = judge(key, group, runs)
    coverage.add(verdict)
    samples = {i: d for r in runs for i, d in r["samples"].items()}
    if verdict.unexpected:
        shown = "\n".join(_fmt_case(c, samples) for c in verdict.unexpected[:12])
        more = len(verdict.unexpected) - 12
        pytest.fail(
            f"{key}: {len(verdict.unexpected)} case(s) differ from torch:\n{shown}"
            + (f"\n... and {more} more" if more > 0 else ""),
            pytrace=False,
        )
    if verdict.unused:
        reasons = "\n".join(f"- {x.reason}" for x in verdict.unused)
        pytest.fail(
            f"{key}: expected failure(s) no longer happen (XPASS, strict); delete the rule(s) "
            f"from tests/conformance/expected_failures.py:\n{reasons}",
            pytrace=False,
        )
    if not verdict.cases:
        why = (
            "no dtype among float32/int64/bool is supported on CPU"
            if C.sample_dtype(C.entries()[key]) is None
            else "no sample is small enough or every sample makes torch raise"
        )
        pytest.skip(f"{key}: not run: {why}")
    if verdict.expected:
        reasons = sorted({x.reason for _, x in verdict.expected})
        pytest.xfail(f"{len(verdict.expected)} expected failure(s): " + " | ".join(reasons))
