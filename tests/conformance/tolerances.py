"""Entries whose float32 comparison needs more than the suite's floor (``rtol=1e-4,
atol=1e-5`` in ``_check.py``), each with the reason. The OpInfos' own
``toleranceOverride`` decorators are not used: they belong to other tests (a JIT or
gradgrad test's atol of 3e-3 would hide a sharding error). Every entry passes at the
floor (cross_entropy included, which the largest override used to give 3e-3) except those
below; an entry added here says why it needs more.
"""

from __future__ import annotations

#: entry key -> (atol, rtol, why)
EXTRA_TOLERANCE: dict[str, tuple[float, float, str]] = {
    "addbmm": (
        5e-5,
        1e-4,
        "each output element sums b * k = 25 products of values up to ~10 (two contracted "
        "dims); a sharded contraction adds the partial sums in another order, and a result "
        "near 0 after cancellation then differs by ~2e-5 in float32",
    ),
}
