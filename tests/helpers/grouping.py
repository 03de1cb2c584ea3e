"""Which pytest-xdist group each test file runs in (tests/conftest.py): a file alone, or with
every file that shares a session-wide fixture with it, so that one process starts that fixture."""

from __future__ import annotations

from collections.abc import Mapping, Set


def groups_of_files(shared_of_file: Mapping[str, Set[str]]) -> dict[str, str]:
    """Each file's group, from the shared sessions (e.g. "spark", "secure") its tests use: the
    file's own path when it uses none; else the sessions it uses joined with every session a file
    uses together with one of them ("secure+spark"), so that all those files run in one process."""
    joined: dict[str, frozenset[str]] = {}
    for shared in shared_of_file.values():
        union = frozenset(shared).union(*(joined.get(g, frozenset()) for g in shared))
        for g in union:
            joined[g] = union
    return {
        file: "+".join(sorted(joined[next(iter(shared))])) if shared else file
        for file, shared in shared_of_file.items()
    }
