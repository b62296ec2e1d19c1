"""`prefix_chains`: a batch's new chain nodes in one row a scope, where `prefix_paths` held a row a request.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07

On chat traffic nearly every request adds chain nodes, and `prefix_paths` took a row for each (with its
primary key, the anchors' B-tree and a BRIN index): most of Postgres's CPU for a chat batch's write, more
than its counts (`python -m bench.batch_write_bench`; figures in bench/RESULTS.md), and the planner's text
literals for their arrays on top. So a batch now writes its new nodes as one packed value per scope
(`shared/chain_nodes.py`: ids, parents, cumulative tokens and depths, big-endian, 24 bytes a node), stored
out of line uncompressed (random 64-bit ids do not compress), in the same transaction as its counts and
offsets. `written_at` is the transaction's time: a node's parent is in its own row or in an older one.

Readers: a plan's read streams a model's rows newest first and keeps the nodes on its leaves' chains
(`core/chains_read.py`); the API's chain tree unpacks a scope's rows in Python; SQL reads them through
`warmplane_chain_nodes(nodes)` and the `prefix_nodes` view, kept with its columns (the devstack's summary,
ad-hoc queries). The sweep drops rows by age
(`pg_retention.py` argues why that keeps every chain a retained count reaches). Existing path rows become
one-row chains, each at its `first_seen`.

The downgrade writes every node back as a path row of its own (the same trees; rows of longer runs are
not rebuilt), and restores 0009's function and 0012's indexes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

PREFIX_CHAINS = (
    """
    CREATE TABLE prefix_chains (
        scope_id   integer     NOT NULL,
        written_at timestamptz NOT NULL DEFAULT now(),
        nodes      bytea       NOT NULL
    )
    """,
    "ALTER TABLE prefix_chains ALTER COLUMN nodes SET STORAGE EXTERNAL",
    "CREATE INDEX prefix_chains_scope ON prefix_chains (scope_id, written_at)",
    """
    COMMENT ON COLUMN prefix_chains.nodes IS
        'n ids, n parents (a root''s is itself), n tokens, n depths; big-endian int8, int8, int4, int4'
    """,
)
"""One statement each: a migration runs them one at a time."""

CHAIN_NODES = r"""
CREATE FUNCTION warmplane_chain_nodes(packed bytea)
RETURNS TABLE (prefix_id bigint, parent_id bigint, depth integer, tokens integer)
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
DECLARE
    whole bytea := packed || ''::bytea;  -- read out of line once, not once a node
    n integer := length(packed) / 24;
BEGIN
    FOR i IN 0 .. n - 1 LOOP
        prefix_id := ('x' || encode(substring(whole FROM 8 * i + 1 FOR 8), 'hex'))::bit(64)::bigint;
        parent_id := ('x' || encode(substring(whole FROM 8 * (n + i) + 1 FOR 8), 'hex'))::bit(64)::bigint;
        tokens := ('x' || encode(substring(whole FROM 16 * n + 4 * i + 1 FOR 4), 'hex'))::bit(32)::integer;
        depth := ('x' || encode(substring(whole FROM 20 * n + 4 * i + 1 FOR 4), 'hex'))::bit(32)::integer;
        IF parent_id = prefix_id THEN
            parent_id := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$
"""

NODES_VIEW = """
CREATE VIEW prefix_nodes AS
SELECT DISTINCT ON (c.scope_id, n.prefix_id)
       c.scope_id, n.prefix_id, n.parent_id, n.depth, n.tokens, c.written_at AS first_seen
FROM prefix_chains c, warmplane_chain_nodes(c.nodes) AS n
ORDER BY c.scope_id, n.prefix_id, c.written_at
"""

FROM_PATHS = """
INSERT INTO prefix_chains (scope_id, written_at, nodes)
SELECT p.scope_id, p.first_seen,
       (SELECT string_agg(int8send(u.id), ''::bytea ORDER BY u.o)
        FROM unnest(p.ids) WITH ORDINALITY AS u(id, o))
    || (SELECT string_agg(int8send(CASE WHEN u.o = 1 THEN coalesce(p.anchor_id, u.id) ELSE p.ids[u.o - 1] END),
                          ''::bytea ORDER BY u.o)
        FROM unnest(p.ids) WITH ORDINALITY AS u(id, o))
    || (SELECT string_agg(int4send(t.tokens), ''::bytea ORDER BY t.o)
        FROM unnest(p.tokens) WITH ORDINALITY AS t(tokens, o))
    || (SELECT string_agg(int4send(p.first_depth + d.o - 1), ''::bytea ORDER BY d.o)
        FROM generate_series(1, cardinality(p.ids)) AS d(o))
