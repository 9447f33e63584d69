"""Each %%distributed option is declared once, on a field: the magic, its help, the request, the
environment fallback and the user guide's table all follow from that one declaration."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
from helpers.workers import assert_no_workers, nbtrain_workers
from IPython.core.error import UsageError

from nbtrain.kernel.request.config import ConfigError, LaunchRequest, resolve
from nbtrain.wire.options import OptionEnvError, from_arguments, option, options_of, with_env_fallbacks
from nbtrain.kernel.magics import CellDisplay, DistributedMagics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAGIC_CLASSES = (LaunchRequest, CellDisplay)


def declared():
    """(field, option) for every option of %%distributed, in help order."""
    return [pair for cls in MAGIC_CLASSES for pair in options_of(cls)]


def parser_actions():
    return [a for a in DistributedMagics.distributed.parser._actions if "-h" not in a.option_strings]


def test_every_field_has_exactly_one_option_and_every_option_one_field():
    for cls in MAGIC_CLASSES:
        fields = [f.name for f in dataclasses.fields(cls)]
        assert [f.name for f, _ in options_of(cls)] == fields, f"a field of {cls.__name__} is not an option"
    names = [f.name for f, _ in declared()]
    assert len(set(names)) == len(names), "LaunchRequest and CellDisplay share a field name"
    flags = [spec.flag for _, spec in declared()]
    assert len(set(flags)) == len(flags), "two fields declare the same flag"
    assert sorted(a.dest for a in parser_actions()) == sorted(names)  # one argument per field, none spare
    assert {a.option_strings[0] for a in parser_actions() if a.option_strings} == set(flags) - {None}


def non_default_line() -> tuple[str, dict]:
    """A %%distributed line giving every option a value other than its default, and the values expected."""
    words, expected = [], {}
    for f, spec in declared():
        if spec.switch:
            words.append(spec.flag)
            expected[f.name] = not f.default
            continue
        if spec.choices:
            text = next(c for c in spec.choices if c != f.default)
        else:
            text = {int: "3", float: "7.5"}.get(spec.type, "A=1" if spec.repeat else "x")
        value = spec.type(text) if spec.type else text
        expected[f.name] = (value,) if spec.repeat else value
        words += [text] if spec.flag is None else [spec.flag, text]
    return " ".join(words), expected


def test_the_parsed_line_becomes_the_request_by_field_name():
    line, expected = non_default_line()
    args = DistributedMagics.distributed.parser.parse_argstring(line)
    request, display = from_arguments(LaunchRequest, args), from_arguments(CellDisplay, args)
    got = {**dataclasses.asdict(request), **dataclasses.asdict(display)}
    assert got == expected
    defaults = DistributedMagics.distributed.parser.parse_argstring("")
    assert from_arguments(LaunchRequest, defaults) == LaunchRequest()
    assert from_arguments(CellDisplay, defaults) == CellDisplay()


def test_the_help_lists_every_option_with_its_help_and_variable(shell, capsys):
    shell.run_cell("%%distributed?").raise_error()
    shown = re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out))
    for f, spec in declared():
        assert (spec.flag or f.name) in shown, f"{spec.flag or f.name} is missing from %%distributed?"
        assert spec.help in shown, f"the help of {spec.flag or f.name} is missing from %%distributed?"
        if spec.env:
            assert f"[env: {spec.env}]" in shown


@dataclasses.dataclass(frozen=True)
class Sample:
    count: int | None = option(None, "--count", "a number", group="g", type=int, metavar="K", env="T_COUNT")
    mode: str = option("a", "--mode", "a choice", group="g", choices=("a", "b"), env="T_MODE")
    loud: bool = option(False, "--loud", "a switch", group="g", switch=True, env="T_LOUD")
    extra: tuple[str, ...] = option((), "--extra", "repeatable", group="g", repeat=True, env="T_EXTRA")
    plain: str | None = option(None, "--plain", "no variable", group="g")


def test_env_fallbacks_fill_only_options_left_out():
    environ = {"T_COUNT": "4", "T_MODE": "b", "T_LOUD": "yes", "T_EXTRA": "X=1", "T_PLAIN": "ignored"}
    assert with_env_fallbacks(Sample(), environ) == Sample(count=4, mode="b", loud=True, extra=("X=1",))
    given = Sample(count=2, mode="b", loud=True, extra=("Y=2",))
    assert with_env_fallbacks(given, {"T_COUNT": "4", "T_MODE": "a", "T_EXTRA": "X=1"}) == given
    assert with_env_fallbacks(Sample(), {"T_COUNT": ""}) == Sample()  # empty means unset
    assert with_env_fallbacks(Sample(), {"T_LOUD": "off"}) == Sample()


@pytest.mark.parametrize("environ, message", [
    ({"T_COUNT": "many"}, "T_COUNT must be a whole number (got 'many')."),
    ({"T_MODE": "c"}, "T_MODE must be one of a, b (got 'c')."),
    ({"T_LOUD": "loud"}, "T_LOUD must be on or off (got 'loud')."),
])
def test_a_bad_variable_is_named_with_what_it_takes(environ, message):
    with pytest.raises(OptionEnvError, match=re.escape(message)):
        with_env_fallbacks(Sample(), environ)


def test_start_timeout_comes_from_the_option_then_its_variable(monkeypatch):
    monkeypatch.delenv("NBTRAIN_START_TIMEOUT", raising=False)
    assert resolve(LaunchRequest(cpu=True)).start_timeout_s == 180
    monkeypatch.setenv("NBTRAIN_START_TIMEOUT", "42")
    assert resolve(LaunchRequest(cpu=True)).start_timeout_s == 42
    assert resolve(LaunchRequest(cpu=True, start_timeout=5)).start_timeout_s == 5
    monkeypatch.setenv("NBTRAIN_START_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match=re.escape("NBTRAIN_START_TIMEOUT must be a number of seconds (got 'soon').")):
        resolve(LaunchRequest(cpu=True))


@pytest.mark.parametrize("line, environ, message", [
    ("2 --cpu", {"NBTRAIN_START_TIMEOUT": "soon"}, "NBTRAIN_START_TIMEOUT must be a number of seconds"),
    ("2 --cpu --start-timeout 0", {}, "--start-timeout must be a positive number of seconds"),
    ("2 --cpu --start-timeout x", {}, "argument --start-timeout: invalid float value"),
])
def test_bad_start_timeouts_are_usage_errors_before_any_process(shell, monkeypatch, line, environ, message):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match=message):
        shell.run_cell_magic("distributed", line, "x = 1\n")
    assert {p.pid for p in nbtrain_workers()} == before


def test_start_timeout_bounds_the_start_of_real_ranks(shell, capsys):
    result = shell.run_cell("%%distributed 2 --cpu --fresh --keep-alive 0 --start-timeout 0.001\nx = 1\n")
    assert type(result.error_in_exec).__name__ == "RankFailedError"
    shown = capsys.readouterr()
    assert "did not join the process group within 0 s (--start-timeout SECONDS" in shown.out + shown.err
    assert_no_workers()


def options_table() -> dict[str, str]:
    """The rows of the user guide's options table, by the option they describe ("N", "--gpus", ...)."""
    with open(os.path.join(ROOT, "docs", "user-guide.md"), encoding="utf-8") as f:
        section = f.read().split("### Options", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `([^` ]+)", row).group(1): row for row in rows}


