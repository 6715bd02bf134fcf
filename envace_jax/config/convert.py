"""ConfigDict / dict <-> the frozen config dataclasses: ``load_section`` checks every value against its field's type
(the dataclass then checks its range), ``to_config_dict`` writes a dataclass back as a ConfigDict whose every field
the command line can override. Re-exported by ``envace_jax.config``."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Mapping

from envace_jax.config.rules import ConfigError


def _type_name(t: Any) -> str:
    return getattr(t, "__name__", str(t))


def _convert(value: Any, hint: Any, where: str, default: Any = None) -> Any:
    """Checks ``value`` against a type hint (int, float, str, bool, X | None, tuple[X, ...], nested
    dataclass; a nested section fills the fields it does not give from ``default``)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where} must be {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where, default if isinstance(default, hint) else None)
    if origin is tuple:
        # tuple[X, ...]: a list, or a comma-separated string (which overrides cleanly from the command line)
        args = typing.get_args(hint)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise ConfigError(f"{where}: unsupported field type {hint!r}")
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
            if args[0] is int:
                try:
                    value = [int(v) for v in value]
                except ValueError:
                    raise ConfigError(f"{where} must be comma-separated ints, got {value!r}") from None
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list or a comma-separated string, got {value!r}")
        return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be a bool, got {type(value).__name__} {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an int, got {type(value).__name__} {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where} must be finite, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {type(value).__name__} {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported field type {hint!r}")


def _as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a section (dict/ConfigDict), got {type(value).__name__}")
    return value


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _build(cls: type, value: Any, where: str, base: Any = None) -> Any:
    """``value`` (a mapping) -> ``cls``. Fields it does not give keep their value in ``base`` (the parent
    section's default for this field, e.g. an eval config's greedy ``sampling``), else the class default."""
    if isinstance(value, cls):
        return value
    data = _as_mapping(value, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        near = {u: difflib.get_close_matches(u, list(fields), n=1, cutoff=0.6) for u in unknown}
        hints = [f"{where}.{m[0]} for {u!r}" for u, m in near.items() if m]
        hint = f"did you mean {', '.join(hints)}? " if hints else ""
        raise ConfigError(f"{where} has unknown field(s) {unknown}; {hint}known: {sorted(fields)}")
    defaults = {k: getattr(base, k) if base is not None else _field_default(f) for k, f in fields.items()}
    kwargs = {k: v for k, v in defaults.items() if k not in data and base is not None}
    kwargs.update({k: _convert(v, hints[k], f"{where}.{k}", defaults[k]) for k, v in data.items()})
    try:
        return cls(**kwargs)
    except ConfigError as e:  # the dataclass's own range rules: name the full dotted field
        if not e.leaf:
            raise
        raise ConfigError(
            f"{where}.{e.leaf} must be {e.what}, got {e.value!r}", leaf=e.leaf, what=e.what, value=e.value
        ) from e
    except (ValueError, TypeError) as e:  # other construction-time checks
        msg = str(e)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from e


def load_section(cls: type, value: Any, where: str = "config") -> Any:
    """A mapping (dict / ConfigDict) -> the frozen dataclass ``cls``, every field type- and range-checked;
    errors name the dotted field under ``where``. The one converter for every config shape (training
    runs, eval runs, the demo)."""
    return _build(cls, value, where)


def _config_value(value: Any, hint: Any) -> Any:
    import ml_collections

    if dataclasses.is_dataclass(value):
        hints = typing.get_type_hints(type(value))
        return ml_collections.ConfigDict(
            {f.name: _config_value(getattr(value, f.name), hints[f.name]) for f in dataclasses.fields(value)}
        )
    if isinstance(value, tuple):  # comma-separated, so ``--config.x=a,b`` overrides it
        return ",".join(str(v) for v in value)
    if value is None:  # a typed placeholder, so ``--config.x=v`` can still set an optional field
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        return ml_collections.config_dict.placeholder(kinds[0] if len(kinds) == 1 else object)
    return value


def to_config_dict(cfg: Any):
    """The inverse of ``load_section`` / ``load_config``: a ConfigDict of a frozen config dataclass in which
    every field can be overridden from the command line (tuples as comma-separated strings, unset optional
    fields as typed placeholders)."""
    return _config_value(cfg, type(cfg))
