"""Read the TypeScript interfaces of labextension/src/types.ts, and check JSON values against them.

The extension's types describe what the server routes answer; nothing at build time ties them to the
Python that produces the JSON, so a test does: :func:`parse_interfaces` reads the small subset of
TypeScript those declarations use and :func:`mismatches` lists where a real answer differs.

Understood: ``[export] interface X { a: T; b?: U }`` and ``[export] type X = T;`` where a type is a union
(``A | B``) of ``number``, ``string``, ``boolean``, ``null``, ``undefined``, a string literal (``'idle'``), the
name of another interface or type, an inline object ``{ a: T; ... }``, a map ``{ [name: string]: T }``, any of
them followed by ``[]``. Comments are skipped.
Anything else is a ``SyntaxError`` naming where, so the types and this reader cannot drift apart silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:(//[^\n]*|/\*.*?\*/)|([A-Za-z_$][\w$]*|'[^'\n]*'|[{}\[\]:;?|,=]))", re.S)
_PRIMITIVES = {"number": (int, float), "string": (str,), "boolean": (bool,)}


@dataclass(frozen=True)
class Field:
    type: object  # a type tree: see _Parser._type
    optional: bool


@dataclass(frozen=True)
class Shape:
    fields: dict  # name -> Field; or, for a map, {"": Field} holding the value type
    is_map: bool = False
    alias: tuple | None = None  # ``type X = T``: T's type tree (then ``fields`` is empty)


def parse_interfaces(source: str) -> dict[str, Shape]:
    """Every interface in ``source`` by name (a type alias as a :class:`Shape` with ``alias`` set)."""
    return _Parser(source).interfaces()


def literals(shapes: dict[str, Shape], name: str) -> set[str]:
    """The string literals a type alias allows: ``type S = 'a' | 'b'`` gives ``{"a", "b"}``."""
    return {what for kind, what in shapes[name].alias[1] if kind == "literal"}


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(source):
            match = _TOKEN.match(source, pos)
            if not match:
                if source[pos:].strip() == "":
                    break
                raise SyntaxError(f"types.ts: unexpected text at {self._where(source, pos)}: {source[pos:pos + 30]!r}")
            if match.group(2):
                self.tokens.append((match.group(2), match.start(2)))
            pos = match.end()
        self.source = source
        self.i = 0

    @staticmethod
    def _where(source: str, pos: int) -> str:
        return f"line {source.count(chr(10), 0, pos) + 1}"

    def _peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        if self.i >= len(self.tokens):
            raise SyntaxError(f"types.ts: ended early, expected {expected or 'more'}")
        token, pos = self.tokens[self.i]
        if expected is not None and token != expected:
            raise SyntaxError(f"types.ts: expected {expected!r} at {self._where(self.source, pos)}, found {token!r}")
        self.i += 1
        return token

    def interfaces(self) -> dict[str, Shape]:
        found = {}
        while self._peek() is not None:
            if self._peek() == "export":
                self._take()
            if self._peek() == "type":
                self._take("type")
                name = self._take()
                self._take("=")
                found[name] = Shape({}, alias=self._type())
                self._separator()
                continue
            self._take("interface")
            name = self._take()
            found[name] = self._object()
        return found

    def _object(self) -> Shape:
        self._take("{")
        if self._peek() == "[":  # { [name: string]: T }
            for expected in ("[", None, ":", "string", "]", ":"):
                self._take(expected)
            value = self._type()
            self._separator()
            self._take("}")
            return Shape({"": Field(value, False)}, is_map=True)
        fields = {}
        while self._peek() != "}":
            name = self._take()
            optional = self._peek() == "?"
            if optional:
                self._take("?")
            self._take(":")
            fields[name] = Field(self._type(), optional)
            self._separator()
        self._take("}")
        return Shape(fields)

    def _separator(self) -> None:
        if self._peek() in (";", ","):
            self._take()

    def _type(self) -> tuple:
        """("union", [alternatives]); an alternative is ("name", str), ("object", Shape) or ("array", alt)."""
        alternatives = [self._single()]
        while self._peek() == "|":
            self._take("|")
            alternatives.append(self._single())
        return ("union", alternatives)

    def _single(self) -> tuple:
        token = self._peek() or ""
        if token.startswith("'"):
            self._take()
            single: tuple = ("literal", token[1:-1])
        else:
            single = ("object", self._object()) if token == "{" else ("name", self._take())
        while self._peek() == "[":
            self._take("[")
            self._take("]")
            single = ("array", single)
        return single


def mismatches(value, type_name: str, interfaces: dict[str, Shape], where: str = "") -> list[str]:
    """How ``value`` (decoded JSON) differs from interface ``type_name``: missing, extra or mistyped keys."""
    return _check_single(value, ("name", type_name), interfaces, where or type_name)


def _check_shape(value, shape: Shape, interfaces, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object, got {value!r:.60}"]
    if shape.is_map:
        return [p for k, v in value.items() for p in _check_type(v, shape.fields[""].type, interfaces, f"{where}.{k}")]
    problems = [f"{where}.{k}: in the JSON but not in the interface" for k in value if k not in shape.fields]
    for name, field in shape.fields.items():
        if name not in value:
            if not field.optional:
                problems.append(f"{where}.{name}: in the interface but not in the JSON")
            continue
        problems += _check_type(value[name], field.type, interfaces, f"{where}.{name}")
    return problems


def _check_type(value, union: tuple, interfaces, where: str) -> list[str]:
    attempts = [_check_single(value, alt, interfaces, where) for alt in union[1]]
    if any(not problems for problems in attempts):
        return []
    # Report against the alternative that came closest (an object interface rather than "null").
    return min(attempts, key=len)


def _check_single(value, single: tuple, interfaces, where: str) -> list[str]:
    kind, what = single
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected an array, got {value!r:.60}"]
        return [p for i, item in enumerate(value) for p in _check_single(item, what, interfaces, f"{where}[{i}]")]
    if kind == "object":
        return _check_shape(value, what, interfaces, where)
    if what in ("null", "undefined"):
        return [] if value is None else [f"{where}: expected null, got {value!r:.60}"]
    if what in _PRIMITIVES:
        ok = isinstance(value, _PRIMITIVES[what]) and (what == "boolean" or not isinstance(value, bool))
        return [] if ok else [f"{where}: expected {what}, got {value!r:.60}"]
    if kind == "literal":
        return [] if value == what else [f"{where}: expected {what!r}, got {value!r:.60}"]
    if what in interfaces and interfaces[what].alias is not None:
        return _check_type(value, interfaces[what].alias, interfaces, where)
    if what in interfaces:
        return _check_shape(value, interfaces[what], interfaces, where)
    raise SyntaxError(f"types.ts: unknown type {what!r} (used at {where})")
