"""Exception and warning types, and the caret display every error message uses.

Every error a user can cause is a `TullioError` (a `ValueError`), so callers can catch one type.
The message states the rule that was broken, shows the expression with a caret under the
offending part, and, where there is one, suggests the fix.
"""
from __future__ import annotations


class TullioError(ValueError):
    """Base class of every error caused by the expression or the arrays passed to it."""

    def __init__(self, rule: str, text: str | None = None, span: tuple[int, int] | None = None,
                 hint: str | None = None):
        self.rule, self.text, self.span, self.hint = rule, text, span, hint
        super().__init__(format_message(rule, text, span, hint))


class ParseError(TullioError):
    """The text is not valid tullio_py notation."""


class RangeError(TullioError):
    """Index ranges cannot be inferred, disagree, or an access would leave its array."""


class GradientError(TullioError):
    """A gradient was requested that is not defined."""


class ArgumentError(TullioError):
    """Arrays or options passed to a kernel are missing, of the wrong kind, or inconsistent."""


class LoweringError(TullioError):
    """A statement cannot be split into blocks for a dask array (frontends/dask.py)."""


class OverwriteError(TullioError):
    """Tape(strict=True): a recorded write was overwritten before anything read it."""


class SummationWarning(UserWarning):
    """An additive term does not use a reduction index, so it is summed as a whole (Tullio's rule)."""


class OverwriteWarning(UserWarning):
    """A recorded write was overwritten before anything read it (a dead write)."""


def caret_line(text: str, span: tuple[int, int]) -> str:
    """The expression with a line of carets under text[span[0]:span[1]]."""
    start, stop = span
    start = max(0, min(start, len(text)))
    stop = max(start + 1, min(stop, len(text) + 1))
    return f"    {text}\n    {' ' * start}{'^' * (stop - start)}"


def format_message(rule: str, text: str | None, span: tuple[int, int] | None,
                   hint: str | None) -> str:
    parts = [rule]
    if text is not None:
        parts.append(caret_line(text, span) if span is not None else f"    {text}")
    if hint:
        parts.append(f"Hint: {hint}")
    return "\n".join(parts)
