"""OpInfo conformance, reductions, softmax, norms and losses (sum, amax, argmax, std, layer_norm,
cross_entropy...), against plain torch on real gloo ranks (mesh of 2 and (2, 2)).
See tests/conformance/_check.py for what one case checks."""

from __future__ import annotations

import pytest

from ._suite import check_entry, keys

pytestmark = [pytest.mark.multiproc, pytest.mark.conformance]


@pytest.mark.parametrize("key", keys("reduction"))
def test_opinfo(key, dist2, dist4, op_coverage):
    check_entry(key, "reduction", dist2, dist4, op_coverage)
