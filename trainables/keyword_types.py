"""Whether a value from a sweep file fits the type a package's keyword is annotated with.

A model's ``options`` reach its adapter's builder as keywords, and ``options.finetuner`` reaches the package's
fine-tuner the same way: Python checks neither value, so ``allow_download: "false"`` or ``early_stopping: "false"``
(a quoted boolean, a non-empty string) would be read as true, the opposite of what the file says.
:func:`keyword_type_problem` reads the keyword's annotation and judges a YAML value against it: ``bool`` takes
``true``/``false`` only, ``int`` no boolean and no text, ``float`` any number but a boolean, ``str`` text only,
``X | None`` also null, a ``Literal`` one of its values. A type it cannot judge (a class, a path, a device) is left
to the package.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["keyword_type_problem"]

# the values a YAML file can hold: a value of any other type came from code, and is left to the package
_YAML_TYPES = (bool, int, float, str, type(None), list, tuple, dict)
_BOOLEAN_WORDS = {"true", "false", "yes", "no", "on", "off", "y", "n"}


@functools.cache
def _annotations(function: Callable[..., Any]) -> dict[str, tuple[Any, str]]:
    """Keyword -> (the resolved annotation, or None where it cannot be resolved; its text as written)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}
    try:
        hints: dict[str, Any] = typing.get_type_hints(function)
    except Exception:  # a name only imported for the type checker: resolve the others one by one
        hints = {}
    namespace = {**vars(typing), **getattr(function, "__globals__", {})}
    found = {}
    for name, parameter in parameters.items():
        if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) or parameter.annotation is parameter.empty:
            continue
        written = parameter.annotation
        text = written if isinstance(written, str) else inspect.formatannotation(written)
        annotation = hints.get(name)
        if annotation is None and isinstance(written, str):
            try:
                annotation = eval(written, namespace)  # noqa: S307  (an annotation of an installed package)
            except Exception:
                annotation = None
        elif annotation is None:
            annotation = written
        found[name] = (annotation, text)
    return found


def _fits(annotation: Any, value: Any) -> bool | None:
    """Whether ``value`` fits ``annotation``: True, False, or None where the annotation cannot be judged."""
    if annotation is None or annotation is Any:
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _fits(args[0], value)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_fits(a, value) for a in args]
        if any(v is True for v in verdicts):
            return True
        return None if any(v is None for v in verdicts) else False
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    base = origin or annotation
    if base in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        return isinstance(value, dict)
    if base in (list, tuple, collections.abc.Sequence):
        return isinstance(value, (list, tuple))
    return None


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if value is None:
        return "an empty value (null)"
    if isinstance(value, str):
        quoted = (" (a quoted boolean: write true or false without quotes)"
                  if value.strip().lower() in _BOOLEAN_WORDS else "")
        return f"the string {value!r}{quoted}"
    if isinstance(value, (dict, list, tuple)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    return f"the number {value!r}"


def keyword_type_problem(function: Callable[..., Any], key: str, value: Any, declared_by: str = "") -> str | None:
    """None when ``value`` fits the annotation of ``function``'s keyword ``key`` (or that cannot be judged: no
    such keyword, no annotation, a type other than the plain ones, a value a sweep file cannot hold); else what
    is wrong, as "must be bool, as ``declared_by`` declares it, got the string 'false' (...)"."""
    if not isinstance(value, _YAML_TYPES):
        return None
    annotation, text = _annotations(function).get(key, (None, ""))
    if _fits(annotation, value) is not False:
        return None
    return f"must be {text}{f', as {declared_by} declares it' if declared_by else ''}, got {_shown(value)}"
