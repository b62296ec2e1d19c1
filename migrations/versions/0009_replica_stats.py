"""Hit rates per replica: `replica_stats`, summed by `warmplane_ingest_events` from the same staged rows.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30

The planner's staged rows (its session's `warmplane_batch_counts`) gain `replica`: the replica that
served a request (NULL on a miss). `warmplane_ingest_events` keeps its signature and everything 0006
does, and adds one `GROUP BY` over the staged requests: `replica_stats` counts them per (replica,
scope, bucket), with the same sums as `prefix_stats` (requests, cold ones, prompt and cached tokens,
TTFT), in the same transaction as the offsets and the ledger, so a batch's replica figures commit
exactly once with the rest of it. The key puts `bucket` before `scope_id`: the API reads one replica's
window of buckets for every scope at once. Rows are upserted in key order, like the other counters.

The downgrade drops the table and restores 0006's function, which 0007 and 0008 left alone (a
planner of those revisions copies no `replica` column).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

REPLICA_STATS = """
CREATE TABLE replica_stats (
    replica       text    NOT NULL,
    bucket        bigint  NOT NULL,
    scope_id      integer NOT NULL,
    requests      bigint  NOT NULL DEFAULT 0,
    cold_requests bigint  NOT NULL DEFAULT 0,
    prompt_tokens bigint  NOT NULL DEFAULT 0,
    cached_tokens bigint  NOT NULL DEFAULT 0,
    ttft_ms_sum   double precision NOT NULL DEFAULT 0,
    ttft_count    bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (replica, bucket, scope_id)
)
"""

INGEST_EVENTS = r"""
CREATE FUNCTION warmplane_ingest_events(
    p_group text, p_topics text[], p_parts integer[], p_expected bigint[], p_first bigint[], p_last bigint[],
    p_ids bytea[], p_bucket_seconds integer,
    c_paths_scope integer[], c_paths_leaf bigint[], c_paths_anchor bigint[], c_paths_depth integer[],
    c_paths_ids text[], c_paths_tokens text[], c_paths_seen timestamptz[],
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

    INSERT INTO prefix_paths (scope_id, leaf_id, anchor_id, first_depth, ids, tokens, first_seen)
    SELECT u.scope, u.leaf, u.anchor, u.depth, u.ids::bigint[], u.tokens::integer[], u.seen
    FROM unnest(c_paths_scope, c_paths_leaf, c_paths_anchor, c_paths_depth, c_paths_ids, c_paths_tokens,
                c_paths_seen) AS u(scope, leaf, anchor, depth, ids, tokens, seen)
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;

    INSERT INTO prefix_catalog AS c (scope_id, prefix_id, payload, payload_bytes, tokens, first_seen, last_seen)
    SELECT u.scope, u.prefix, u.payload::jsonb, octet_length(u.payload), u.tokens, u.seen, u.seen
    FROM unnest(c_scope, c_prefix, c_payload, c_tokens, c_seen) AS u(scope, prefix, payload, tokens, seen)
    ORDER BY 1, 2
    ON CONFLICT (scope_id, prefix_id) DO UPDATE SET last_seen = greatest(c.last_seen, excluded.last_seen);
END
$$
"""


def upgrade() -> None:
    op.execute(REPLICA_STATS)
    op.execute(
        "COMMENT ON COLUMN replica_stats.bucket IS 'occurred_at in Unix seconds divided by the bucket width'"
    )
    op.execute("DROP FUNCTION warmplane_ingest_events")
    op.execute(INGEST_EVENTS)


def downgrade() -> None:
    op.execute("DROP FUNCTION warmplane_ingest_events")
    op.execute(_revision_0006().INGEST_EVENTS)
    op.execute("DROP TABLE replica_stats")


def _revision_0006() -> ModuleType:
    """The 0006 module, whose function the downgrade restores (revision files are not a package)."""
    path = Path(__file__).with_name("0006_ingest_event_columns.py")
    spec = importlib.util.spec_from_file_location("warmplane_migration_0006", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
