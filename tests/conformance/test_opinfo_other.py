"""OpInfo conformance, every other bound op (tensor ops, clamp/where, factories,
random ops...), against plain torch on real gloo ranks (mesh of 2 and (2, 2)).
See tests/conformance/_check.py for what one case checks."""

from __future__ import annotations

import pytest

from ._suite import check_entry, keys

pytestmark = [pytest.mark.multiproc, pytest.mark.conformance]


@pytest.mark.parametrize("key", keys("other"))
def test_opinfo(key, dist2, dist4, op_coverage):
    check_entry(key, "other", dist2, dist4, op_coverage)
