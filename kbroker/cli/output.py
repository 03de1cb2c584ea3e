"""Tables and messages on a terminal and everywhere else.

On a terminal the commands print rich tables that fit its width. Without one (a pipe, a file, a
CI log) rich assumes 80 columns and would fold names and handles into pieces or cut them with an
ellipsis, so there a table becomes plain rows: one record per line, columns aligned with spaces,
no value shortened, and long messages are not wrapped either.

rich is imported when something is printed, not when the CLI starts (`kbroker --help`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

COLUMN_GAP = "  "


def make_console(stderr: bool = False) -> Console:
    """A rich Console on stdout (or stderr) that does not wrap lines when it is not a terminal."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.soft_wrap = True  # a line in a log stays one line, however long
    return console


def new_table(title: str, *columns: str) -> Table:
    """A table whose long values wrap on a terminal rather than being cut."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def print_table(table: Table, console: Console | None = None) -> None:
    """The table as rich draws it on a terminal, else as plain aligned rows (see the module)."""
    console = console or make_console()
    if console.is_terminal:
        console.print(table)
        return
    console.file.write(plain_table(table))
    console.file.flush()


def plain_table(table: Table) -> str:
    """The title, the header and one line per row; columns padded with spaces to their widest
    value, right-justified columns to the right. Markup is removed; a value of several lines
    becomes one, its lines joined by ', '."""
    headers = [_plain(column.header) for column in table.columns]
    cells = [[_plain(cell) for cell in column.cells] for column in table.columns]
    rows = [headers, *(list(row) for row in zip(*cells))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
    right = [column.justify == "right" for column in table.columns]
    lines = [_plain(table.title)] if table.title else []
    for row in rows:
        padded = [
            value.rjust(width) if is_right else value.ljust(width) for value, width, is_right in zip(row, widths, right)
        ]
        lines.append(COLUMN_GAP.join(padded).rstrip())
    return "".join(line + "\n" for line in lines)


def _plain(value: Any) -> str:
    from rich.errors import MarkupError
    from rich.markup import render
    from rich.text import Text

    if isinstance(value, Text):
        text = value
    else:
        try:
            text = render(str(value))  # as rich reads a str cell on a terminal: markup
        except MarkupError:
            text = Text(str(value))
    return ", ".join(line.strip() for line in text.plain.splitlines() if line.strip())
