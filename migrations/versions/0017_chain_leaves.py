"""Chat leaves counted in the row that stores them: a request whose leaf its batch adds is no `prefix_stats` row.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07

On chat traffic nearly every request ends at a leaf no earlier request reached, so `prefix_stats` took a
row per request, each an `ON CONFLICT` insert into the table and its key's B-tree: about half of
Postgres's CPU for a chat batch (`python -m bench.batch_write_bench`; figures in bench/RESULTS.md). Now a
request whose leaf is a node its own batch adds (the planner flags it: `added` in the staged rows) is kept
in two cheap places instead:

- its leaf and bucket go into `prefix_chains.leaves` of the row that stores that leaf (16 bytes a request:
  big-endian int8 prefix id, int8 bucket, interleaved), written by the batch's one function call;
- its traffic sums go straight into `scope_traffic` (per scope and bucket), where the sweep moves
  `prefix_stats` rows past the detail retention: a request's sums are in exactly one of the two, as before.

Requests at leaves stored before their batch (repeated leaves: the fleet shape) are summed into
`prefix_stats` as before. A leaf's request count is then its `prefix_stats` rows plus its entries in
`prefix_chains.leaves`: the `prefix_requests` view adds them for SQL (`warmplane_chain_leaves` unpacks a
row's entries); a plan's read and the API's chain tree add them in Python, from the chain rows they stream
anyway. Leaf entries leave with their rows (swept by age, past the detail cut); their sums stay in
`scope_traffic`. Per-leaf token and TTFT sums are no longer kept for such requests: nothing read them per
leaf (the API sums them per scope).

Nothing is carried over on the upgrade (`leaves` starts empty). The downgrade puts every leaf entry back
into `prefix_stats` (as requests only) and takes as many requests out of `scope_traffic`, so every total
stays exact, and restores 0016's function.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

LEAVES = (
    "ALTER TABLE prefix_chains ADD COLUMN leaves bytea NOT NULL DEFAULT ''::bytea",
    "ALTER TABLE prefix_chains ALTER COLUMN leaves SET STORAGE EXTERNAL",
    """
    COMMENT ON COLUMN prefix_chains.leaves IS
        'a request a leaf this row adds was counted at: its prefix id and bucket, big-endian int8 each'
    """,
    """
    COMMENT ON TABLE scope_traffic IS
        'request sums per scope and bucket: prefix_stats rows past the detail retention (moved by the sweep),'
        ' and the requests counted in prefix_chains.leaves (at their write)'
    """,
)
"""One statement each: a migration runs them one at a time."""

CHAIN_LEAVES = r"""
CREATE FUNCTION warmplane_chain_leaves(packed bytea)
RETURNS TABLE (prefix_id bigint, bucket bigint)
LANGUAGE sql IMMUTABLE STRICT AS $$
SELECT ('x' || encode(substring(packed FROM 16 * i + 1 FOR 8), 'hex'))::bit(64)::bigint,
       ('x' || encode(substring(packed FROM 16 * i + 9 FOR 8), 'hex'))::bit(64)::bigint
