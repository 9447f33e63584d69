"""Options declared once: each field of a request dataclass carries the command-line option that sets it.

A ``%%distributed`` option is one field of :class:`~nbtrain.kernel.request.config.LaunchRequest` (or of the magic's
display settings), declared with :func:`option`: its default is the field's default, and the field's
metadata holds an :class:`Option` — flag, help, metavar, choices, value type, environment variable and the
group of options it belongs to. Everything else is derived from that one declaration:

* the magic's argparse arguments (:meth:`Option.argparse_spec`; ``nbtrain.kernel.magics`` turns them into
  IPython ``@argument`` decorators, one decorator per group);
* the request built from the parsed arguments, matched by field name (:func:`from_arguments`);
* the environment fallback — an option left out takes its ``NBTRAIN_*`` variable — applied in one
  place, :func:`with_env_fallbacks` (called by ``config.resolve``, so ``run_source`` callers get it too);
* the options table of docs/user-guide.md, checked against the fields by tests/test_options.py.

The argparse destination is always the field name, so ``--no-resume`` sets ``resume=False`` and the
request needs no hand-written copy of the parsed arguments. A switch declared ``either_way`` is one field
with two flags (``--channels-last`` / ``--no-channels-last``; left out: ``None``, the automatic choice), and an
option with a ``bare`` value may be given without one (``--compile`` alone means ``--compile default``).
No IPython here: plain data and functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

OPTION_KEY = "nbtrain_option"
_TRUE_WORDS, _FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class OptionEnvError(ValueError):
    """An ``NBTRAIN_*`` variable standing in for an option holds something the option does not take."""


@dataclass(frozen=True)
class Option:
    flag: str | None  # "--gpus"; None for the positional argument (its name is the field's)
    help: str
    group: str  # options of a group are added to a magic together, by one decorator
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None  # int, float; None: the text as given
    switch: bool = False  # takes no value: giving it sets the field to the opposite of its default
    repeat: bool = False  # may be given several times; the field holds a tuple of the values
    env: str | None = None  # the environment variable used when the option is left out
    either_way: bool = False  # with switch: --X sets True, --no-X sets False, left out keeps the default (None: auto)
    bare: str | None = None  # the value of the flag given without one (``--compile`` alone: "default")

    def help_text(self) -> str:
        return f"{self.help} [env: {self.env}]" if self.env else self.help

    def argparse_spec(self, name: str, default: Any) -> tuple[tuple[str, ...], dict]:
        """``(names, keywords)`` for ``ArgumentParser.add_argument`` (and IPython's ``@argument``)."""
        kwargs: dict[str, Any] = {"help": self.help_text()}
        if self.flag is None:
            return (name,), {**kwargs, "nargs": "?", "type": self.type, "metavar": self.metavar or name}
        kwargs["dest"] = name
        if self.switch and self.either_way:
            return (self.flag,), {**kwargs, "action": argparse.BooleanOptionalAction, "default": default}
        if self.switch:
            return (self.flag,), {**kwargs, "action": "store_false" if default else "store_true"}
        if self.bare is not None:
            kwargs.update(nargs="?", const=self.bare)
        if self.repeat:
            kwargs.update(action="append", default=list(default))
        else:
            kwargs["default"] = default
        for key in ("metavar", "type"):
            if getattr(self, key) is not None:
                kwargs[key] = getattr(self, key)
        if self.choices is not None:
            kwargs["choices"] = list(self.choices)
        return (self.flag,), kwargs

    def expected(self) -> str:
        """What the option takes, in words, for error messages."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type is int:
            return "a whole number"
        if self.type is float:
            return "a number of seconds" if self.metavar == "SECONDS" else "a number"
        return "on or off" if self.switch else "text"

    def parse_env(self, text: str, default: Any) -> Any:
        """The field value an environment variable's ``text`` stands for."""
        try:
            if self.switch:
                word = text.strip().lower()
                if word not in _TRUE_WORDS + _FALSE_WORDS:
                    raise ValueError(word)
                if self.either_way:
                    return word in _TRUE_WORDS
                return (not default) if word in _TRUE_WORDS else default
            value = self.type(text) if self.type else text
        except ValueError:
            raise OptionEnvError(f"{self.env} must be {self.expected()} (got {text!r}).") from None
        if self.choices and value not in self.choices:
            raise OptionEnvError(f"{self.env} must be {self.expected()} (got {text!r}).")
        return (value,) if self.repeat else value


def option(default: Any, flag: str | None, help: str, *, group: str, **details: Any):
    """A dataclass field that is also a command-line option (see :class:`Option` for ``details``)."""
    spec = Option(flag, help, group, **details)
    if spec.repeat:
        return dataclasses.field(default=tuple(default), metadata={OPTION_KEY: spec})
    return dataclasses.field(default=default, metadata={OPTION_KEY: spec})


def options_of(cls) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of ``cls`` that are options, with their :class:`Option`, in declaration order."""
    return [(f, f.metadata[OPTION_KEY]) for f in dataclasses.fields(cls) if OPTION_KEY in f.metadata]


def from_arguments(cls, arguments: Any):
    """An instance of ``cls`` from parsed arguments (an argparse namespace), field by field name."""
    values = vars(arguments) if not isinstance(arguments, Mapping) else arguments
    kwargs = {}
    for f, spec in options_of(cls):
        value = values[f.name]
        kwargs[f.name] = tuple(value) if spec.repeat else value
    return cls(**kwargs)


def with_env_fallbacks(request, environ: Mapping[str, str] | None = None):
    """``request`` with every option left at its default taken from its environment variable, if set."""
    environ = os.environ if environ is None else environ
    changes = {}
    for f, spec in options_of(type(request)):
        text = environ.get(spec.env, "") if spec.env else ""
        if text and getattr(request, f.name) == f.default:
            changes[f.name] = spec.parse_env(text, f.default)
    return dataclasses.replace(request, **changes) if changes else request
