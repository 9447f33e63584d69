"""The base of every user mistake nbtrain reports before any process starts."""

from __future__ import annotations


class UserInputError(ValueError):
    """A mistake in what the user asked — an option, the cell's code, a notebook value that cannot travel —
    found before any process starts; the message says what happened and how to fix it. The magics show it as a
    usage error (no traceback); the notebook's variables are untouched."""


class ConfigError(UserInputError):
    """The user asked for something that cannot run; the message says how to fix it."""
