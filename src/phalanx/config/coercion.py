"""Values as the type of the dataclass field they set (a number written as text, a list for a tuple), or a
ConfigError that names the field, where it was set, and how to write it.

Every value from a YAML file, a preset, a CLI flag or a keyword argument goes through :func:`coerce`
before it reaches a config dataclass, so the rules are the same whatever the source.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import yaml

from phalanx.config.yaml_reader import parse_scalar
from phalanx.errors import ConfigError


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (a bool is not, though Python counts it as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def plain(value: Any) -> Any:
    """Convert tuples (and nested) to lists so that YAML stays plain."""
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def coerce(cls: type, name: str, value: Any, where: str) -> Any:
    """``value`` as the type of the field ``name`` of the dataclass ``cls``, or a ConfigError naming the
    field, ``where`` it was set, and the fix.

    Numbers written as text (``"1e-3"``, ``"1_000_000"``) are numbers; an int is a float where a float
    is wanted; a float with no fractional part (``1e6``) is an int where an int is wanted, 1.5 is
    refused; a bool is neither (``True`` is an int in Python); lists become tuples. A text field takes
    only text: YAML reads ``2024_01`` or ``1e3`` as a number, which must be quoted to stay as written.
    """
    try:
        return _convert(_field_types(cls)[name], value)
    except _Mismatch as mismatch:
        default = {f.name: f.default for f in dataclasses.fields(cls)}.get(name)
        example = mismatch.example if default in (None, dataclasses.MISSING) else plain(default)
        hint = {
            "text": " (quoted, so that YAML does not read it as a number, a date or true/false)",
            "a number": " (0.001, 1e-3 and 3e-4 are numbers)",
            "a whole number": " (1000, 1_000 and 1e3 are whole numbers)",
        }.get(mismatch.expected.removesuffix(" or null"), "")
        written = (
            f"{name}: '{example}'"
            if isinstance(example, str)
            else yaml.safe_dump({name: example}, default_flow_style=True, width=1000).strip()[1:-1]
        )
        raise ConfigError(
            f"{where}: {name} = {mismatch.value!r} ({type(mismatch.value).__name__}) is not "
            f"{mismatch.expected}. Write {name} as {mismatch.expected}{hint}, e.g. `{written}`."
        ) from None


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class _Mismatch(Exception):
    def __init__(self, value: Any, expected: str, example: Any) -> None:
        self.value, self.expected, self.example = value, expected, example


def _convert(kind: Any, value: Any) -> Any:
    """``value`` as ``kind`` (see :func:`coerce`), or _Mismatch."""
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in arguments:
            return None
        options = [option for option in arguments if option is not type(None)]
        if len(options) != 1:
            return value
        try:
            return _convert(options[0], value)
        except _Mismatch as mismatch:  # "true or false" -> "true, false or null"
            expected = mismatch.expected.replace(" or ", ", ") + " or null"
            raise _Mismatch(value, expected, mismatch.example) from None
    if origin is tuple:
        sized = isinstance(value, (list, tuple))
        items = arguments[:1] * len(value) if sized and arguments[1:] == (Ellipsis,) else arguments
        if not sized or len(items) != len(value):
            expected = "a list" if arguments[1:] == (Ellipsis,) else f"a list of {len(arguments)} values"
            raise _Mismatch(value, expected, ["a", "b"])
        return tuple(_convert(item, element) for item, element in zip(items, value, strict=True))
    if kind in (int, float):
        number = to_number(kind, value)
        if number is None:
            raise _Mismatch(
                value, "a number" if kind is float else "a whole number", 0.5 if kind is float else 1000
            )
        return number
    if kind is bool and not isinstance(value, bool):
        raise _Mismatch(value, "true or false", True)
    if kind is str and not isinstance(value, str):
        raise _Mismatch(value, "text", "my-text")
    return value


def to_number(kind: type, value: Any) -> Any:
    """``value`` as ``kind`` (int or float), or None if it is not one: text is read as in YAML
    (``"1e-3"``, ``"1_000"``), a float with no fractional part is an int, a bool is not a number."""
    number = parse_scalar(value) if isinstance(value, str) else value
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return None
    if kind is float:
        return float(number)
    if isinstance(number, int):
        return number
    return int(number) if number.is_integer() else None
