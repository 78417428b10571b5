"""The error every configuration check raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; raised before Ray starts, with what is wrong and how to fix it."""
