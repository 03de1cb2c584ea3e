"""The documents say only what exists: every repository path the README, CONTRIBUTING.md and
docs/*.md name is there, every link between them lands on a file (and a heading, when it names
one), and the docs site builds with `mkdocs build --strict`."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kbroker"


def documents() -> list[Path]:
    """The documents that describe the code as it is (the changelog names what was, so only its
    links are checked)."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


# --- paths ---------------------------------------------------------------------------------------

# The folders a path may start with: kbroker's layers and modules' folders (the docs write
# `core/x.py` for `kbroker/core/x.py`) and the repository's own top-level folders.
PACKAGE_ROOTS = ("core", "kafka", "sdk", "worker", "embedded", "activator", "analytics", "bench", "cli")
REPO_ROOTS = ("kbroker", "tests", "scripts", "docs", "compose", "topics", "examples", "bench-results", ".ci")
# A path token: one of those folders, a slash, then path characters. Not preceded by a character
# that would make it the tail of a longer word, path or URL (`x/core/...`, `kafka://`, `~/.cache/`).
PATH = re.compile(
    r"(?<![\w./@:~<>{}-])(?P<path>(?:%s)/[\w./*-]*)(?:::(?P<test>\w+))?"
    % "|".join(re.escape(r) for r in PACKAGE_ROOTS + REPO_ROOTS)
)
# What ends a file's name; anything else after a module's last dot is an attribute of it
# (`core/activation/monitor.LaunchReader`).
EXTENSIONS = set("py md yaml yml json toml png svg sh txt properties xml html js css cfg ini jar pom csv".split())


# Tokens that look like paths and are not: a ratio's definition, as the bench writes it in its table.
NOT_PATHS = {"kbroker/baseline", "baseline/kbroker"}


def made_by_a_run(rel: str) -> bool:
    """A file the repository ignores (.gitignore): a run writes it (`bench-results/quick.json`)."""
    patterns = [
        line.strip()
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel + "/", pat) for pat in patterns if "/" in pat)


def path_tokens(text: str) -> list[tuple[str, str | None]]:
    """Each path-like token of `text`, as written (trailing punctuation dropped), with the test
    function a `path::name` names."""
    out = []
    for m in PATH.finditer(text):
        token = m.group("path").rstrip(".-")
        placeholder = text[m.end() : m.end() + 1] in ("<", "{")  # docs/<topic>.md names a form, not a file
        if token not in NOT_PATHS and not placeholder:
            out.append((token, m.group("test")))
    return out


def _exists(rel: str) -> bool:
    """A path relative to the repository's root or to kbroker/ that exists (a glob matches)."""
    for base in (ROOT, PACKAGE):
        if any(ch in rel for ch in "*?"):
            if list(base.glob(rel)):
                return True
        elif (base / rel).exists():
            return True
    return False