FROM prefix_paths p
WHERE cardinality(p.ids) > 0
"""

PATHS = (
    """
    CREATE TABLE prefix_paths (
        scope_id    integer   NOT NULL,
        leaf_id     bigint    NOT NULL,
        anchor_id   bigint,
        first_depth integer   NOT NULL,
        ids         bigint[]  NOT NULL,
        tokens      integer[] NOT NULL,
        first_seen  timestamptz NOT NULL,
        PRIMARY KEY (scope_id, leaf_id)
    )
    """,
    """
    COMMENT ON COLUMN prefix_paths.anchor_id IS
        'the parent of ids[1]: a prefix already known, or NULL at the root'
    """,
    "CREATE INDEX prefix_paths_first_seen_brin ON prefix_paths USING brin (first_seen)",
    "CREATE INDEX prefix_paths_anchor ON prefix_paths (scope_id, anchor_id)",
    """
    INSERT INTO prefix_paths (scope_id, leaf_id, anchor_id, first_depth, ids, tokens, first_seen)
    SELECT scope_id, prefix_id, parent_id, depth, ARRAY[prefix_id], ARRAY[tokens], first_seen FROM prefix_nodes
    ON CONFLICT DO NOTHING
    """,
)

PATHS_VIEW = """
CREATE VIEW prefix_nodes AS
SELECT DISTINCT ON (p.scope_id, u.prefix_id)
       p.scope_id, u.prefix_id,
       CASE WHEN u.ord = 1 THEN p.anchor_id ELSE p.ids[u.ord - 1] END AS parent_id,
       p.first_depth + u.ord::integer - 1 AS depth, u.tokens, p.first_seen
