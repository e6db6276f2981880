"""The README's flag table ("### Server options") lists every flag of ``radixserve serve --help``
and no flag that is gone: a config field added without its row, or a row left behind by a
removed field, fails here."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from radixserve.cli import add_config_args, build_parser

ROOT = Path(__file__).resolve().parents[2]
IGNORED = {"--help"}


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The long options of ``parser``: a boolean ``--x`` without its ``--no-x``, and no ``--help``."""
    flags: set[str] = set()
    for action in parser._actions:
        names = [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse.BooleanOptionalAction):
            names = names[:1]  # the negation is implied (the README says so once)
        flags.update(n for n in names if n not in IGNORED)
    return flags


def table_flags(section: str) -> set[str]:
    """The flags named in the first cell of the table rows of ``section`` (a row may name
    several: "`--nnodes` / `--node-rank`"; "`--lora-paths NAME=PATH ...`" names ``--lora-paths``)."""
    flags: set[str] = set()
    for line in section.splitlines():
        cells = line.strip().split("|")
        if len(cells) < 3 or not line.lstrip().startswith("|"):
            continue
        flags.update(re.findall(r"`(--[a-z0-9][a-z0-9-]*)", cells[1]))
    return flags


def flag_table_problems(parser: argparse.ArgumentParser, section: str) -> tuple[set[str], set[str]]:
    """(flags of ``parser`` with no row, rows naming a flag ``parser`` lacks)."""
    have, listed = parser_flags(parser), table_flags(section)
    return have - listed, listed - have


def server_options_section(text: str) -> str:
    """The README's "### Server options" section, up to the next heading."""
    m = re.search(r"^### Server options\n(.*?)(?=^#{1,3} )", text, re.M | re.S)
    assert m, "README.md has a '### Server options' section"
    return m.group(1)


def serve_parser() -> argparse.ArgumentParser:
    """``radixserve serve``'s parser, built in process."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_the_readme_flag_table_lists_every_serve_flag_and_no_other():
    missing, stale = flag_table_problems(serve_parser(), server_options_section((ROOT / "README.md").read_text()))
    assert not missing, f"add a row to README.md's 'Server options' table for: {sorted(missing)}"
    assert not stale, f"README.md's 'Server options' table names flags serve no longer has: {sorted(stale)}"


# ---------------------------------------------------------------- the checker on a synthetic parser


@dataclass(frozen=True)
class SampleConfig:
    """A config as the CLI sees it: one flag per field."""

    alpha: int = 1
    use_beta: bool = False
    mode: Literal["a", "b"] = "a"
    node_count: int = 1


@dataclass(frozen=True)
class SampleConfigGrown(SampleConfig):
    """The same config after a field was added."""

    new_knob: float = 0.5


SAMPLE_TABLE = """\
| flag | default | meaning |
|---|---|---|
| **group** | | |
| `--alpha` | `1` | the alpha; see also `--mentioned-only-here` |
| `--use-beta` / `--mode` | off / `a` | two flags in one row |
| `--node-count N` | `1` | a flag with its argument |

Prose that names `--not-in-a-table` is no row.
"""


def sample_parser(cls: type) -> argparse.ArgumentParser:
    """A parser built from ``cls`` the way ``radixserve serve``'s is built from the configs."""
    parser = argparse.ArgumentParser(prog="sample")
    add_config_args(parser, cls)
    return parser


def test_the_checker_reads_rows_and_flags_as_the_readme_writes_them():
    assert table_flags(SAMPLE_TABLE) == {"--alpha", "--use-beta", "--mode", "--node-count"}
    assert parser_flags(sample_parser(SampleConfig)) == {"--alpha", "--use-beta", "--mode", "--node-count"}
    assert flag_table_problems(sample_parser(SampleConfig), SAMPLE_TABLE) == (set(), set())


def test_the_checker_fails_when_a_field_is_added_without_its_row():
    assert flag_table_problems(sample_parser(SampleConfigGrown), SAMPLE_TABLE) == ({"--new-knob"}, set())


def test_the_checker_fails_on_a_row_whose_flag_is_gone():
    stale_table = SAMPLE_TABLE + "| `--removed-flag` | `0` | no longer a field |\n"
    assert flag_table_problems(sample_parser(SampleConfig), stale_table) == (set(), {"--removed-flag"})


def test_the_section_ends_at_the_next_heading():
    text = "## Serve\n### Server options\n| `--a` | | |\n### Other\n| `--b` | | |\n"
    assert table_flags(server_options_section(text)) == {"--a"}