def test_the_user_guide_table_has_one_row_per_option_with_its_default_and_variable():
    table = options_table()
    assert set(table) == {spec.flag or "N" for _, spec in declared()}
    for _, spec in declared():
        row = table[spec.flag or "N"]
        default_column = row.split(" | ")[1]
        if spec.env:
            assert f"`{spec.env}`" in default_column, f"the row of {spec.flag} does not name {spec.env}"
        number = re.search(r"\(default (\d+)", spec.help)
        if number:
            assert default_column.startswith(number.group(1)), f"{spec.flag}: help and user guide disagree"
        for choice in spec.choices or ():
            assert choice in row


def test_a_rank_outside_a_cell_reads_the_training_options_through_the_same_declarations(tmp_path):
    from nbtrain.wire.settings import (
        TrainOptions, TrainSettingsError, parse_train_settings, settings_from_environment
    )

    given = {"amp": "bf16", "grad_accum": 3, "checkpoint": str(tmp_path / "run"), "channels_last": False,
             "compile": "eager", "shard": "full"}
    environ = {}
    for f, spec in options_of(TrainOptions):
        if f.name in given:
            assert spec.env, f"{spec.flag} is read by ranks outside a cell, so it declares a variable"
            value = given[f.name]
            environ[spec.env] = "off" if value is False else str(value)
    assert settings_from_environment(environ) == parse_train_settings(TrainOptions(**given))
    with pytest.raises(OptionEnvError, match="NBTRAIN_GRAD_ACCUM must be a whole number"):
        settings_from_environment({"NBTRAIN_GRAD_ACCUM": "two"})
    with pytest.raises(TrainSettingsError, match="--grad-accum"):
        settings_from_environment({"NBTRAIN_GRAD_ACCUM": "0"})
    assert settings_from_environment({}) == parse_train_settings(TrainOptions())


