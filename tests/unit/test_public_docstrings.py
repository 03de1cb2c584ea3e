"""Every public class, function and method of the SDK (and the errors it raises) says what it is:
the SDK is what applications program against, so an undocumented name there is a defect."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PUBLIC_MODULES = [
    *sorted((ROOT / "kbroker" / "sdk").glob("*.py")),
    ROOT / "kbroker" / "errors.py",
    ROOT / "kbroker" / "__init__.py",
]


def undocumented(path: Path, root: Path = ROOT) -> list[str]:
    """`module:line name` of each public definition in `path` without a docstring."""
    found: list[str] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if child.name.startswith("_"):
                    continue
                if ast.get_docstring(child) is None:
                    found.append(f"{path.relative_to(root)}:{child.lineno} {prefix}{child.name}")
                if isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text()), "")
    return found


def test_the_checker_finds_a_missing_docstring(tmp_path: Path) -> None:
    sample = tmp_path / "probe.py"
    sample.write_text(
        'class Shown:\n    """Documented."""\n\n    def method(self):\n        pass\n\ndef _private():\n    pass\n'
    )
    assert undocumented(sample, tmp_path) == ["probe.py:4 Shown.method"]


def test_every_public_sdk_definition_has_a_docstring() -> None:
    assert len(PUBLIC_MODULES) > 5
    missing = [name for path in PUBLIC_MODULES for name in undocumented(path)]
    assert missing == []
