"""The command table every `bk shell` module declares (bk.cli.shell's SHELL_MODULES).

    COMMANDS, command = command_table()

    @command("lastmark", local=True)      # local: runs without a metadata store (uri is None)
    async def cmd_lastmark(uri, args): ...
"""
from __future__ import annotations


def command_table():
    """A module's COMMANDS dict (name -> `async def fn(uri, args)`) and the decorator filling it."""
    table: dict = {}

    def command(name: str, *, local: bool = False):
        def register(fn):
            if local:
                fn.local = True
            table[name] = fn
            return fn
        return register
    return table, command
