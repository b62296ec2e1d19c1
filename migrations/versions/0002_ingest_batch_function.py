"""One round trip per batch: the planner's whole batch write as a single function call.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

A batch used to take about ten statements, and each round trip waited for the planner's event loop,
busy decoding the next batch. `warmplane_ingest_batch` takes every delta as arrays and applies them
in the one statement's transaction. It raises SQLSTATE WP001, writing nothing, when a partition's
stored position is not the one the caller expects (another consumer moved it).
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

INGEST_BATCH = r"""
CREATE FUNCTION warmplane_ingest_batch(
    p_group text, p_topics text[], p_parts integer[], p_expected bigint[], p_first bigint[], p_last bigint[],
    p_ids bytea[],
    s_scope integer[], s_prefix bigint[], s_bucket bigint[], s_requests bigint[], s_cold bigint[],
    s_prompt bigint[], s_cached bigint[], s_ttft double precision[], s_ttft_n bigint[],
    m_scope integer[], m_prefix bigint[], m_bucket bigint[], m_misses bigint[], m_tokens bigint[],
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

    INSERT INTO prefix_stats AS s (scope_id, prefix_id, bucket, requests, cold_requests, prompt_tokens,
                                   cached_tokens, ttft_ms_sum, ttft_count)
    SELECT * FROM unnest(s_scope, s_prefix, s_bucket, s_requests, s_cold, s_prompt, s_cached, s_ttft, s_ttft_n)
    ON CONFLICT (scope_id, prefix_id, bucket) DO UPDATE SET
        requests = s.requests + excluded.requests,
        cold_requests = s.cold_requests + excluded.cold_requests,
        prompt_tokens = s.prompt_tokens + excluded.prompt_tokens,
        cached_tokens = s.cached_tokens + excluded.cached_tokens,
        ttft_ms_sum = s.ttft_ms_sum + excluded.ttft_ms_sum,
        ttft_count = s.ttft_count + excluded.ttft_count;

    INSERT INTO miss_stats AS s (scope_id, prefix_id, bucket, misses, missed_tokens)
    SELECT * FROM unnest(m_scope, m_prefix, m_bucket, m_misses, m_tokens)
    ON CONFLICT (scope_id, prefix_id, bucket) DO UPDATE SET
        misses = s.misses + excluded.misses, missed_tokens = s.missed_tokens + excluded.missed_tokens;

    INSERT INTO prefix_paths (scope_id, leaf_id, anchor_id, first_depth, ids, tokens, first_seen)
    SELECT u.scope, u.leaf, u.anchor, u.depth, u.ids::bigint[], u.tokens::integer[], u.seen
    FROM unnest(c_paths_scope, c_paths_leaf, c_paths_anchor, c_paths_depth, c_paths_ids, c_paths_tokens,
                c_paths_seen) AS u(scope, leaf, anchor, depth, ids, tokens, seen)
    ON CONFLICT DO NOTHING;

    INSERT INTO prefix_catalog AS c (scope_id, prefix_id, payload, payload_bytes, tokens, first_seen, last_seen)
    SELECT u.scope, u.prefix, u.payload::jsonb, octet_length(u.payload), u.tokens, u.seen, u.seen
    FROM unnest(c_scope, c_prefix, c_payload, c_tokens, c_seen) AS u(scope, prefix, payload, tokens, seen)
    ON CONFLICT (scope_id, prefix_id) DO UPDATE SET last_seen = greatest(c.last_seen, excluded.last_seen);
END
$$
"""


def upgrade() -> None:
    op.execute(INGEST_BATCH)


def downgrade() -> None:
    op.execute("DROP FUNCTION warmplane_ingest_batch")
