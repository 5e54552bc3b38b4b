"""One grammar for every command: walk every subcommand's parser and check that a flag means one thing
everywhere, that the shared flags come from one builder, that every flag taking one of a few values
lists them and its default in --help, and that every command describes itself."""

from __future__ import annotations

import argparse
from collections import defaultdict

import pytest

from blocklab.cli import build_parser
from blocklab.cli.args import FIELD_HELP, _field_parser, parse_bool, parse_bool_or_auto, parse_optional_bool
from blocklab.nn.config import CHOICES, FIELDS, NORMS
from blocklab.nn.presets import PRESETS
from blocklab.tasks import TASKS
from blocklab.training.train_config import TRAIN_FIELDS

PARSER = build_parser()
COMMANDS = {name: PARSER.command_parser(name) for name in PARSER.commands()}


def flag_actions() -> list[tuple[str, argparse.Action]]:
    """(command, action) for every flag of every command (help and the top level's own left out)."""
    return [(name, a) for name, p in COMMANDS.items() for a in p._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_command_has_a_summary_and_its_own_description() -> None:
    sub = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {c.dest: c.help for c in sub._choices_actions}
    for name, parser in COMMANDS.items():
        assert summaries[name] and parser.description, name
        assert parser.description.strip() != summaries[name].strip(), f"{name}: say more than the summary"
    assert PARSER.description and "Usage" not in PARSER.description and "``" not in PARSER.description
    assert len(COMMANDS) >= 12  # train eval predict trace diagnose ablate claims import embed generate ...


def test_a_flag_means_one_thing_everywhere() -> None:
    """The same flag name takes the same kind of value (or none) on every command that has it."""
    shapes: dict[str, set[tuple]] = defaultdict(set)
    for _, action in flag_actions():
        shape = (action.nargs, action.const, action.metavar, action.nargs != 0 and action.const is None
                 and not isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)))
        for flag in action.option_strings:
            shapes[flag].add(shape)
    mixed = {flag: s for flag, s in shapes.items() if len(s) > 1}
    assert not mixed, mixed


@pytest.mark.parametrize("flag", ["--json", "--model", "--out", "--jobs", "--task", "--seed", "--quiet"])
def test_shared_flags_come_from_one_builder(flag) -> None:
    """Shared flags have one parser, one default and one rule (their help may name what the command does)."""
    found = [(name, a) for name, a in flag_actions() if flag in a.option_strings]
    assert len(found) >= 2, f"{flag} is not shared"
    # a command taking several (explore's --model) repeats the flag: the same value, appended
    kinds = {(getattr(a.type, "__qualname__", a.type), a.nargs, a.const, a.metavar,
              argparse._StoreAction if isinstance(a, argparse._AppendAction) else type(a))
             for _, a in found}
    assert len(kinds) == 1, kinds
    if flag == "--json":
        (_, a), *_ = found
        assert a.nargs == "?" and a.const == "-" and a.metavar == "FILE"
        assert all("--json FILE writes it to FILE" in a.help for _, a in found)
    if flag == "--jobs":
        assert {a.default for _, a in found} == {None}  # one rule: one per CPU core
        assert len({a.help for _, a in found}) == 1


def test_json_is_on_every_command_that_prints_a_result() -> None:
    without = {name for name, p in COMMANDS.items() if "--json" not in p.option_strings()}
    # import: its positional MODEL would be taken for --json's FILE; explore serves a page (no result)
    assert without == {"import", "explore"}


def allowed_values(action: argparse.Action) -> list[str] | None:
    """The closed set of values a flag takes, or None when it takes any number/text."""
    if action.choices is not None:
        return [str(c) for c in action.choices]
    if action.dest in CHOICES:
        return list(CHOICES[action.dest])
    if action.type is parse_bool:
        return ["true", "false"]
    if action.type in (parse_optional_bool, parse_bool_or_auto):
        return ["true", "false", "auto"]
    return {"preset": list(PRESETS), "task": list(TASKS)}.get(action.dest)


def test_every_choice_flag_lists_its_values_and_its_default() -> None:
    checked = set()
    for name, action in flag_actions():
        values = allowed_values(action)
        if values is None:
            continue
        text = action.help % {"default": action.default} if action.help else ""
        missing = [v for v in values if v not in text]
        assert not missing, f"{name} {action.option_strings[0]}: help does not list {missing}: {text!r}"
        assert "(default: " in text, f"{name} {action.option_strings[0]}: help names no default: {text!r}"
        checked.add(action.dest)
    assert set(CHOICES) <= checked and {"split", "dtype", "preset", "task", "bias"} <= checked


def test_every_config_field_is_a_flag_with_a_default_in_its_help() -> None:
    train = COMMANDS["train"]
    by_dest = {a.dest: a for a in train._actions}
    for field in (*FIELDS, *TRAIN_FIELDS):
        assert field in by_dest and "(default: " in by_dest[field].help, field
        assert by_dest[field].option_strings == [f"--{field.replace('_', '-')}"]
        assert FIELD_HELP.get(field), f"{field}: no line in cli/args.py FIELD_HELP saying what it means"


def test_private_config_fields_are_no_flags() -> None:
    # ModelConfig._derived (init=False) records which fields were derived; it is no user setting
    flags = {o for parser in COMMANDS.values() for a in parser._actions for o in a.option_strings}
    assert not [f for f in flags if f.startswith("---") or f.startswith("--_")]
    assert "_derived" not in {a.dest for a in COMMANDS["train"]._actions}


def test_fused_takes_true_false_or_auto() -> None:
    train = COMMANDS["train"]
    for text, value in (("true", True), ("false", False), ("auto", "auto"), ("AUTO", "auto")):
        assert train.parse_args(["--fused", text]).fused == value
    assert "true, false or auto" in next(a for a in train._actions if a.dest == "fused").help


def test_a_new_variant_appears_in_help_by_itself(monkeypatch) -> None:
    monkeypatch.setitem(CHOICES, "norm", (*NORMS, "brand_new_norm"))
    assert "brand_new_norm" in build_parser().command_parser("params").format_help()


def test_every_help_renders(capsys) -> None:
    for name, parser in COMMANDS.items():
        text = parser.format_help()
        assert text.startswith("Usage: blocklab ") and "Traceback" not in text, name
    assert "blocklab COMMAND --help" in PARSER.format_help()


def test_a_number_field_that_may_be_unset_takes_a_number_or_none() -> None:
    # e.g. a ``pos_std: float | None = None``: the flag's text must become a float or None, never a str
    parse, metavar, values = _field_parser("some_std", None, "float | None")
    assert (parse("0.5"), parse("none"), metavar) == (0.5, None, "X|none")
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not a number"):
        parse("x")
