"""The one way to declare a `bk shell` command: a decorator that carries everything.

    COMMANDS, command = command_table()

    @command("lastmark", help="the journal log marks in this bookie's index", local=True,
             args=(arg("--ledger", type=int, help="only this ledger"),))
    async def cmd_lastmark(uri, args): ...

A command is its handler plus what argparse needs to build its parser (name,
BookKeeper's spellings of the name as `aliases`, help, description, arguments) and
whether it runs without a metadata store (`local`: then uri is None). bk.cli.shell
builds every parser from these tables (the modules named in its SHELL_MODULES) and
runs the handler the parsed name points to: nothing else registers a command.

A handler is `fn(uri, args) -> dict` (async, or plain for one that blocks on
purpose, e.g. waiting on an admin socket): "text" is what a person reads, every
other field is printed by --json, and `"ok": False` makes the exit status 1.
`errors` are the exceptions shown as `bk shell NAME: error: ...` (exit 1) rather
than a traceback; BKError always is.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable

from bk.errors import BKError


@dataclass(frozen=True)
class Arg:
    """One `parser.add_argument(*flags, **kwargs)`."""
    flags: tuple
    kwargs: dict

    def add_to(self, parser) -> None:
        parser.add_argument(*self.flags, **self.kwargs)


@dataclass(frozen=True)
class OneOf:
    """Arguments of which at most one (exactly one with required=True) may be given."""
    args: tuple
    required: bool = False

    def add_to(self, parser) -> None:
        group = parser.add_mutually_exclusive_group(required=self.required)
        for a in self.args:
            a.add_to(group)


@dataclass(frozen=True)
class Action:
    """A second-level verb of a command (`cookie show`), with its own arguments and, for the
    command's handler to call, its own function."""
    name: str
    help: str
    description: str | None = None
    args: tuple = ()
    fn: Callable | None = None


@dataclass(frozen=True)
class Command:
    name: str
    fn: Callable
    help: str
    args: tuple = ()
    local: bool = False
    aliases: tuple = ()
    description: str | None = None
    raw_description: bool = False  # keep the description's own line breaks (a usage table)
    actions: tuple = ()  # Action verbs, parsed into args.<name>_command
    errors: tuple = (BKError,)

    @property
    def names(self) -> tuple:
        return (self.name, *self.aliases)


def arg(*flags, **kwargs) -> Arg:
    return Arg(flags, kwargs)


def one_of(*args: Arg, required: bool = False) -> OneOf:
    return OneOf(args, required)


def action(name: str, help: str, description: str | None = None, args: tuple = (), fn=None) -> Action:
    return Action(name, help, description, tuple(args), fn)


def command_table():
    """A module's COMMANDS dict (name -> Command) and the decorator filling it."""
    table: dict[str, Command] = {}

    def command(name: str, *, help: str, args: tuple = (), local: bool = False, aliases: tuple = (),
                description: str | None = None, raw_description: bool = False, actions: tuple = (),
                errors: tuple = ()):
        def register(fn):
            if name in table:
                raise ValueError(f"shell command {name} declared twice")
            table[name] = Command(name, fn, help, tuple(args), local, tuple(aliases), description, raw_description,
                                  tuple(actions), (BKError, *errors))
            return fn
        return register
    return table, command


def at_least(lowest: int):
    """argparse type: an int >= lowest, with a clear error otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest}, got {value}")
        return value
    return parse
