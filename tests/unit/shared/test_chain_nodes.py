"""`ChainNodes.add_run` against the nodes it stands for, one by one, and the packing's round trip."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmplane.shared.chain_nodes import ChainNodes, unpack

INT64 = st.integers(-(2**63), 2**63 - 1)
runs = st.tuples(
    st.none() | INT64,
    # Depths past the table `add_run` copies from (4,096) take its other way.
    st.integers(0, 5_000) | st.integers(4_090, 4_100),
    st.lists(st.tuples(INT64, st.integers(0, 2**31 - 1)), max_size=20),
)


@given(st.lists(runs, max_size=8))
def test_runs_are_their_nodes_each_under_the_one_before(
    given_runs: list[tuple[int | None, int, list[tuple[int, int]]]],
) -> None:
    nodes = ChainNodes()
    expected = []
    for anchor, first_depth, run in given_runs:
        ids, tokens = [node for node, _ in run], [count for _, count in run]
        nodes.add_run(anchor, first_depth, ids, tokens)
        for offset, (node, count) in enumerate(run):
            parent = (anchor if anchor is not None else node) if offset == 0 else ids[offset - 1]
            expected.append((node, parent, count, first_depth + offset))

    stored = list(zip(nodes.ids, nodes.parents, nodes.tokens, nodes.depths, strict=True))
    assert stored == expected
    assert list(unpack(nodes.pack())) == list(nodes)
