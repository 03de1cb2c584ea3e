"""The suite's pytest-xdist groups (tests/helpers/grouping.py): a session-wide fixture is started
by one process only when every file that uses it, directly or through a file that also uses
another, is in one group."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.grouping import groups_of_files


def test_a_file_without_shared_sessions_is_its_own_group():
    assert groups_of_files({"a.py": set(), "b.py": set()}) == {"a.py": "a.py", "b.py": "b.py"}


def test_a_file_using_two_sessions_joins_every_file_of_either():
    groups = groups_of_files(
        {"analytics.py": {"spark"}, "acls.py": {"secure"}, "secured.py": {"secure", "spark"}, "plain.py": set()}
    )
    assert groups == {
        "analytics.py": "secure+spark",
        "acls.py": "secure+spark",
        "secured.py": "secure+spark",
        "plain.py": "plain.py",
    }


def test_sessions_never_used_together_stay_apart():
    assert groups_of_files({"a.py": {"spark"}, "b.py": {"secure"}}) == {"a.py": "spark", "b.py": "secure"}


def test_a_chain_of_files_joins_all_its_sessions_whatever_the_order():
    files = {"1.py": {"a", "b"}, "2.py": {"c", "d"}, "3.py": {"b", "c"}, "4.py": {"d"}}
    assert set(groups_of_files(files).values()) == {"a+b+c+d"}


@given(
    st.dictionaries(
        st.sampled_from([f"f{i}.py" for i in range(8)]), st.sets(st.sampled_from("abcde"), max_size=3), max_size=8
    )
)
def test_files_sharing_a_session_share_a_group(shared_of_file):
    groups = groups_of_files(shared_of_file)
    assert groups.keys() == shared_of_file.keys()
    for f, shared in shared_of_file.items():
        assert shared <= set(groups[f].split("+")) if shared else groups[f] == f
        for g, other in shared_of_file.items():
            if shared & other:
                assert groups[f] == groups[g]