def _module(rel: str) -> Path | None:
    """The file a module path names (`core/x` is core/x.py or core/x/__init__.py), if any."""
    for base in (ROOT, PACKAGE):
        for candidate in (base / f"{rel}.py", base / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def defines(module: Path, name: str) -> bool:
    """Whether a module defines or imports `name` (a function, class, method, constant, or a key
    of a lazy-import table such as kbroker/__init__.py's)."""
    n = re.escape(name)
    return (
        re.search(
            rf"^\s*(?:async\s+def|def|class)\s+{n}\b|^\s*{n}\s*[:=]|[\"']{n}[\"']\s*:|"
            rf"^\s*(?:from\s+\S+\s+)?import\b[^\n]*\b{n}\b|^\s+{n},?\s*$",
            module.read_text(),
            re.M,
        )
        is not None
    )


def problem(token: str, test: str | None = None) -> str | None:
    """Why a path token names nothing, or None when it names something that exists: a file or
    folder, a module and an attribute it defines (`kafka/snapshot.group_offsets`), or a test file and
    a test in it (`tests/unit/x.py::test_y`)."""
    rel = token.rstrip("/")
    head, _, last = rel.rpartition("/")
    name, dot, suffix = last.partition(".")
    if dot and suffix.split(".")[0] not in EXTENSIONS and "*" not in last:
        # module.attribute[.attribute]: the module exists and defines (or imports) the first name.
        module = _module(f"{head}/{name}")
        if module is None:
            return f"{token}: no module {head}/{name}"
        attr = suffix.split(".")[0]
        if not defines(module, attr):
            return f"{token}: {module.relative_to(ROOT)} has no {attr}"
        return None
    if not _exists(rel) and not made_by_a_run(rel):
        return f"{token}: no such file or folder"
    if test is not None:
        file = next(b / rel for b in (ROOT, PACKAGE) if (b / rel).is_file())
        if not re.search(rf"^\s*(async )?def {re.escape(test)}\b", file.read_text(), re.M):
            return f"{token}::{test}: no such test"
    return None


def stale_paths(text: str) -> list[str]:
    return [p for token, test in path_tokens(text) if (p := problem(token, test))]


# A dotted name of kbroker's in code marks: `kbroker.core.cluster`, `kbroker.sdk.pollers.PollerPool`,
# `kbroker.bench.procedures:drain` (a procedure's module and function).
DOTTED = re.compile(r"`(kbroker(?:\.\w+)+)(?::(\w+))?")


def dotted_problem(name: str, function: str | None = None) -> str | None:
    """Why `kbroker.a.b.c` names nothing: its longest prefix that is a module must define the
    next name (the rest are attributes of that one, not checked)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = _module("/".join(parts[:i]))
        if module is not None:
            rest = parts[i:] + ([function] if function else [])
            if rest and not defines(module, rest[0]):
                return f"{name}: {module.relative_to(ROOT)} has no {rest[0]}"
            return None
    return f"{name}: no such module"


def stale_names(text: str) -> list[str]:
    return [p for m in DOTTED.finditer(text) if (p := dotted_problem(m.group(1), m.group(2)))]


def test_every_path_a_document_names_exists() -> None:
    stale = [f"{doc.relative_to(ROOT)}: {p}" for doc in documents() for p in stale_paths(doc.read_text())]
    assert stale == []


def test_every_module_a_document_names_by_its_dotted_name_exists() -> None:
    stale = [f"{doc.relative_to(ROOT)}: {p}" for doc in documents() for p in stale_names(doc.read_text())]
    assert stale == []


@pytest.mark.parametrize(
    "text, stale",
    [
        ("`kbroker.core.cluster`, `kbroker.sdk.pollers.PollerPool`, `kbroker.ReaderPool(broker, q)`", []),
        ("`kbroker.bench.procedures:drain` and `kbroker.tracing.use_tracer_provider(p)`", []),
        ("`kbroker.pool.ReaderPool`", ["kbroker.pool.ReaderPool: kbroker/__init__.py has no pool"]),
        ("`kbroker.envelope.Envelope`", ["kbroker.envelope.Envelope: kbroker/__init__.py has no envelope"]),
        (
            "`kbroker.bench.procedures:nothing`",
            ["kbroker.bench.procedures: kbroker/bench/procedures.py has no nothing"],
        ),
    ],
)
def test_the_dotted_name_check(text: str, stale: list[str]) -> None:
    assert stale_names(text) == stale


@pytest.mark.parametrize(
    "text, found",
    [
        ("the tick lives in `core/activation/tick.py`", ["core/activation/tick.py"]),
        ("launches (`core/activation/monitor.LaunchReader`).", ["core/activation/monitor.LaunchReader"]),
        (
            "see kbroker/sdk/pollers.py, tests/unit/test_docs.py::test_the_path_check_finds_and_ignores",
            ["kbroker/sdk/pollers.py", "tests/unit/test_docs.py"],
        ),
        (
            "sdk/transport/ (the face), docs/routing.md#routes and compose/",
            ["sdk/transport/", "docs/routing.md", "compose/"],
        ),
        # Not paths: the tails of longer paths, URLs and Kafka addresses, other words with a slash.
        ("kafka://host:9092/sales, ~/.cache/kbroker, x/core/y.py, SEND/RECEIVE, Kafka/Faust", []),
        ("the rule's `kbroker.<ns>.queue.<Queue>` topic and docs/<topic>.md", []),
    ],
)
def test_the_path_check_finds_and_ignores(text: str, found: list[str]) -> None:
    assert [t for t, _ in path_tokens(text)] == found
    assert stale_paths(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "core/endpoint.default_group",  # a module that moved away
        "core/dialogs/statements.no_such_name",  # a name the module does not have
        "kafka/sender.py",  # a file that is not there
        "tests/unit/test_docs.py::test_nothing_of_the_kind",
    ],
)
def test_the_path_check_names_what_is_missing(text: str) -> None:
    assert [p.split(":")[0] for p in stale_paths(text)] == [text.split("::")[0]]


# --- links ---------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc (mkdocs) and GitHub both make it, for the
    headings these documents use: code marks and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def anchors(doc: Path) -> set[str]:
    text = FENCE.sub("", doc.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    text = FENCE.sub("", doc.read_text())
    out = []
    for m in [*LINK.finditer(text), *IMAGE.finditer(text)]:
        target = m.group("target")
        if re.match(r"[a-z]+:", target) or target.startswith("mailto:"):
            continue  # another site's page: not ours to check
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            out.append(f"{doc.relative_to(root)}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{doc.relative_to(root)}: {target}: no heading #{anchor}")
    return out


def test_every_link_between_the_documents_resolves() -> None:
    broken = [b for doc in [*documents(), ROOT / "CHANGELOG.md"] for b in broken_links(doc)]
    assert broken == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text(
        "# A\n\n## Some heading: `code`\n\n[b](b.md) [ok](#some-heading-code)\n"
        "[gone](#no-such) [site](https://example.com/x.md)\n```\n[not](a link.md)\n```\n"
    )
    assert broken_links(tmp_path / "a.md", tmp_path) == [
        "a.md: b.md: no such file",
        "a.md: #no-such: no heading #no-such",
    ]


def test_the_guarantees_and_sources_have_the_headings_the_code_cites() -> None:
    assert "g8-no-record-steers-or-stops-kbroker" in anchors(ROOT / "docs" / "guarantees.md")
    assert {f"g{n}" for n in range(1, 9)} == {
        a[:2] for a in anchors(ROOT / "docs" / "guarantees.md") if re.match(r"g\d-", a)
    }
    assert {
        "periodic-tasks",
        "the-nservicebus-sql-server-transport",
        "queue-monitors",
        "when-activation-happens",
        "other-service-broker-behaviours",
    } <= anchors(ROOT / "docs" / "sources.md")


def nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_pages(v)]
    if isinstance(nav, list):
        return [p for v in nav for p in nav_pages(v)]
    return []


def test_every_doc_is_in_the_site_and_the_readme_lists_it() -> None:
    import yaml

    pages = set(nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    docs = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert docs - pages == set(), "pages missing from mkdocs.yml's nav"
    assert pages - docs == set(), "nav entries with no page"
    readme = {m.group("target").partition("#")[0] for m in LINK.finditer((ROOT / "README.md").read_text())}
    site_only = {"index.md", "contributing.md"}  # the README is the home page; CONTRIBUTING.md is at the root
    unlisted = {d for d in docs if "/" not in d and d not in site_only and f"docs/{d}" not in readme}
    assert unlisted == set(), "docs the README's Documentation list leaves out"


# --- the site ------------------------------------------------------------------------------------


def test_the_docs_site_builds_strict(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "sdk" / "index.html").is_file()
    assert time.monotonic() - started < 120
