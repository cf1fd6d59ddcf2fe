"""Arguments checked where they enter (pydantic's ``validate_call``, strict): a value of
the wrong type is a ``ConfigError`` naming the argument, what it got and what it takes,
before anything is opened. numpy scalars count as numbers; strings never do."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import numpy as np
import pydantic
from pydantic import BeforeValidator, ConfigDict

from hotset.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def _int(value: Any) -> Any:
    return int(value) if isinstance(value, np.integer) else value


def _real(value: Any) -> Any:
    return float(value) if isinstance(value, np.integer | np.floating) else value


def _pair(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


#: an int (a numpy int too; not a bool, a float or a string)
Int = Annotated[int, BeforeValidator(_int)]
#: a real number (an int or a numpy number too; not a bool or a string)
Real = Annotated[float, BeforeValidator(_real)]
#: two ints, as a tuple or a list
IntPair = Annotated[tuple[Int, Int], BeforeValidator(_pair)]


def checked(fn: F) -> F:
    """``fn`` with its annotated arguments validated (strictly) at each call."""
    validate = pydantic.validate_call(
        config=ConfigDict(strict=True, arbitrary_types_allowed=True)
    )(fn)
    names = list(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return validate(*args, **kwargs)
        except pydantic.ValidationError as exc:
            given = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
            raise ConfigError(_explain(fn, names, given, exc)) from None

    return call  # type: ignore[return-value]


#: the aliases above as a user reads them
_PLAIN = {"IntPair": "(int, int)", "Int": "int", "Real": "float"}


def _explain(
    fn: Callable, names: list[str], given: dict, exc: pydantic.ValidationError
) -> str:
    """One line per wrong argument: its name, the value given and what it takes."""
    params, lines, seen = inspect.signature(fn).parameters, [], set()
    for err in exc.errors():
        where = err["loc"][0] if err["loc"] else "?"
        name = names[where] if isinstance(where, int) and where < len(names) else str(where)
        if name in seen:
            continue
        seen.add(name)
        wanted = str(params[name].annotation) if name in params else "?"
        wanted = re.sub(r"\b(IntPair|Int|Real)\b", lambda m: _PLAIN[m.group(1)], wanted)
        if name in given:
            lines.append(f"{name}={given[name]!r} is not {wanted}")
        else:
            lines.append(f"{name}: {err['msg'].lower()}")
    return f"{fn.__name__}: " + "; ".join(lines)
