"""The planner's ingestion state: idempotency keys, scopes, prefix statistics, the catalog, replicas.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Design notes (docs/architecture.md has the whole picture):
- `ingest_offsets` is where each consumer group resumes, per topic partition: it advances in the same
  transaction as the counts (exactly-once effects from at-least-once delivery), and only from where
  the writer believed it stood (a fence against a consumer that lost its partition mid-batch).
- `ingest_ledger` keeps the event ids of each counted batch, one compact row per partition per batch
  (16 bytes an id), so a planner that takes a partition over rebuilds its window of recent ids and
  still skips a producer's retried duplicates.
- `scopes` names (tenant, model, prompt revision) once; every hot table refers to it by a 4-byte id.
  Scopes are never deleted, and the hot tables carry no foreign key to them: a per-row check costs
  more than the row itself at ingestion rates (measured with auto_explain, bench/ingest_bench.py).
- `prefix_stats` counts requests per leaf prefix (a request's deepest chain element) and time bucket;
  `prefix_paths` holds the chains' new ends, one row a request that added prefixes (a chat turn adds a
  dozen at once: a row each measured 15 times slower on the Mooncake trace); the `prefix_nodes` view
  gives one row per prefix with its parent. A prefix's popularity is the sum over its subtree.
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    _execute_each(
        """
        CREATE TABLE ingest_offsets (
            group_id    text    NOT NULL,
            topic       text    NOT NULL,
            partition   integer NOT NULL,
            next_offset bigint  NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (group_id, topic, partition)
        );

        CREATE TABLE ingest_ledger (
            topic        text    NOT NULL,
            partition    integer NOT NULL,
            first_offset bigint  NOT NULL,
            last_offset  bigint  NOT NULL,
            event_ids    bytea   NOT NULL,
            ingested_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (topic, partition, first_offset)
        );
        COMMENT ON COLUMN ingest_ledger.event_ids IS 'the counted event ids, 16 bytes each, in offset order';

        CREATE TABLE scopes (
            scope_id   integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            tenant     text NOT NULL,
            model      text NOT NULL,
            prompt_rev text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (tenant, model, prompt_rev)
        );

        CREATE TABLE prefix_stats (
            scope_id      integer NOT NULL,
            prefix_id     bigint  NOT NULL,
            bucket        bigint  NOT NULL,
            requests      bigint  NOT NULL DEFAULT 0,
            cold_requests bigint  NOT NULL DEFAULT 0,
            prompt_tokens bigint  NOT NULL DEFAULT 0,
            cached_tokens bigint  NOT NULL DEFAULT 0,
            ttft_ms_sum   double precision NOT NULL DEFAULT 0,
            ttft_count    bigint  NOT NULL DEFAULT 0,
            PRIMARY KEY (scope_id, prefix_id, bucket)
        );
        COMMENT ON COLUMN prefix_stats.bucket IS 'occurred_at in Unix seconds divided by the bucket width';

        CREATE TABLE miss_stats (
            scope_id      integer NOT NULL,
            prefix_id     bigint  NOT NULL,
            bucket        bigint  NOT NULL,
            misses        bigint  NOT NULL DEFAULT 0,
            missed_tokens bigint  NOT NULL DEFAULT 0,
            PRIMARY KEY (scope_id, prefix_id, bucket)
        );
        COMMENT ON COLUMN miss_stats.prefix_id IS 'the first chain element that was not resident';

        CREATE TABLE prefix_paths (
            scope_id    integer   NOT NULL,
            leaf_id     bigint    NOT NULL,
            anchor_id   bigint,
            first_depth integer   NOT NULL,
            ids         bigint[]  NOT NULL,
            tokens      integer[] NOT NULL,
            first_seen  timestamptz NOT NULL,
            PRIMARY KEY (scope_id, leaf_id)
        );
        COMMENT ON COLUMN prefix_paths.anchor_id IS 'the parent of ids[1]: a prefix already known, or NULL at the root';

        CREATE VIEW prefix_nodes AS
        SELECT DISTINCT ON (p.scope_id, u.prefix_id)
               p.scope_id, u.prefix_id,
               CASE WHEN u.ord = 1 THEN p.anchor_id ELSE p.ids[u.ord - 1] END AS parent_id,
               p.first_depth + u.ord::integer - 1 AS depth, u.tokens, p.first_seen
        FROM prefix_paths p, unnest(p.ids, p.tokens) WITH ORDINALITY AS u(prefix_id, tokens, ord)
        ORDER BY p.scope_id, u.prefix_id, p.first_seen;

        CREATE TABLE prefix_catalog (
            scope_id      integer NOT NULL,
            prefix_id     bigint  NOT NULL,
            payload       jsonb   NOT NULL,
            payload_bytes integer NOT NULL,
            tokens        integer NOT NULL,
            first_seen    timestamptz NOT NULL,
            last_seen     timestamptz NOT NULL,
            PRIMARY KEY (scope_id, prefix_id)
        );
        CREATE INDEX prefix_catalog_last_seen ON prefix_catalog (last_seen);
        ALTER TABLE ingest_ledger ALTER COLUMN event_ids SET STORAGE EXTERNAL;

        CREATE TABLE replicas (
            replica_id         text PRIMARY KEY,
            node               text NOT NULL,
            model              text NOT NULL,
            model_revision     text NOT NULL,
            endpoint           text NOT NULL,
            state              text NOT NULL CHECK (state IN
                                 ('starting','loading','warming','ready','draining','gone','failed')),
            state_since        timestamptz NOT NULL,
            kv_capacity_tokens bigint,
            reason             text NOT NULL DEFAULT '',
            last_event_id      uuid NOT NULL
        );

        CREATE TABLE replica_transitions (
            event_id    uuid PRIMARY KEY,
            replica_id  text NOT NULL,
            state       text NOT NULL,
            occurred_at timestamptz NOT NULL,
            reason      text NOT NULL DEFAULT ''
        );
        CREATE INDEX replica_transitions_by_replica ON replica_transitions (replica_id, occurred_at);

        CREATE TABLE fleet_changes (
            event_id    uuid PRIMARY KEY,
            type        text NOT NULL,
            tenant      text NOT NULL,
            model       text NOT NULL,
            revision    text NOT NULL,
            occurred_at timestamptz NOT NULL,
            body        jsonb NOT NULL
        );
        CREATE INDEX fleet_changes_by_model ON fleet_changes (model, occurred_at);
        """
    )


def downgrade() -> None:
    _execute_each(
        """
        DROP TABLE fleet_changes;
        DROP TABLE replica_transitions;
        DROP TABLE replicas;
        DROP TABLE prefix_catalog;
        DROP VIEW prefix_nodes;
        DROP TABLE prefix_paths;
        DROP TABLE miss_stats;
        DROP TABLE prefix_stats;
        DROP TABLE scopes;
        DROP TABLE ingest_ledger;
        DROP TABLE ingest_offsets;
        """
    )


def _execute_each(script: str) -> None:
    """Run each statement alone: asyncpg prepares statements, and a prepared one holds one command."""
    for statement in script.split(";\n"):
        if statement.strip():
            op.execute(statement)
