"""The ``>>>`` examples in ``search_rl/algorithms`` docstrings run and hold.

Run: python -m pytest tests/search_rl/algorithms/test_algorithms_doctests.py -q
"""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["advantages", "kl_control", "losses", "masked"]


@pytest.mark.parametrize("name", [*MODULES, "search_rl.config.algorithm"])
def test_docstring_examples(name: str):
    module = importlib.import_module(name if "." in name else f"search_rl.algorithms.{name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module.__name__} has no >>> examples"
    assert result.failed == 0
