"""Option values against their declared types and ranges: the one check of every component's options.

A component's factory declares each option by its annotation (``hidden_size: int = 300``) and,
where only some values make sense, a :class:`Range` in ``typing.Annotated``
(``dropout: Annotated[float, Range(0, 1, high_open=True)] = 0.1``). The registry checks every value
a run gives against that declaration before anything loads, so ``trust_remote_code: "no"`` (text,
which Python would take as true) or ``layers: 2.5`` is refused with the option's name, its type
and the fix, instead of being passed to the factory. Annotations this module does not know (a
plugin's own classes, ``Any``) are not checked.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import os
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Optional

from .errors import ConfigError

__all__ = [
    "Positive",
    "PositiveFloat",
    "Range",
    "advice",
    "check_option_values",
    "declared_options",
    "expected",
    "fits",
    "forwards_options",
]


@dataclass(frozen=True)
class Range:
    """The values a number option may take: ``Range(1)`` is at least 1, ``Range(0, 1, high_open=True)``
    is 0 up to but not including 1."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: Any) -> bool:
        if not _finite(value):  # inf is no learning rate, temperature or size
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        parts = ["finite"] if self.low is None and self.high is None else []
        if self.low is not None:
            parts.append(f"{'above' if self.low_open else 'at least'} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'below' if self.high_open else 'at most'} {self.high:g}")
        return " and ".join(parts) or "any number"


def _finite(value: Any) -> bool:
    """A whole number is finite however large (math.isfinite raises OverflowError past 1e308)."""
    return isinstance(value, int) or math.isfinite(value)


#: a count or a size: a whole number, at least 1 (and below 2**31, which no size reaches and torch overflows past)
Positive = Annotated[int, Range(1, 2**31 - 1)]
#: a rate, a temperature, a scale: a number above 0
PositiveFloat = Annotated[float, Range(0, low_open=True)]


def declared_options(factory: Any) -> dict[str, Any]:
    """``{option: annotation}`` of a factory (a function, a class or a ``functools.partial``), with
    ``Annotated`` kept; an annotation that cannot be resolved (a name only imported for type
    checkers) is left out, so that option is not checked."""
    while hasattr(factory, "func") and hasattr(factory, "keywords"):  # functools.partial
        factory = factory.func
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # one unresolvable annotation: resolve the others one by one
        pass
    namespace = getattr(inspect.getmodule(target), "__dict__", {})
    hints = {}
    for name, annotation in getattr(target, "__annotations__", {}).items():
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except Exception:
            continue
    return hints


def forwards_options(target: Any) -> Any:
    """Declare that a factory passes its ``**options`` on to ``target`` (another factory): the factory
    takes ``target``'s signature and annotations, so the registry checks each option against
    ``target``'s declaration. A bare ``**options`` declares nothing, and a value it forwards would
    go unchecked (``trust_remote_code: "no"`` through ``--teacher minilm`` ran a checkpoint's code)."""

    def declare(factory: Any) -> Any:
        factory.__signature__ = inspect.signature(target)
        factory.__annotations__ = declared_options(target)
        return factory

    return declare


def fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is one of the values ``hint`` declares (a bool is never an int, text is
    never a bool, a float with a fraction is never an int)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, (typing.TypeVar, str)):
        return True
    if origin is typing.Annotated:
        ranges = [meta for meta in hint.__metadata__ if isinstance(meta, Range)]
        return fits(value, args[0]) and all(value in allowed for allowed in ranges)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arm) for arm in args)
    if origin is typing.Literal:
        return any(value == choice and type(value) is type(choice) for choice in args)
    if hint is None or hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (isinstance(value, int) or not math.isnan(value))
        )
    if hint is str:
        return isinstance(value, str)
    if inspect.isclass(hint) and issubclass(hint, os.PathLike):  # Path: a path may be given as text
        return isinstance(value, (str, os.PathLike))
    container = origin or hint
    if container in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return isinstance(value, collections.abc.Mapping) and (
            not args or all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
        )
    if container in (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
            return False
        fixed_tuple = container is tuple and not (len(args) == 2 and args[1] is Ellipsis)
        return not args or fixed_tuple or all(fits(element, args[0]) for element in value)
    if container is collections.abc.Callable:
        return callable(value)
    if inspect.isclass(container):
        try:
            return isinstance(value, container)
        except TypeError:  # a Protocol that is not runtime-checkable: nothing to check against
            return True
    return True


def expected(hint: Any) -> str:
    """``hint`` in words, for a message: ``a whole number at least 1, or null``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        ranges = [meta.describe() for meta in hint.__metadata__ if isinstance(meta, Range)]
        return " ".join([expected(args[0]), *ranges])
    if origin in (typing.Union, types.UnionType):
        words = [expected(arm) for arm in args if arm is not type(None)]
        return " or ".join(words) + (", or null" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in args)
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", type(None): "null"}
    if hint in names:
        return names[hint]
    container = origin or hint
    if container in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return "a mapping"
    if container in (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable):
        return "a list" + (f" of {expected(args[0])}" if args and args[0] is not Any else "")
    return getattr(hint, "__name__", str(hint))


def advice(value: Any, hint: Any) -> str:
    """A word on the likely cause, where there is one: a quoted YAML boolean or number."""
    if isinstance(value, str) and fits(value.strip().lower() in ("true", "yes", "on", "1"), hint):
        return f" ({value!r} is text, not a boolean: write true or false without quotes)"
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return ""
        if fits(number, hint) or fits(int(number) if number.is_integer() else number, hint):
            return f" ({value!r} is text, in quotes: remove the quotes to give the number)"  # 1e-5 unquoted is one
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 and fits(int(value), hint):
        return f" (write {int(value)}, without the point)"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and fits(str(value), hint):
        return " (YAML read it as a number: put it in quotes to give it as text)"
    if isinstance(value, bool) and fits("text", hint):
        return " (YAML reads an unquoted yes, no, on, off, true or false as a boolean: put it in quotes to give text)"
    return ""


def check_option_values(factory: Any, options: dict[str, Any], *, section: str, owner: str) -> None:
    """Raise a ConfigError naming the first of ``options`` whose value is not of the type or range
    ``factory`` declares for it (``section.option of owner must be ...``); undeclared ones pass."""
    declared = declared_options(factory)
    for option, value in options.items():
        hint = declared.get(option)
        if hint is not None and not fits(value, hint):
            raise ConfigError(
                f"{section}.{option} of {owner} must be {expected(hint)}, got {_shown(value)} "
                f"({type(value).__name__}){advice(value, hint)}"
            )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