FROM prefix_paths p, unnest(p.ids, p.tokens) WITH ORDINALITY AS u(prefix_id, tokens, ord)
ORDER BY p.scope_id, u.prefix_id, p.first_seen
"""

INGEST_EVENTS = r"""
CREATE FUNCTION warmplane_ingest_events(
    p_group text, p_topics text[], p_parts integer[], p_expected bigint[], p_first bigint[], p_last bigint[],
    p_ids bytea[], p_bucket_seconds integer,
    c_chains_scope integer[], c_chains_nodes bytea[],
    c_scope integer[], c_prefix bigint[], c_payload text[], c_tokens integer[], c_seen timestamptz[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    moved integer;
    started integer;
BEGIN
    UPDATE ingest_offsets o SET next_offset = u.last + 1, updated_at = now()
    FROM unnest(p_topics, p_parts, p_expected, p_last) AS u(topic, part, expected, last)
    WHERE u.expected IS NOT NULL AND o.group_id = p_group AND o.topic = u.topic
      AND o.partition = u.part AND o.next_offset = u.expected;
    GET DIAGNOSTICS moved = ROW_COUNT;
    INSERT INTO ingest_offsets (group_id, topic, partition, next_offset)
    SELECT p_group, u.topic, u.part, u.last + 1
    FROM unnest(p_topics, p_parts, p_expected, p_last) AS u(topic, part, expected, last)
    WHERE u.expected IS NULL
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS started = ROW_COUNT;
    IF moved + started <> coalesce(cardinality(p_topics), 0) THEN
        RAISE EXCEPTION 'a partition of this batch was moved by another consumer' USING ERRCODE = 'WP001';
    END IF;

    INSERT INTO ingest_ledger (topic, partition, first_offset, last_offset, event_ids)
    SELECT * FROM unnest(p_topics, p_parts, p_first, p_last, p_ids);

    -- A bucket is the whole Unix seconds of occurred_at, floor-divided by the width.
    INSERT INTO prefix_stats AS s (scope_id, prefix_id, bucket, requests, cold_requests, prompt_tokens,
                                   cached_tokens, ttft_ms_sum, ttft_count)
    SELECT b.scope_id, b.prefix_id, floor(trunc(b.at) / p_bucket_seconds)::bigint, count(*),
           count(*) FILTER (WHERE b.cached = 0), sum(b.tokens), sum(b.cached), coalesce(sum(b.ttft), 0),
           count(b.ttft)
    FROM warmplane_batch_counts b
    WHERE NOT b.miss
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (scope_id, prefix_id, bucket) DO UPDATE SET
        requests = s.requests + excluded.requests,
        cold_requests = s.cold_requests + excluded.cold_requests,
        prompt_tokens = s.prompt_tokens + excluded.prompt_tokens,
        cached_tokens = s.cached_tokens + excluded.cached_tokens,
        ttft_ms_sum = s.ttft_ms_sum + excluded.ttft_ms_sum,
        ttft_count = s.ttft_count + excluded.ttft_count;

    INSERT INTO replica_stats AS s (replica, bucket, scope_id, requests, cold_requests, prompt_tokens,
                                    cached_tokens, ttft_ms_sum, ttft_count)
    SELECT b.replica, floor(trunc(b.at) / p_bucket_seconds)::bigint, b.scope_id, count(*),
           count(*) FILTER (WHERE b.cached = 0), sum(b.tokens), sum(b.cached), coalesce(sum(b.ttft), 0),
           count(b.ttft)
    FROM warmplane_batch_counts b
    WHERE NOT b.miss
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (replica, bucket, scope_id) DO UPDATE SET
        requests = s.requests + excluded.requests,
        cold_requests = s.cold_requests + excluded.cold_requests,
        prompt_tokens = s.prompt_tokens + excluded.prompt_tokens,
        cached_tokens = s.cached_tokens + excluded.cached_tokens,
        ttft_ms_sum = s.ttft_ms_sum + excluded.ttft_ms_sum,
        ttft_count = s.ttft_count + excluded.ttft_count;

    INSERT INTO miss_stats AS s (scope_id, prefix_id, bucket, misses, missed_tokens)
    SELECT b.scope_id, b.prefix_id, floor(trunc(b.at) / p_bucket_seconds)::bigint, count(*), sum(b.tokens)
    FROM warmplane_batch_counts b
    WHERE b.miss
    GROUP BY 1, 2, 3
    ORDER BY 1, 2, 3
    ON CONFLICT (scope_id, prefix_id, bucket) DO UPDATE SET
        misses = s.misses + excluded.misses, missed_tokens = s.missed_tokens + excluded.missed_tokens;

    INSERT INTO prefix_chains (scope_id, nodes)
    SELECT * FROM unnest(c_chains_scope, c_chains_nodes);

    INSERT INTO prefix_catalog AS c (scope_id, prefix_id, payload, payload_bytes, tokens, first_seen, last_seen)
    SELECT u.scope, u.prefix, u.payload::jsonb, octet_length(u.payload), u.tokens, u.seen, u.seen
    FROM unnest(c_scope, c_prefix, c_payload, c_tokens, c_seen) AS u(scope, prefix, payload, tokens, seen)
    ORDER BY 1, 2
    ON CONFLICT (scope_id, prefix_id) DO UPDATE SET last_seen = greatest(c.last_seen, excluded.last_seen);
END
$$
"""


def upgrade() -> None:
    for statement in PREFIX_CHAINS:
        op.execute(statement)
    op.execute(CHAIN_NODES)
    op.execute(FROM_PATHS)
    op.execute("DROP VIEW prefix_nodes")
    op.execute("DROP TABLE prefix_paths")
    op.execute(NODES_VIEW)
    op.execute("DROP FUNCTION warmplane_ingest_events")
    op.execute(INGEST_EVENTS)


def downgrade() -> None:
    for statement in PATHS:
        op.execute(statement)
    op.execute("DROP VIEW prefix_nodes")
    op.execute(PATHS_VIEW)
    op.execute("DROP FUNCTION warmplane_ingest_events")
    op.execute(_revision_0009().INGEST_EVENTS)
    op.execute("DROP TABLE prefix_chains")
    op.execute("DROP FUNCTION warmplane_chain_nodes")


def _revision_0009() -> ModuleType:
    """The 0009 module, whose function the downgrade restores (revision files are not a package)."""
    path = Path(__file__).with_name("0009_replica_stats.py")
    spec = importlib.util.spec_from_file_location("warmplane_migration_0009", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
