"""Public bug reports replayed beside the features they guard.

Each ``report_*`` function is one report's program (or a few reports' on one behaviour),
run on every rank (``fn(rank, world)``, in a pool or on the sim) and compared there with
the plain framework on the same values; its docstring names the report
(``pytorch/pytorch#N`` unless another repository is named; "PR" marks a pull request whose
description carries the reproducer) and what went wrong. :func:`reports` makes one test
per function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def reports(*fns: Callable[..., Any]) -> Any:
    """``@pytest.mark.parametrize("report", fns)``, each test named after its function."""
    return pytest.mark.parametrize(
        "report", fns, ids=[f.__name__.removeprefix("report_") for f in fns]
    )
