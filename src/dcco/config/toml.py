"""Configs as TOML: read a file and ``section.key=value`` overrides into a ``RunConfig``,
checking every key against the field names and types, and write one back."""

from __future__ import annotations

import sys
import types
import warnings
from dataclasses import asdict, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from dcco.config.runconfig import RunConfig
from dcco.config.sections import ConfigError
from dcco.errors import shown

RENAMED = {("optim", "warmup_steps"): "warmup_rounds", ("optim", "name"): "optimizer"}
"""Keys read from their old names (section, old key) → new key: one name for one setting
(2026-11-28)."""


def _upgrade(raw: dict[str, Any], warn: bool = True) -> None:
    """Read a config written with an old key name as the new one (``RENAMED``; with ``warn``,
    a ``DeprecationWarning`` names the new key: a run directory's stored config is read
    quietly), and one written before ``train.precision`` existed as what it computed: its
    ``train.dtype`` is the precision (the values carry over; with ``warn``, a
    ``DeprecationWarning`` too), and it ran eager (compile "off"), so older run directories
    stay readable and comparable."""
    for (section, old), new in RENAMED.items():
        values = raw.get(section)
        if not isinstance(values, dict) or old not in values:
            continue
        value = values.pop(old)
        if new in values and values[new] != value:
            raise ConfigError(f"{section}.{old} (the old name of {section}.{new}) is {value!r} "
                              f"but {section}.{new} is {values[new]!r}; keep {section}.{new} "
                              f"alone")
        values[new] = value
        if warn:
            warnings.warn(f"{section}.{old} is now {section}.{new}; the old name goes in a "
                          f"later release", DeprecationWarning, stacklevel=3)
    train = raw.get("train")
    if not isinstance(train, dict) or "dtype" not in train:
        return
    value = train.pop("dtype")
    if "precision" in train and train["precision"] != value:
        raise ConfigError(f"train.dtype (the old name of train.precision) is {value!r} but "
                          f"train.precision is {train['precision']!r}; keep train.precision "
                          f"alone")
    train["precision"] = value
    train.setdefault("compile", "off")
    if warn:
        warnings.warn("train.dtype is now train.precision (a config without train.compile "
                      "also runs eager, as it did then); the old name goes in a later release",
                      DeprecationWarning, stacklevel=3)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                base: RunConfig | None = None, warn_renamed: bool = True) -> RunConfig:
    """Read a TOML run config, apply ``section.key=value`` overrides, and check every key and
    value (names, types, each section's values and what the settings alone decide). The
    checks that need the method, the model or this machine are the run's
    (``dcco.run.setup.validate``; ``resolved`` also makes ``auto`` concrete): every run calls
    them before it writes anything.

    Args:
        path: a TOML file, or None for the defaults (``base``).
        overrides: e.g. ``["train.rounds=10", "model.widths=[16, 32, 64]"]``; the value is read
            as TOML, or taken as a plain string when it is not valid TOML.
        base: the config that the file and overrides modify (default: ``RunConfig()``).
        warn_renamed: warn of a key read from its old name (``RENAMED``); a run directory's
            stored config is read without (it was written by an earlier version).
    """
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_toml(path, "config file")
        if not raw:
            raise ConfigError(
                f"config file {path} sets nothing; an empty config would start a run with "
                f"every default (the paper's 100,000-round setting). Start from a file in "
                f"configs/, e.g. configs/fmnist_small.toml")
    for item in overrides or []:
        _apply_override(raw, item)
    _upgrade(raw, warn_renamed)
    cfg = from_dict(RunConfig, raw, "", base=base or RunConfig())
    return cfg


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The table in a TOML file, with errors that name the file: missing, a folder,
    unreadable, not UTF-8 text or not valid TOML. ``what`` names the file's role in them."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{what} {shown(path)} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder, not a TOML file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid TOML: {e}") from None


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise ConfigError(f"override {item!r} must look like section.key=value")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    section = raw.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(f"'{parts[0]}' must be a [section] table")
    section[parts[1]] = value


def from_dict(cls: type, data: dict[str, Any], prefix: str, base: Any = None) -> Any:
    """Build dataclass ``cls`` from ``data``, checking names and types; ``base`` gives defaults."""
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix}' must be a table of keys, got {data!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls) if f.init]
    for key in data:
        if key not in names:
            where = f"section [{prefix}]" if prefix else "the config"
            raise ConfigError(
                f"unknown key '{_join(prefix, key)}' in {where}; allowed: {', '.join(names)}"
            )
    kwargs = {}
    for name in names:
        if name not in data:
            continue
        key = _join(prefix, name)
        default = getattr(base, name) if base is not None else None
        kwargs[name] = _coerce(data[name], hints[name], key, default)
    try:
        return replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{e}") from None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _coerce(value: Any, tp: Any, key: str, default: Any) -> Any:
    """``value`` checked (and converted, list → tuple) against the annotation ``tp``."""
    if is_dataclass(tp):
        return from_dict(tp, value, key, base=default)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        if (value is None or value == "none") and type(None) in args:  # None: from JSON
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(value, inner[0], key, default)
        for a in inner:  # e.g. int | Literal["auto"]: the first that takes the value
            try:
                return _coerce(value, a, key, default)
            except ConfigError:
                continue
        kinds = [", ".join(repr(x) for x in get_args(a)) if get_origin(a) is Literal
                 else f"a{'n' if a is int else ''} {getattr(a, '__name__', a)}" for a in inner]
        kinds += ["'none'"] if type(None) in args else []
        raise ConfigError(f"{key} = {value!r} is not allowed; give {' or '.join(kinds)}")
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{key} = {value!r} is not allowed; choose one of {allowed}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0], f"{key}[{i}]", None) for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{key} must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]", None) for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    raise TypeError(f"config field {key} has an unsupported type {tp!r}")  # a bug of ours


def to_toml(cfg: Any) -> str:
    """The config as TOML text that ``load_config`` reads back to an equal config."""
    lines: list[str] = []
    for section, values in asdict(cfg).items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            lines.append(f"{key} = {to_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def to_toml_value(value: Any) -> str:
    """One value as TOML text; None is written as the string "none"."""
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(to_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


