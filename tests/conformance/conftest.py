"""The conformance suite's session fixture: collect every entry's verdict and write
docs/op_coverage.md when the whole suite ran."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._report import Recorder


@pytest.fixture(scope="session")
def op_coverage() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.write()
