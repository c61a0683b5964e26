"""Command-line flags generated from typed config dataclasses, so each flag is declared once (as a field).

A field ``rollout_batch_size: int = 8`` becomes ``--rollout-batch-size`` with ``type=int``; ``bool`` fields are
switches, ``tuple[...]`` fields take several values, ``Literal[...]`` fields become choices, and a field's
``metadata["help"]`` is its help text.
"""

import argparse
import types
import typing
from dataclasses import MISSING, field, fields
from typing import Any, Literal


class CliParser(argparse.ArgumentParser):
    """argparse for the command-line tools: a user's mistake (unknown flag, missing or bad value) is one line
    that says it first, then where the flags are listed, instead of the whole usage with the error below it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists every flag)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse, but an unknown flag is reported before anything else (argparse would first complain
        about the required flags a mistyped one left out)."""
        import sys

        args = list(sys.argv[1:] if args is None else args)
        known = {s for action in self._actions for s in action.option_strings}
        unknown = [a for a in args if a.startswith("-") and a.split("=")[0] not in known and not _number(a)]
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return super().parse_args(args, namespace)

    def fail(self, message: str):
        """Stop on a bad input the flags name (a missing path, say): the message alone, exit status 2."""
        self.exit(2, f"{self.prog}: {message}\n")


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def help_field(text: str, default: Any = None, **metadata: Any):
    """A config field with its flag's help text (and other flag metadata, e.g. ``required=True``)."""
    return field(default=default, metadata={"help": text, **metadata})


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _unwrap_optional(hint) -> tuple[Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def add_dataclass_flags(parser: argparse.ArgumentParser, cls, title: str) -> None:
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        hint, _ = _unwrap_optional(hints[f.name])
        kwargs: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help")}
        if hint is bool:
            kwargs.update(action=argparse.BooleanOptionalAction if default else "store_true", default=default)
        elif typing.get_origin(hint) is tuple:
            kwargs.update(nargs="*", type=typing.get_args(hint)[0], default=list(default))
        elif typing.get_origin(hint) is Literal:
            choices = typing.get_args(hint)
            kwargs.update(choices=choices, type=type(choices[0]), default=default)
        else:
            kwargs.update(type=hint, default=default)
        if f.metadata.get("required"):
            kwargs.update(required=True)
            kwargs.pop("default")
        group.add_argument(flag_name(f.name), **kwargs)


def dataclass_from_args(cls, args: argparse.Namespace):
    """The dataclass filled from parsed flags (lists become tuples, so configs stay hashable/frozen)."""
    values = {}
    for f in fields(cls):
        value = getattr(args, f.name)
        values[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)