FROM generate_series(0, length(packed) / 16 - 1) AS i
$$
"""

REQUESTS_VIEW = """
CREATE VIEW prefix_requests AS
SELECT scope_id, prefix_id, bucket, sum(requests)::bigint AS requests
FROM (
    SELECT scope_id, prefix_id, bucket, requests FROM prefix_stats
    UNION ALL
    SELECT c.scope_id, l.prefix_id, l.bucket, 1 FROM prefix_chains c, warmplane_chain_leaves(c.leaves) AS l
) r
GROUP BY scope_id, prefix_id, bucket
"""
"""Requests per leaf and bucket, wherever they were counted (for SQL; slow over many chain rows)."""

BACK_TO_STATS = """
INSERT INTO prefix_stats AS s (scope_id, prefix_id, bucket, requests)
SELECT c.scope_id, l.prefix_id, l.bucket, count(*)
FROM prefix_chains c, warmplane_chain_leaves(c.leaves) AS l
GROUP BY 1, 2, 3
ON CONFLICT (scope_id, prefix_id, bucket) DO UPDATE SET requests = s.requests + excluded.requests
"""
OUT_OF_TRAFFIC = """
UPDATE scope_traffic t SET requests = t.requests - l.n
FROM (
    SELECT c.scope_id, l.bucket, count(*) AS n
    FROM prefix_chains c, warmplane_chain_leaves(c.leaves) AS l
    GROUP BY 1, 2
) l
WHERE t.scope_id = l.scope_id AND t.bucket = l.bucket
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
    -- Requests whose leaf was stored before this batch: summed per leaf and bucket.
    INSERT INTO prefix_stats AS s (scope_id, prefix_id, bucket, requests, cold_requests, prompt_tokens,
                                   cached_tokens, ttft_ms_sum, ttft_count)
    SELECT b.scope_id, b.prefix_id, floor(trunc(b.at) / p_bucket_seconds)::bigint, count(*),
           count(*) FILTER (WHERE b.cached = 0), sum(b.tokens), sum(b.cached), coalesce(sum(b.ttft), 0),
           count(b.ttft)
    FROM warmplane_batch_counts b
    WHERE NOT b.miss AND NOT b.added
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

    -- Requests whose leaf this batch adds: their sums per scope and bucket, their leaves in the row that
    -- adds the nodes (a row holds them even without nodes, so no count is ever dropped).
    INSERT INTO scope_traffic AS t (scope_id, bucket, requests, cold_requests, prompt_tokens, cached_tokens,
                                    ttft_ms_sum, ttft_count)
    SELECT b.scope_id, floor(trunc(b.at) / p_bucket_seconds)::bigint, count(*),
           count(*) FILTER (WHERE b.cached = 0), sum(b.tokens), sum(b.cached), coalesce(sum(b.ttft), 0),
           count(b.ttft)
    FROM warmplane_batch_counts b
    WHERE b.added
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (scope_id, bucket) DO UPDATE SET
        requests = t.requests + excluded.requests,
        cold_requests = t.cold_requests + excluded.cold_requests,
        prompt_tokens = t.prompt_tokens + excluded.prompt_tokens,
        cached_tokens = t.cached_tokens + excluded.cached_tokens,
        ttft_ms_sum = t.ttft_ms_sum + excluded.ttft_ms_sum,
        ttft_count = t.ttft_count + excluded.ttft_count;

    INSERT INTO prefix_chains (scope_id, nodes, leaves)
    SELECT coalesce(u.scope, l.scope_id), coalesce(u.nodes, ''::bytea), coalesce(l.leaves, ''::bytea)
    FROM unnest(c_chains_scope, c_chains_nodes) AS u(scope, nodes)
    FULL JOIN (
        SELECT b.scope_id,
               string_agg(int8send(b.prefix_id) || int8send(floor(trunc(b.at) / p_bucket_seconds)::bigint),
                          ''::bytea) AS leaves
        FROM warmplane_batch_counts b
        WHERE b.added
        GROUP BY 1
    ) l ON l.scope_id = u.scope;

    INSERT INTO prefix_catalog AS c (scope_id, prefix_id, payload, payload_bytes, tokens, first_seen, last_seen)
    SELECT u.scope, u.prefix, u.payload::jsonb, octet_length(u.payload), u.tokens, u.seen, u.seen
    FROM unnest(c_scope, c_prefix, c_payload, c_tokens, c_seen) AS u(scope, prefix, payload, tokens, seen)
    ORDER BY 1, 2
    ON CONFLICT (scope_id, prefix_id) DO UPDATE SET last_seen = greatest(c.last_seen, excluded.last_seen);
END
$$
"""


def upgrade() -> None:
    for statement in LEAVES:
        op.execute(statement)
    op.execute(CHAIN_LEAVES)
    op.execute(REQUESTS_VIEW)
    op.execute("DROP FUNCTION warmplane_ingest_events")
    op.execute(INGEST_EVENTS)


def downgrade() -> None:
    op.execute(BACK_TO_STATS)
    op.execute(OUT_OF_TRAFFIC)
    op.execute("DROP VIEW prefix_requests")
    op.execute("DROP FUNCTION warmplane_chain_leaves")
    op.execute("DROP FUNCTION warmplane_ingest_events")
    op.execute(_revision_0016().INGEST_EVENTS)
    op.execute("ALTER TABLE prefix_chains DROP COLUMN leaves")
    op.execute(
        "COMMENT ON TABLE scope_traffic IS"
        " 'prefix_stats summed per scope, for buckets past the detail retention (moved by the sweep)'"
    )


def _revision_0016() -> ModuleType:
    """The 0016 module, whose function the downgrade restores (revision files are not a package)."""
    path = Path(__file__).with_name("0016_prefix_chains.py")
    spec = importlib.util.spec_from_file_location("warmplane_migration_0016", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
