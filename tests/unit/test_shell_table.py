"""`bk shell`'s parsers come from one table of @command declarations (bk.cli.commands):
every command is listed with its help, explains each of its arguments, answers to
BookKeeper's own spelling of its name, and a name is claimed by one command only."""
import argparse

import pytest

from bk.cli.main import build_parser, main

# BookieShell's command names (its CMD_* constants), as an operator types them
BOOKKEEPER_NAMES = (
    "metaformat", "initbookie", "initnewcluster", "nukeexistingcluster", "bookieformat", "recover", "ledger",
    "readledger", "listledgers", "ledgermetadata", "listunderreplicated", "whoisauditor", "whatisinstanceid",
    "simpletest", "bookiesanity", "readlog", "readlogmetadata", "readjournal", "lastmark", "autorecovery",
    "listbookies", "listfilesondisc", "updatecookie", "updateledgers", "updateBookieInLedger", "deleteledger",
    "bookieinfo", "clusterinfo", "activeledgers", "decommissionbookie", "endpointinfo", "lostbookierecoverydelay",
    "triggeraudit", "forceauditchecks", "queryautorecoverystatus", "localconsistencycheck",
)
COMMON = {"help", "metadata_uri", "conf", "json"}


def subparsers(parser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def shell_commands() -> dict:
    return subparsers(subparsers(build_parser()).choices["shell"]).choices


def parsers_of(name: str, parser):
    """(label, parser) of a command and of each of its verbs (`cookie show`)."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for verb, sub in action.choices.items():
                yield f"{name} {verb}", sub


def test_every_bookkeeper_spelling_of_a_command_bk_has_is_accepted():
    cmds = shell_commands()
    lower = {n.lower(): n for n in cmds}
    implemented = [n for n in BOOKKEEPER_NAMES if n.lower() in lower]
    assert len(implemented) >= 30  # bk has nearly all of BookieShell's commands
    missing = [n for n in implemented if n not in cmds]
    assert not missing, f"BookKeeper's names not accepted: {missing}"
    for n in implemented:  # the alias is the same command, not a look-alike
        assert cmds[n] is cmds[n.lower()]


def test_the_camel_case_alias_runs_the_command(capsys, monkeypatch):
    monkeypatch.delenv("BK_METADATA_SERVICE_URI", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["shell", "updateBookieInLedger", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "-srcBookie" in out and "-destBookie" in out and "bookie id to replace" in out
    # parsed under BookKeeper's spelling, it reaches updatebookieinledger's handler: the
    # metadata store it needs is asked for first, and its absence is the clear error
    assert main(["shell", "--metadata-uri", "", "updateBookieInLedger", "-srcBookie", "a:1",
                 "-destBookie", "b:1"]) == 1
    assert "no metadata service" in capsys.readouterr().err


def test_shell_help_lists_every_command_with_its_help(capsys):
    cmds = shell_commands()
    with pytest.raises(SystemExit):
        main(["shell", "--help"])
    out = capsys.readouterr().out
    listed = {a.dest: a.help for a in subparsers(subparsers(build_parser()).choices["shell"])._choices_actions}
    assert set(listed) == {n for n, p in cmds.items() if p.prog.split()[-1] == n}  # aliases share the row
    for name, help in listed.items():
        assert help and name in out, name


def test_every_argument_of_every_command_is_explained():
    unexplained = []
    for name, parser in shell_commands().items():
        for label, p in parsers_of(name, parser):
            for a in p._actions:
                if a.dest not in COMMON and not isinstance(a, argparse._SubParsersAction) and not a.help:
                    unexplained.append(f"{label}: {'/'.join(a.option_strings) or a.dest}")
    assert not unexplained, unexplained


def test_a_name_is_declared_once():
    from bk.cli.commands import arg, command_table
    table, command = command_table()

    @command("x", help="one", args=(arg("--y", help="why"),))
    async def one(uri, args):
        return {}
    with pytest.raises(ValueError, match="declared twice"):
        @command("x", help="two")
        async def two(uri, args):
            return {}
    assert table["x"].fn is one and table["x"].help == "one" and not table["x"].local


def test_one_table_names_every_parser():
    from bk.cli import shell
    table = shell.table()
    assert set(table) == set(shell_commands())
    assert table["updateBookieInLedger"] is table["updatebookieinledger"]
    assert table["listfilesondisc"].local and not table["listbookies"].local
