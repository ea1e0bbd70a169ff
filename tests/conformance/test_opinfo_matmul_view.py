"""OpInfo conformance, products and views (mm, matmul, linear, addmm, view,
reshape, permute...), against plain torch on real gloo ranks (mesh of 2 and (2, 2)).
See tests/conformance/_check.py for what one case checks."""

from __future__ import annotations

import pytest

from ._suite import check_entry, keys

pytestmark = [pytest.mark.multiproc, pytest.mark.conformance]


@pytest.mark.parametrize("key", keys("matmul_view"))
def test_opinfo(key, dist2, dist4, op_coverage):
    check_entry(key, "matmul_view", dist2, dist4, op_coverage)
