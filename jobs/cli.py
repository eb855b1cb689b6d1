"""The one way a job's command runs: options declared once, as a dataclass; a user's mistake is one line.

A job declares its options as a frozen dataclass whose fields carry `option(help=...)` metadata;
`parse_options` turns the fields into argparse flags (`--max-train` for `max_train`) and the parsed
flags back into the dataclass, so `main(argv)` is `run(parse_options(PROG, __doc__, Options, argv))`
and the tests call `run(Options(...))`.

A user's mistake (a bad argument, a value out of range, a missing path, a malformed file: a `UserError`,
raised by the checks that run before any compute) prints `error: <message>` on stderr and exits 1,
without a traceback that buries it; `--debug` anywhere on the command line, or COCOLM_DEBUG=1, shows
the traceback instead. Every other exception (a ValueError from a bug included) is a fault, not a
usage error, and keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import reprlib
import sys
import typing
from collections.abc import Callable, Iterable
from typing import Any

DEBUG_FLAG = "--debug"
DEBUG_ENV = "COCOLM_DEBUG"


class UserError(ValueError):
    """Something the user gave or must fix (an option, a config value, a file, a missing tool), said in
    one line that names it. A ValueError, so library callers that catch ValueError still do."""


class Range(typing.NamedTuple):
    """The values a number may take: low <= value <= high, an open end excluding its bound; None: unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def check(self, key: str, value: float | int | None) -> None:
        """UserError naming `key` and this range unless `value` is in it (None passes: the default applies)."""
        if value is None:
            return
        too_low = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        too_high = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if too_low or too_high:
            left = "" if self.low is None else f"{self.low} {'<' if self.low_open else '<='} "
            right = "" if self.high is None else f" {'<' if self.high_open else '<='} {self.high}"
            raise UserError(f"{key}={value} is out of range: it must be {left}{key}{right}")


POSITIVE = Range(0, None, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0, 1, high_open=True)  # a dropout or Adam beta of 1 is degenerate
OPEN_FRACTION = Range(0, 1, low_open=True)  # a mask rate or a sample of 0 leaves nothing


def run_main(main: Callable[[list[str]], Any], argv: list[str] | None = None) -> None:
    """Call `main(argv)` (argv without --debug); turn a user error into one line and exit status 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        main(argv)
    except UserError as error:
        if debug:
            raise
        print(f"error: {error}\n(the traceback: add {DEBUG_FLAG} or set {DEBUG_ENV}=1)", file=sys.stderr)
        raise SystemExit(1) from None


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 40, 40
_SHORT.maxdict = _SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = 4


def short_repr(value: Any, limit: int = 60) -> str:
    """repr(value) for an error message, at most `limit` characters, built without walking the whole
    value: a huge or deeply nested one (a bad YAML file's) costs no more than a small one."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def redact(uri: str) -> str:
    """`uri` as it may be logged or printed: the user name and password before the host (everything up
    to the last @ before any ? or #) and the query (a signed URL's signature) replaced by ***, e.g.
    s3://key:secret@bucket/x -> s3://***@bucket/x. Anything that is not a URI comes back unchanged."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    head, query, _ = rest.partition("?")
    head, fragment, tail = head.partition("#")
    if "@" in head:
        head = "***@" + head[head.rindex("@") + 1:]
    return f"{scheme}://{head}{fragment}{tail}{'?***' if query else ''}"


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def comma_list(text: str) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c'): an option's comma-separated values, blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def check_name(what: str, value: str) -> str:
    """A name that becomes a folder, a file name or a tracking-store filter (a run name, a preset, a
    variant, an experiment): letters, digits and . _ + - only, not starting with . or another sign, at
    most 128 characters; so `../x` cannot leave its folder and a quote cannot end a filter string."""
    if not SAFE_NAME.fullmatch(value):
        raise UserError(f"{what} {value!r:.80} is not a safe name: use letters, digits and . _ + - "
                        f"(starting with a letter or digit, at most 128 characters)")
    return value


def option(help: str, flag: str | None = None, parse: Callable[[str], Any] | None = None,
           choices: Iterable[str] | None = None, repeat: bool = False, many: bool = False,
           metavar: str | None = None, bounds: Range | None = None) -> dict[str, Any]:
    """Field metadata for `add_options`: the flag's help, its name when not `--<field-name>`, the argparse
    type when the field's own type cannot parse a string, its choices, whether the flag repeats
    (`--set A --set B`) and whether it takes several values (`--corpus A B`; `--corpus A --corpus B` adds to
    the list). A bool field becomes `--name` / `--no-name`. A number's `bounds` are checked when the options are parsed, before any work:
    every int and float option has them (tests/test_cli.py checks)."""
    return {"help": help, "flag": flag, "parse": parse, "choices": choices, "repeat": repeat, "many": many,
            "metavar": metavar, "bounds": bounds}


def add_options(parser: argparse.ArgumentParser, cls: type, only: Iterable[str] | None = None) -> None:
    """One flag per field of the dataclass `cls` (or of the fields named in `only`)."""
    hints = typing.get_type_hints(cls)
    wanted = None if only is None else set(only)
    for f in dataclasses.fields(cls):
        if wanted is not None and f.name not in wanted or "help" not in f.metadata:
            continue
        meta = f.metadata
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"], "required": required}
        if meta["repeat"]:
            kwargs.update(action="append", default=[], metavar=meta["metavar"])
        elif hints[f.name] is bool:
            kwargs.update(action=argparse.BooleanOptionalAction, default=default)
        elif meta["many"]:
            # extend: `--corpus a --corpus b c` is (a, b, c); argparse's default (store) kept the last
            # flag's values alone, silently. An empty default, so the values given are all the values.
            if default:
                raise TypeError(f"{f.name}: an option with many values takes an empty default, not {default!r}")
            kwargs.update(action="extend", nargs="+", default=None if default is None else [], type=meta["parse"] or str)
        else:
            kwargs.update(default=default, type=meta["parse"] or _scalar(hints[f.name]), choices=meta["choices"])
        parser.add_argument(meta["flag"] or "--" + f.name.replace("_", "-"), **kwargs)


def parse_options(prog: str, doc: str | None, cls: type, argv: list[str] | None) -> Any:
    """The options dataclass `cls` from the command line, `--help` showing `doc`."""
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser, cls)
    return options_from(parser.parse_args(argv), cls)


def options_from(args: argparse.Namespace, cls: type, **values: Any) -> Any:
    """The dataclass back from parsed flags (repeated flags become tuples); `values` sets the rest."""
    for f in dataclasses.fields(cls):
        if f.name not in values and hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
        bounds = f.metadata.get("bounds")
        if bounds is not None and f.name in values:
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            for one in values[f.name] if isinstance(values[f.name], tuple) else (values[f.name],):
                bounds.check(flag, one)
    return cls(**values)


def _scalar(hint: Any) -> Callable[[str], Any]:
    """str, int or float from a field type such as `int | None`."""
    kinds = [k for k in typing.get_args(hint) or (hint,) if k is not type(None)]
    if len(kinds) != 1 or kinds[0] not in (str, int, float):
        raise TypeError(f"{hint} needs option(parse=...)")
    return kinds[0]
