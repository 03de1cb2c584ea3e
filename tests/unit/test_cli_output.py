"""The CLI's tables: rich tables on a terminal, plain full-width rows everywhere else."""

from __future__ import annotations

import io

from rich.console import Console

from kbroker.cli.output import new_table, plain_table, print_table

HANDLE = "2f1c7d0e-9a4b-4c55-8e1f-3b2a6d9c0e17"
SERVICE = "//Adventure-Works.com/Expenses/A-Service-Name-Longer-Than-Any-Column"


def endpoints_table():
    table = new_table("conversation endpoints", "conversation_handle", "side", "service", "seq")
    table.columns[3].justify = "right"
    table.add_row(HANDLE, "I", SERVICE, "7")
    table.add_row("h2", "[green]T[/green]", "//s\n//t", "12")
    return table


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=80), out


def test_plain_rows_keep_every_value_whole_on_one_line():
    lines = plain_table(endpoints_table()).splitlines()
    assert lines[0] == "conversation endpoints"
    assert lines[1].split() == ["conversation_handle", "side", "service", "seq"]
    assert lines[2].split() == [HANDLE, "I", SERVICE, "7"]
    # markup removed, a multi-line value joined, a right-justified column aligned on the right
    assert lines[3].split() == ["h2", "T", "//s,", "//t", "12"]
    assert len({len(lines[2]), len(lines[3])}) == 1 and lines[3].endswith(" 12")
    # columns start at the same place on every line
    assert lines[1].index("side") == lines[2].index(" I ") + 1 == lines[3].index(" T ") + 1


def test_without_a_terminal_the_table_prints_plain_rows():
    out_console, out = console(terminal=False)
    print_table(endpoints_table(), out_console)
    assert out.getvalue() == plain_table(endpoints_table())
    assert any(HANDLE in line and SERVICE in line for line in out.getvalue().splitlines())


def test_on_a_terminal_the_table_is_drawn_by_rich():
    term_console, out = console(terminal=True)
    print_table(endpoints_table(), term_console)
    text = out.getvalue()
    assert "│" in text and "━" in text  # rich's box lines
    assert text != plain_table(endpoints_table())
