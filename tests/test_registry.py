"""The shared lazy-registry lookup behind compressors, agents and tasks."""

from __future__ import annotations

import pytest

from ctxkit.errors import ConfigError
from ctxkit.registry import load_registered

REGISTRY = {
    "ok": "ctxkit.errors:BudgetError",
    "no-module": "ctxkit.not_a_module:X",
    "no-class": "ctxkit.errors:NoSuchError",
}


def test_resolves_a_registered_class():
    from ctxkit.errors import BudgetError

    assert load_registered(REGISTRY, "ok", "thing") is BudgetError


@pytest.mark.parametrize("name, message", [
    ("nope", r"unknown thing 'nope'; registered things: \['no-class', 'no-module', 'ok'\]"),
    ("no-module", r"thing 'no-module' is registered as ctxkit.not_a_module:X but cannot be imported"),
    ("no-class", r"thing 'no-class' is registered as ctxkit.errors:NoSuchError, but ctxkit.errors has no NoSuchError"),
])
def test_errors_name_the_problem(name, message):
    with pytest.raises(ConfigError, match=message):
        load_registered(REGISTRY, name, "thing")
