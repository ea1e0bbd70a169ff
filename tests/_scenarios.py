"""Batched scenarios in one worker call (no framework imported here): ``guard`` runs one
scenario and keeps its result or its traceback, ``ok`` reads a result back in the test and
fails naming the scenario whose traceback it holds."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any


def guard(out: dict, name: str, fn: Callable[[], Any]) -> None:
    try:
        out[name] = fn()
    except Exception:  # the test reports the scenario's traceback
        out[name] = "ERROR " + traceback.format_exc()


def ok(res: dict, name: str) -> Any:
    val = res[name]
    assert not (isinstance(val, str) and val.startswith("ERROR")), f"{name}: {val}"
    return val
