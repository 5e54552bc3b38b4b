"""blocklab/cli/args.py: the argument parsers and the flags generated from the config dataclasses."""

import argparse

import pytest

import blocklab as bl
from blocklab.cli.args import (
    Parser,
    add_config_flags,
    add_train_flags,
    parse_accuracy,
    parse_bool,
    parse_value,
    parse_vary,
    set_fields,
)
from blocklab.inspect.trace.subject import parse_token_ids
from blocklab.nn.config import FIELDS
from blocklab.training.train_config import TRAIN_FIELDS


def test_parse_vary_reads_fields_and_values_and_names_what_is_wrong():
    vary = parse_vary(["n_layers=1,2", "norm-position=post,pre", "lr=1e-3"])
    assert vary == {"n_layers": [1, 2], "norm_position": ["post", "pre"], "lr": [0.001]}
    for bad, message in [(["nope=1"], "neither a ModelConfig field"), (["n_layers"], "FIELD=V1,V2"),
                         (["seed=1,2"], "--seeds"), (["lr=1", "lr=2"], "given twice")]:
        with pytest.raises(ValueError, match=message):
            parse_vary(bad)


def test_parse_vary_reads_each_value_as_the_fields_own_flag_does():
    """``none`` is a word for residual and norm (their ``none`` ablations: it was read as Python None and
    refused), None where a field takes none (n_kv_heads); a value the flag refuses is refused naming it."""
    vary = parse_vary(["residual=add,none", "norm=standard,none", "n_kv_heads=none,2", "d_ff=4x,64",
                       "target_accuracy=none,99%"])
    assert vary == {"residual": ["add", "none"], "norm": ["standard", "none"], "n_kv_heads": [None, 2],
                    "d_ff": ["4x", 64], "target_accuracy": [None, 0.99]}
    for value in ("add", "none"):
        assert bl.preset("listops-seed", residual=value).residual == value  # each value builds a model
    with pytest.raises(ValueError, match=r"--vary n_layers: .*'two'"):
        parse_vary(["n_layers=2,two"])


def test_parse_token_ids_accepts_commas_or_spaces_and_names_the_flag() -> None:
    assert parse_token_ids("1,2, 3 4") == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"--input needs integer ids.*'x' is not one"):
        parse_token_ids("1 x", "--input")
    with pytest.raises(ValueError, match="--tokens is empty"):
        parse_token_ids(" , ")


def test_value_parsers() -> None:
    assert [parse_value(t) for t in ("3", "1e-3", "none", "True", "post")] == [3, 0.001, None, True, "post"]
    assert parse_bool(" Yes ") is True and parse_bool("off") is False
    with pytest.raises(argparse.ArgumentTypeError, match="'maybe' is not true or false"):
        parse_bool("maybe")



def test_an_accuracy_is_a_fraction_or_a_percentage_with_its_sign() -> None:
    assert parse_accuracy("0.9") == 0.9 and parse_accuracy("1") == 1.0
    assert parse_accuracy("99.5%") == pytest.approx(0.995) and parse_accuracy("100%") == 1.0
    assert parse_accuracy("none") is None and parse_accuracy("off") is None and parse_accuracy("0") is None
    # 1.5 could mean 1.5% or 150%: refused, as is anything outside (0, 1] and what is not a number
    for bad in ("1.5", "99.5", "150%", "-0.5", "0%", "nan", "x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="fraction in"):
            parse_accuracy(bad)


def test_only_the_fields_given_on_the_command_line_are_set() -> None:
    parser = Parser()
    add_config_flags(parser)
    add_train_flags(parser)
    args = parser.parse_args(["--d-model", "32", "--final_norm", "auto", "--target-accuracy", "none"])
    # 'auto' and 'none' are values the user chose, not "unset"
    assert set_fields(args, FIELDS) == {"d_model": 32, "final_norm": None}
    assert set_fields(args, TRAIN_FIELDS) == {"target_accuracy": None}
    assert set_fields(parser.parse_args([]), FIELDS + TRAIN_FIELDS) == {}


def test_ablate_help_gives_the_threads_a_lab_run_uses(capsys: pytest.CaptureFixture) -> None:
    """train's runs default to auto threads (0); a grid's runs to one each (runs.LAB_THREADS)."""
    from blocklab.cli import main
    from blocklab.lab.grid import LAB_THREADS

    def threads_help(command: str) -> str:
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        after = text[text.index("--threads N torch threads"):]
        return after[after.index("(default:"):].split(")")[0] + ")"

    assert threads_help("train") == "(default: the task's, else 0)"
    assert threads_help("ablate") == f"(default: the task's, else {LAB_THREADS})"
