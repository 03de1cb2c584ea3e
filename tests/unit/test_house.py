"""The house rules of the package's layout (docs/architecture.md, CONTRIBUTING.md): modules of one
job and a bounded size, one name per module within a layer, a purpose on every feature folder,
and no reference to a document a reader of the repository cannot open."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kbroker"
LAYERS = ("core", "kafka", "embedded", "sdk", "worker", "activator", "analytics", "bench", "cli")
MAX_LINES = 400  # outside bench/, whose scenarios each carry their baseline beside them
# The two faces of the SDK name the same concept the same way: a transaction, its runtime and its
# asyncio form are one word whether the face is Service Broker's or the transport's.
MIRRORED = {("sdk", "aio.py"), ("sdk", "runtime.py"), ("sdk", "transaction.py")}
# Documents outside the repository the code once cited; their content lives in docs/ now
# (docs/guarantees.md, docs/sources.md).
OUTSIDE = re.compile(r"\bseeds? 00\d|\bDESIGN\.md\b|\breference item \d+|ssb-behaviours|checklist\.md|SSB item")
GUARANTEE = re.compile(r"\bG([1-9]\d*)\b")
DOCS = PACKAGE.parent / "docs"


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_outside_bench_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in modules()
        if p.relative_to(PACKAGE).parts[0] != "bench" and (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_no_two_modules_of_a_layer_share_a_name() -> None:
    seen: dict[tuple[str, str], list[str]] = defaultdict(list)
    for p in modules():
        rel = p.relative_to(PACKAGE)
        if len(rel.parts) > 1 and p.name != "__init__.py":
            seen[(rel.parts[0], p.name)].append(str(rel))
    shared = {k: v for k, v in seen.items() if len(v) > 1 and k not in MIRRORED}
    assert shared == {}


def test_every_feature_folder_says_what_it_holds() -> None:
    silent = []
    for init in PACKAGE.rglob("__init__.py"):
        rel = init.parent.relative_to(PACKAGE)
        if len(rel.parts) == 2 and rel.parts[0] in LAYERS:  # a feature folder inside a layer
            if not ast.get_docstring(ast.parse(init.read_text())):
                silent.append(str(rel))
    assert silent == []


def test_the_code_cites_only_documents_in_the_repository() -> None:
    cited = [
        f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}"
        for p in modules()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert cited == []


def test_every_guarantee_the_code_cites_is_in_the_docs() -> None:
    headings = set(re.findall(r"^## G(\d+) ", (DOCS / "guarantees.md").read_text(), re.M))
    cited = {n for p in modules() for n in GUARANTEE.findall(p.read_text())}
    assert cited and cited <= headings, sorted(cited - headings)


def test_every_source_item_the_code_cites_is_in_the_docs() -> None:
    listed = {int(n) for n in re.findall(r"^- \*\*(\d+)[.-]", (DOCS / "sources.md").read_text(), re.M)}
    spans = [tuple(map(int, m)) for m in re.findall(r"^- \*\*(\d+)-(\d+)\.", (DOCS / "sources.md").read_text(), re.M)]
    covered = listed | {n for a, b in spans for n in range(a, b + 1)}
    cited = {int(n) for p in modules() for n in re.findall(r"docs/sources\.md, items? (\d+)", p.read_text())}
    assert cited and cited <= covered, sorted(cited - covered)


@pytest.mark.parametrize("text", ["see seed 003", "(DESIGN.md)", "reference item 124", "ssb-behaviours items 35-44"])
def test_the_citation_check_finds_each_kind(text: str) -> None:
    assert OUTSIDE.search(text)
