"""The checking machinery every config section shares: ``ConfigError``, range rules and the ``Checked`` mixin.

Plain Python (no jax): reading a config file is cheap.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar


class ConfigError(ValueError):
    """A config field has the wrong type, an out-of-range value, or is unknown.

    Range errors carry ``leaf`` (the field's path inside the dataclass that raised), ``what`` (the
    rule) and ``value``, so that ``load_config`` can name the full dotted field.
    """

    def __init__(self, message: str, *, leaf: str = "", what: str = "", value: Any = None):
        super().__init__(message)
        self.leaf, self.what, self.value = leaf, what, value


Rule = tuple[str, Callable[[Any], bool], str]  # (field, predicate, what the value must be)

_POS = lambda v: v > 0
_NONNEG = lambda v: v >= 0
_PROB = lambda v: 0 < v <= 1


def one_of(choices: tuple) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in choices), f"one of {choices}"


def check_rules(obj: Any, label: str, rules: tuple[Rule, ...]) -> None:
    """Raises ``ConfigError`` for the first field of ``obj`` that breaks its rule."""
    for field, ok, what in rules:
        value = getattr(obj, field)
        if not ok(value):
            raise ConfigError(f"{label}.{field} must be {what}, got {value!r}", leaf=field, what=what, value=value)


class Checked:
    """Mixin: a frozen dataclass whose ``RULES`` are checked when it is built."""

    LABEL: ClassVar[str] = ""
    RULES: ClassVar[tuple[Rule, ...]] = ()

    def __post_init__(self):
        check_rules(self, self.LABEL, self.RULES)