def test_distributed_nodes_shares_the_cells_node_options_and_their_variables(shell, monkeypatch):
    from nbtrain.kernel.magics import NODE_OPTIONS, NodesCommand, node_options

    parser = DistributedMagics.distributed_nodes.parser
    helps = {a.dest: a.help for a in parser._actions if a.option_strings and "-h" not in a.option_strings}
    shared = {f.name: spec.help_text() for f, spec in options_of(LaunchRequest) if f.name in NODE_OPTIONS}
    own = {f.name: spec.help_text() for f, spec in options_of(NodesCommand)}
    assert helps == {**shared, **own}  # generated from the declarations, none written again
    monkeypatch.setenv("NBTRAIN_SSH_OPTION", "Port=2222")
    monkeypatch.setenv("NBTRAIN_REMOTE_PYTHON", "python3.11")
    nodes = node_options(parser.parse_argstring("--hosts a,b"))
    assert (nodes.hosts, nodes.ssh_option, nodes.remote_python) == ("a,b", ("Port=2222",), "python3.11")
    given = node_options(parser.parse_argstring("--ssh-option Port=22 --remote-python py"))
    assert (given.ssh_option, given.remote_python) == (("Port=22",), "py")
    with pytest.raises(UsageError, match="--hosts needs --rdzv-host"):
        shell.run_line_magic("distributed_nodes", "--hosts a,b")


@pytest.mark.parametrize("line, message", [
    ("2 --chekpoint x", "unknown option --chekpoint; did you mean --checkpoint?"),
    ("2 --cpu --keepalive=5", "unknown option --keepalive; did you mean --keep-alive?"),
    ("2 --zzz", "unknown option --zzz; `%%distributed?` lists the options this magic takes."),
])
def test_a_mistyped_option_names_the_closest_one_before_any_process(shell, line, message):
    before = {p.pid for p in nbtrain_workers()}
    with pytest.raises(UsageError, match=re.escape(message)):
        shell.run_cell_magic("distributed", line, "x = 1\n")
    assert {p.pid for p in nbtrain_workers()} == before


def test_a_mistyped_option_of_a_line_magic_names_the_closest_one(shell):
    with pytest.raises(UsageError, match=re.escape("unknown option --emulte; did you mean --emulate?")):
        shell.run_line_magic("distributed_nodes", "--rdzv-host 127.0.0.1 --emulte 1")
