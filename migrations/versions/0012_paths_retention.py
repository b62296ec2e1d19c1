"""Indexes for the retention sweep of `prefix_paths`: a block-range index on `first_seen`, a B-tree on anchors.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30

`prefix_paths` gains about a row a request in chat traffic and was never swept. The planner now deletes
rows first seen before the statistics' cut that nothing still reaches: no retained `prefix_stats` or
`miss_stats` row names one of their prefixes (the statistics' keys answer that), and no other row of the
scope anchors at one of them (`services/planner/pg_retention.py`).

- `prefix_paths_first_seen_brin` finds the old rows without scanning the table: rows are inserted in
  roughly `first_seen` order and never updated, so a block range's summary stays narrow, and a BRIN
  index costs an insert next to nothing (`python -m bench.paths_index_bench`: ratio 0.996).
- `prefix_paths_anchor` ((scope_id, anchor_id)) answers "does another row hang below this one" with a
  probe per row for all its ids at once. Without it the question is an anti-join against the anchors of
  the whole table, a full scan and sort per sweep statement (1.4 s on 383,000 chat-shaped rows, of
  which 86,000 past the cut), growing with the table and paid every `sweep_interval_s` for every row
  retained: some 8,900 times a row over a 31-day retention swept every 5 minutes. The index is paid
  once a row: 4.7 us more an inserted path row (median of 3 runs, 4.1 to 7.2; path inserts 1.28 times
  as long) in `python -m bench.paths_index_bench --runs 3`; with it a sweep statement costs in
  proportion to the rows past the cut (0.84 s for those 86,000).

Building both on an existing table takes a lock that blocks writes; migrations run before the planners
start. The downgrade drops the indexes.
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX prefix_paths_first_seen_brin ON prefix_paths USING brin (first_seen)")
    op.execute("CREATE INDEX prefix_paths_anchor ON prefix_paths (scope_id, anchor_id)")


def downgrade() -> None:
    op.execute("DROP INDEX prefix_paths_anchor")
    op.execute("DROP INDEX prefix_paths_first_seen_brin")
