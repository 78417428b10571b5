"""Registry[T]: duplicate names, unknown-name errors listing the registered names, import strings.

Run: python -m pytest tests/search_rl/test_registry.py -q
"""

from __future__ import annotations

import pytest

from search_rl.registry import Registry


def test_register_get_names():
    reg: Registry[object] = Registry("widget")

    @reg.register("b")
    def b() -> int:
        return 2

    reg.register("a")(len)
    assert reg.get("b") is b and reg.get("a") is len
    assert reg.names() == ["a", "b"] and "a" in reg and "c" not in reg


def test_duplicate_name_raises():
    reg: Registry[object] = Registry("widget")
    reg.register("x")(len)
    with pytest.raises(ValueError, match="widget 'x' is already registered"):
        reg.register("x")(abs)
    assert reg.get("x") is len


def test_unknown_name_lists_registered():
    reg: Registry[object] = Registry("widget")
    reg.register("one")(len)
    reg.register("two")(abs)
    with pytest.raises(KeyError, match="unknown widget 'three'; registered: one, two"):
        reg.get("three")


def test_import_strings():
    reg: Registry[object] = Registry("widget")
    assert reg.get("os.path:join") is __import__("os").path.join
    with pytest.raises(AttributeError, match="module 'os.path' has no 'nope'"):
        reg.get("os.path:nope")
    with pytest.raises(ImportError):
        reg.get("no_such_module_xyz:f")
