"""From YAML to frozen configs, one way for all of them: presets, variant overlays, `--set` overrides, a
checkpoint's config.yaml and fine-tuning grids are read by `read_yaml` / `load_yaml` and typed by `typed`.

The rules, the same everywhere: an unknown key is named with the keys that exist; a value becomes its
field's type (YAML 1.1 reads 1e-3 as a string, so numbers are converted, and a list becomes the tuple a
frozen config holds); a whole number is whole (2.5 epochs is refused, not cut to 2); a number is finite
and inside its range (`jobs.cli.Range`), checked before any config's own checks divide by it; a nested
config takes a mapping or dotted keys (`adamw.eps`). Every error is one `UserError` naming the file when
there is one, the key and the value.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

from jobs.cli import Range, UserError, short_repr


def read_yaml(path: Path) -> Any:
    """A YAML file that a user passes or edits (preset, variant overlay, grid), parsed before any work
    starts; a missing file, a syntax error or an alias is a UserError naming the file and the line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from error
    return load_yaml(text, str(path))


class NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader minus aliases (`*name`). A 414-byte file of nested aliases expands to a billion
    values ("billion laughs"): loading it is cheap, but anything that then walks the value (a check,
    an error message) hangs. No preset, variant, grid or config this platform writes uses one."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "an alias (*name), which this platform does not "
                                              "accept: write the value out", self.peek_event().start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str, where: str) -> Any:
    """YAML text from a user's file or flag, without aliases; an error names `where` and the line."""
    try:
        return yaml.load(text, Loader=NoAliasLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f"{where}, line {mark.line + 1}" if mark is not None else where
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UserError(f"{at}: not valid YAML ({problem})") from error


def typed(cls: type, values: Mapping[str, Any], key: str = "", ranges: Mapping[str, Range] = {},
          where: str = "", renamed: Mapping[str, str] = {}, settable: Collection[str] | None = None) -> dict[str, Any]:
    """`values` checked against the dataclass `cls` and converted to its fields' types, ready for
    `cls(**...)`. `key` is the dotted name of `cls`'s place (`train`, `spaces.base`; "" for a file's top)
    that errors show; `ranges` holds the range of each number by its dotted name below `cls` (`peak_lr`,
    `adamw.eps`); `where` (a file) starts every error; `renamed` maps an old key (`train.adam_eps`) to where
    it lives now; `settable` names the fields a file may set when not all (a grid's name is its file's)."""
    known = sorted(settable if settable is not None else (f.name for f in dataclasses.fields(cls)))
    if not isinstance(values, Mapping):
        _refuse(where, f"{key or 'the file'} takes keys {known}, not {short_repr(values)}")
    values = _nest(values)
    moved = [f"{_join(key, k)} is now {renamed[_join(key, k)]}" for k in values if _join(key, k) in renamed]
    if moved:
        _refuse(where, f"renamed config key(s): {'; '.join(moved)}")
    unknown = sorted(set(values) - set(known))
    if unknown:
        _refuse(where, f"unknown config key(s) {[_join(key, k) for k in unknown]}; known {key or 'top-level'} "
                       f"keys: {known}")
    hints = typing.get_type_hints(cls)
    inner = {name: {k.removeprefix(f"{name}."): r for k, r in ranges.items()} for name in values}
    return {name: _value(hints[name], value, _join(key, name), ranges.get(name), inner[name], where)
            for name, value in values.items()}


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _value(hint: Any, value: Any, key: str, bounds: Range | None, inner: Mapping[str, Range], where: str) -> Any:
    """One value as the type `hint` says (a config, a tuple, a mapping, a number, a bool; other types as given)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None  # `int | None`: None is a value of its own (a default the config works out)
        kinds = [k for k in typing.get_args(hint) if k is not type(None)]
        hint = kinds[0] if len(kinds) == 1 else hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return hint(**typed(hint, value, key, inner, where))
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            _refuse(where, f"{key} must be a list, e.g. [a, b], not {short_repr(value)}")
        return tuple(_value(args[0], one, key, bounds, inner, where) for one in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            _refuse(where, f"{key} must be a mapping of keys to values, not {short_repr(value)}")
        return {str(k): _value(args[1], v, _join(key, str(k)), bounds, inner, where) for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            _refuse(where, f"{key} must be true or false, not {short_repr(value)}")
        return value
    if hint in (int, float):
        return _number(hint, value, key, bounds, where)
    return value


def _number(kind: type, value: Any, key: str, bounds: Range | None, where: str) -> int | float:
    """`value` as an int or float: finite, whole for an int, inside `bounds`."""
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number) or kind is int and not number.is_integer():
        _refuse(where, f"{key}={short_repr(value)} is not {'a whole' if kind is int else 'a finite'} number")
    number = kind(number)
    if bounds is not None:
        try:
            bounds.check(key, number)
        except UserError as error:
            _refuse(where, str(error))
    return number


def _refuse(where: str, message: str) -> typing.NoReturn:
    raise UserError(f"{where}: {message}" if where else message)


def _nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """{"adamw.eps": 1e-6, "adamw": {"beta1": 0.9}} -> {"adamw": {"eps": 1e-6, "beta1": 0.9}}."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, dot, rest = str(key).partition(".")
        if dot:
            inner = out.setdefault(head, {})
            if isinstance(inner, dict):
                inner[rest] = value
                continue
        if isinstance(value, dict):  # a copy: the dotted keys above must not write into a preset's mapping
            out[key] = {**value, **out[key]} if isinstance(out.get(key), dict) else dict(value)
        else:
            out[key] = value
    return out
