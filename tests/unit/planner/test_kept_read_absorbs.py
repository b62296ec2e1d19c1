"""A kept read absorbing the batches the planner commits after it (`core.absorbed_counts`,
`WarmSetChooser.counts_committed`): the trie it then holds is the one a read now would build, and the
chooser reads again whenever absorbing cannot stand for a read (another planner counting, a scope the read
did not see, batches let go)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from tests.unit.planner.memory_planner import BUCKET, MODEL, NOW, MemoryPlans, Published
from tests.unit.planner.test_plan_issuer import issuer, live, started, three_tenants
from warmplane.services.planner.core.absorbed_counts import CommittedCounts, absorb
from warmplane.services.planner.core.ingest_batch import IngestBatch, RequestColumns, Scope, fold_events
from warmplane.services.planner.kept_reads import KeptRead, KeptReads
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.services.planner.plans import PlanIssuer
from warmplane.services.planner.policy import LeafCount, PrefixTrie, StoredPrefix, trie_from_counts
from warmplane.services.planner.policy.calibration import PRIOR
from warmplane.services.planner.settings import PlanSettings
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved, WarmPlanIssued
from warmplane.shared.prefix_chain import Namespace, chain_from_segments

BUCKET_S = 60
BASE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SCOPE: Scope = ("acme", "llama", "v1")
SEGMENT_TOKENS = {b"a": 3, b"b": 7, b"c": 16}
TOPIC = ("requests", 0)

paths = st.lists(st.sampled_from(sorted(SEGMENT_TOKENS)), min_size=1, max_size=4)
requests = st.lists(st.tuples(paths, st.integers(0, 900)), min_size=1, max_size=25)


def observed(path: Sequence[bytes], second: int) -> RequestObserved:
    chain = chain_from_segments(Namespace(*SCOPE), path, [SEGMENT_TOKENS[s] for s in path])
    return RequestObserved(
        event_id=uuid.uuid4(),
        occurred_at=BASE + timedelta(seconds=second),
        producer="test",
        tenant=SCOPE[0],
        model=ModelRef(SCOPE[1], "rev"),
        prompt_rev=SCOPE[2],
        replica="r0",
        chain=list(chain.ids),
        chain_tokens=list(chain.tokens),
        prompt_tokens=chain.tokens[-1],
        cached_tokens=0,
        ttft_ms=None,
    )


def stored(events: Sequence[RequestObserved]) -> tuple[list[StoredPrefix], list[LeafCount]]:
    """What Postgres holds after `events`: every chain node, and requests per leaf and bucket."""
    nodes: dict[int, StoredPrefix] = {}
    for event in events:
        parent = None
        for prefix, tokens in zip(event.chain, event.chain_tokens, strict=True):
            nodes.setdefault(prefix, StoredPrefix(prefix, parent, tokens))
            parent = prefix
    buckets = Counter((e.chain[-1], int(e.occurred_at.timestamp()) // BUCKET_S) for e in events)
    counts = [LeafCount(leaf, b * BUCKET_S + BUCKET_S / 2, n) for (leaf, b), n in buckets.items()]
    return list(nodes.values()), counts


def same_trie(a: PrefixTrie, b: PrefixTrie, now: float) -> None:
    assert {n.prefix_id for n in a.nodes()} == {n.prefix_id for n in b.nodes()}
    for node in a.nodes():
        other = b.node(node.prefix_id)
        assert other is not None
        assert (node.parent, node.depth, node.tokens, node.own_tokens) == (
            other.parent,
            other.depth,
            other.tokens,
            other.own_tokens,
        )
        assert math.isclose(a.rate(node.prefix_id, now), b.rate(node.prefix_id, now), rel_tol=1e-9)


@settings(max_examples=150, deadline=None)
@given(before=requests, after=st.lists(requests, min_size=1, max_size=3), now_s=st.integers(0, 1200))
def test_a_trie_that_absorbed_committed_batches_is_the_trie_a_read_now_builds(
    before: list[tuple[list[bytes], int]], after: list[list[tuple[list[bytes], int]]], now_s: int
) -> None:
    """Whatever was read, and however the later requests fell into batches, a kept trie that absorbed
    the batches equals the trie of everything read at `now` (blended, both half-lives)."""
    now = BASE.timestamp() + now_s
    early = [observed(path, second) for path, second in before]
    prefixes, counts = stored(early)
    trie, _ = trie_from_counts(prefixes, counts, now, 60.0, 600.0)
    scope_of = {prefix.prefix_id: 7 for prefix in prefixes}
    renderable: set[int] = set()
    known = {SCOPE: set(scope_of)}
    batches, late = [], []
    for chunk in after:
        events = [observed(path, second) for path, second in chunk]
        batch = fold_events(events, stored_nodes=known)
        known[SCOPE] = known[SCOPE] | set().union(*batch.new_nodes.values())
        batches.append(batch)
        late.extend(events)
    placed = absorb(
        trie,
        scope_of,
        renderable,
        [CommittedCounts.of(batch, BUCKET_S) for batch in batches],
        scope_ids={SCOPE: 7},
        model=SCOPE[1],
        tenant=None,
        bucket_seconds=BUCKET_S,
        now=now,
    )
    assert placed
    fresh, _ = trie_from_counts(*stored([*early, *late]), now, 60.0, 600.0)
    same_trie(trie, fresh, now)
    assert trie.blended is not None and fresh.blended is not None
    same_trie(trie.blended, fresh.blended, now)
    assert set(scope_of) >= {node.prefix_id for node in trie.nodes()}


def test_a_count_in_a_scope_the_read_did_not_see_is_not_placed_and_changes_nothing() -> None:
    early = [observed([b"a", b"b"], 10)]
    trie, _ = trie_from_counts(*stored(early), BASE.timestamp() + 60, 60.0, 600.0)
    before = {n.prefix_id: (n.count, n.stamp) for n in trie.nodes()}
    batch = fold_events([observed([b"a", b"c"], 20)], stored_nodes={})
    placed = absorb(
        trie,
        {},
        set(),
        [CommittedCounts.of(batch, BUCKET_S)],
        scope_ids={("other", SCOPE[1], "v1"): 1},
        model=SCOPE[1],
        tenant=None,
        bucket_seconds=BUCKET_S,
        now=BASE.timestamp() + 60,
    )
    assert not placed
    assert {n.prefix_id: (n.count, n.stamp) for n in trie.nodes()} == before


def hot_six(count: int = 500) -> IngestBatch:
    """A batch of `count` requests ending at tenant-2's root 6 (`three_tenants`), in the current bucket."""
    scope = ("tenant-2", MODEL.name, "v1")
    return IngestBatch(
        requests=RequestColumns(
            scopes=[scope] * count,
            leaves=[6] * count,
            replicas=["x"] * count,
            seconds=[NOW.timestamp()] * count,
            prompt_tokens=[200] * count,
            cached_tokens=[0] * count,
            ttft_ms=[None] * count,
        )
    )


def commit(store: MemoryPlans, batch: IngestBatch, offset: int) -> dict[tuple[str, int], int]:
    """What Postgres holds once `batch` committed up to `offset`; the positions the writer reports."""
    store.counts.append((2, 6, BUCKET, len(batch.requests.leaves)))
    store.positions = {TOPIC: offset}
    return {TOPIC: offset}


def test_a_planner_counting_alone_plans_later_starts_from_its_kept_read_and_its_commits() -> None:
    store = three_tenants()
    store.positions = {TOPIC: 10}
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    run = issuer(store, published, metrics, statistics_max_age_s=0, statistics_live_s=60)
    run.counting_alone(True)
    store.live = [live("a", "starting")]
    first = asyncio.run(run.issue(started("a")))
    assert first is not None and 6 not in {item.prefix_id for item in first.items}
    batch = hot_six()
    run.counts_committed(batch, commit(store, batch, 11))
    store.live = [live("a"), live("b", "starting")]
    second = asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))  # its batch after the read
    assert len(store.asked) == 1  # no read: the kept one absorbed the batch
    reads = {
        how: metrics.registry.get_sample_value("warmplane_planner_statistics_reads_total", {"how": how})
        for how in ("read", "absorbed")
    }
    assert reads == {"read": 1, "absorbed": 1}
    fresh = asyncio.run(issuer(store, Published(), metrics, statistics_max_age_s=0).issue(started("b")))
    assert second is not None and fresh is not None
    assert [i.prefix_id for i in second.items] == [i.prefix_id for i in fresh.items]
    assert 6 in {item.prefix_id for item in second.items}


def test_without_counting_alone_every_start_reads_again() -> None:
    store = three_tenants()
    store.positions = {TOPIC: 10}
    published, metrics = Published(), PlannerMetrics(CollectorRegistry())
    run = issuer(store, published, metrics, statistics_max_age_s=0, statistics_live_s=60)
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    batch = hot_six()
    run.counts_committed(batch, commit(store, batch, 11))
    asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 2
    run.counting_alone(True)
    asyncio.run(run.issue(started("a"), committed_at=time.monotonic()))
    run.counting_alone(False)  # a rebalance: another planner may count now
    asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 4


def test_a_batch_committed_while_the_read_ran_is_counted_once_whether_the_read_saw_it_or_not() -> None:
    """The read's snapshot says which of the batches registered meanwhile it holds (their positions):
    those are not absorbed again; the one it missed is."""
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=0, statistics_live_s=60)
    run.counting_alone(True)
    seen, missed = hot_six(300), hot_six(200)
    store.during_read.append(lambda: run.counts_committed(seen, commit(store, seen, 11)))
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    run.counts_committed(missed, commit(store, missed, 12))  # after the snapshot
    asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 1
    kept = run._chooser._kept.peek((MODEL.name, None))  # the trie is what is asserted
    check = issuer(store, Published(), metrics, statistics_max_age_s=60)  # reads everything committed
    asyncio.run(check.issue(started("b")))
    again = check._chooser._kept.peek((MODEL.name, None))
    now = NOW.timestamp()
    assert kept is not None and again is not None
    assert math.isclose(kept.trie.count(6, now), again.trie.count(6, now), rel_tol=1e-9)
    assert again.trie.count(6, now) > 500


def test_a_batch_in_a_scope_the_read_did_not_see_makes_the_next_start_read() -> None:
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=0, statistics_live_s=60)
    run.counting_alone(True)
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    batch = hot_six(5)
    batch.requests.scopes = [("tenant-9", MODEL.name, "v1")] * 5
    run.counts_committed(batch, {TOPIC: 11})
    asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 2


def test_a_re_plan_takes_an_absorbing_read_which_holds_what_a_read_would() -> None:
    """A fleet re-plan (an alarm, a scale-out) reads because what is known changed; an absorbing read is
    as current as a read, so it takes that."""
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=0, statistics_live_s=60)
    run.counting_alone(True)
    store.live = [live("a", "starting")]
    asyncio.run(run.issue(started("a")))
    batch = hot_six()
    run.counts_committed(batch, commit(store, batch, 11))
    store.live = [live("a")]
    [plan] = asyncio.run(run.plan_live(MODEL.name, new_event_id()))
    assert len(store.asked) == 1
    assert 6 in {item.prefix_id for item in plan.items}


def test_a_batch_committed_while_the_trie_is_built_is_absorbed_by_the_next_start() -> None:
    """The read is done, its trie still being built: a batch committed then is in neither, and the kept
    read must absorb it."""
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=0, statistics_live_s=60)
    run.counting_alone(True)
    late, names = hot_six(400), store.scope_names

    async def committing_meanwhile(scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
        if store.positions == {TOPIC: 10}:  # once, after the counts were read
            run.counts_committed(late, commit(store, late, 11))
        return await names(scope_ids)

    store.scope_names = committing_meanwhile  # type: ignore[method-assign]
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 1
    kept = run._chooser._kept.peek((MODEL.name, None))
    assert kept is not None
    assert kept.trie.count(6, NOW.timestamp()) > 400


def test_committed_counts_are_absorbed_while_planning_is_free_and_the_next_start_finds_them() -> None:
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=0, statistics_live_s=60)
    batch = hot_six()
    assert not run.counts_committed(batch, {TOPIC: 10})  # nothing absorbs yet: nothing held
    run.counting_alone(True)
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    assert run.counts_committed(batch, commit(store, batch, 11))
    asyncio.run(run.absorb_committed())
    kept = run._chooser._kept.peek((MODEL.name, None))
    assert kept is not None and kept.trie.count(6, NOW.timestamp()) > 500
    plan = asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 1
    assert plan is not None and 6 in {item.prefix_id for item in plan.items}
    assert kept.trie.count(6, NOW.timestamp()) < 502  # absorbed once, not again by the start


def test_a_kept_read_grown_past_max_nodes_serves_its_plan_and_the_next_one_reads() -> None:
    """`max_nodes` bounds what a kept read holds: one that outgrows it by absorbing stops absorbing, and
    the next plan reads again (the read takes the most recent leaves within the bound)."""
    store = three_tenants()  # three roots: 8, 5 and 6
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=0, statistics_live_s=60, max_nodes=3)
    run.counting_alone(True)
    store.live = [live("a", "starting"), live("b", "starting"), live("c", "starting")]
    asyncio.run(run.issue(started("a")))
    scope = ("tenant-2", MODEL.name, "v1")
    below_six = RequestObserved(
        event_id=uuid.uuid4(), occurred_at=NOW, producer="test", tenant=scope[0],
        model=ModelRef(scope[1], "r1"), prompt_rev=scope[2], replica="x", chain=[6, 7],
        chain_tokens=[200, 300], prompt_tokens=300,
    )  # fmt: skip
    batch = fold_events([below_six] * 4, stored_nodes={scope: {6}})
    store.prefixes.append((2, 7, 6, 300))
    store.counts.append((2, 7, BUCKET, 4))
    store.positions = {TOPIC: 11}
    assert run.counts_committed(batch, {TOPIC: 11})
    asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    kept = run._chooser._kept.peek((MODEL.name, None))
    assert len(store.asked) == 1, "the grown read served this plan"
    assert kept is not None and len(kept.trie) == 4
    asyncio.run(run.issue(started("c"), committed_at=time.monotonic()))
    assert len(store.asked) == 2, "and no more: the next one read"
    again = run._chooser._kept.peek((MODEL.name, None))
    # Leaves of the latest bucket, most requests first: 8 (nine), then 7 (four) with its root 6; 5's chain
    # no longer fits.
    assert again is not None and {node.prefix_id for node in again.trie.nodes()} == {6, 7, 8}


def test_kept_reads_hold_at_most_max_nodes_together_beside_the_newest() -> None:
    settings = PlanSettings(max_nodes=5, statistics_max_age_s=60)
    reads = KeptReads(settings, bucket_seconds=BUCKET_S, monotonic=time.monotonic)

    def a_read(nodes: int) -> KeptRead:
        trie = PrefixTrie(60.0)
        for prefix in range(nodes):
            trie.observe([prefix], [16], NOW.timestamp())
        return KeptRead(NOW, time.monotonic(), trie, {}, {}, set(), PRIOR)

    for key, nodes in ((("m", None), 2), (("m", "acme"), 3), (("m", "globex"), 6)):
        with reads.reading() as ticket:
            reads.keep(key, a_read(nodes), ticket, None)
        held = [k for k in (("m", None), ("m", "acme"), ("m", "globex")) if reads.peek(k) is not None]
        if key == ("m", "acme"):
            assert held == [("m", None), ("m", "acme")], "five nodes together: both kept"
    assert held == [("m", "globex")], "the newest stays, over the bound alone; the others go"


def absorbing_since_a_start(clock: list[datetime]) -> tuple[MemoryPlans, PlannerMetrics, PlanIssuer]:
    """A planner counting alone whose read for replica a's start at `clock[0]` absorbs; then a batch
    committed (tenant-2's root 6 hot), not yet absorbed. b is starting too."""
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, clock, statistics_max_age_s=0, statistics_live_s=60)
    run.counting_alone(True)
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))
    batch = hot_six()
    run.counts_committed(batch, commit(store, batch, 11))
    return store, metrics, run


async def absorbed_and_refreshed(run: PlanIssuer) -> None:
    """What the planning task's `CountsToAbsorb` does, and then the reads it made again, kept."""
    await run.absorb_committed()
    await run.refreshed()


def test_an_absorbing_read_near_the_end_of_its_life_is_read_again_while_planning_is_free() -> None:
    """A plan after an absorbing read's `statistics_live_s` would read; one refreshed in its last quarter
    (`kept_reads.REFRESH_AFTER`) between plans serves it instead."""
    clock = [NOW]
    store, metrics, run = absorbing_since_a_start(clock)
    clock[0] = NOW + timedelta(seconds=44)  # not yet due: absorbing only
    asyncio.run(absorbed_and_refreshed(run))
    assert len(store.asked) == 1
    batch = hot_six()
    run.counts_committed(batch, commit(store, batch, 12))
    clock[0] = NOW + timedelta(seconds=46)
    asyncio.run(absorbed_and_refreshed(run))
    assert len(store.asked) == 2  # read again, between plans
    clock[0] = NOW + timedelta(seconds=70)  # past the first read's life, within the second's
    plan = asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 2
    assert metrics.registry.get_sample_value("warmplane_planner_statistics_reads_total", {"how": "absorbed"})
    assert plan is not None and 6 in {item.prefix_id for item in plan.items}


def test_a_plan_while_a_read_is_made_again_takes_the_read_it_replaces_without_waiting() -> None:
    """The read made again runs beside the planning task: a start that comes meanwhile is planned from the
    absorbing read still kept, and the new read is kept once that plan is made."""
    clock = [NOW]
    store, metrics, run = absorbing_since_a_start(clock)
    first = run._chooser._kept.peek((MODEL.name, None))
    clock[0] = NOW + timedelta(seconds=50)

    async def start_during_the_read() -> WarmPlanIssued | None:
        names, reading, release = store.scope_names, asyncio.Event(), asyncio.Event()

        async def held(scope_ids: Sequence[int]) -> dict[int, tuple[str, str]]:
            reading.set()
            await release.wait()
            return await names(scope_ids)

        store.scope_names = held  # type: ignore[method-assign]
        await asyncio.wait_for(run.absorb_committed(), 5)  # returns with the read under way
        await reading.wait()
        plan = await asyncio.wait_for(run.issue(started("b"), committed_at=time.monotonic()), 5)
        assert run._chooser._kept.peek((MODEL.name, None)) is first, "not replaced while it serves"
        release.set()
        await run.refreshed()
        return plan

    plan = asyncio.run(start_during_the_read())
    assert plan is not None and 6 in {item.prefix_id for item in plan.items}, "the absorbed batch"
    assert len(store.asked) == 2
    again = run._chooser._kept.peek((MODEL.name, None))
    assert again is not None and again is not first and again.read_at == clock[0]
    reads = {
        how: metrics.registry.get_sample_value("warmplane_planner_statistics_reads_total", {"how": how})
        for how in ("read", "absorbed", "refreshed")
    }
    assert reads == {"read": 1, "absorbed": 1, "refreshed": 1}


def test_a_read_begun_before_the_planner_counted_alone_is_made_again_once_batches_commit() -> None:
    """A planner that just started reads for its first start before its requests consumer is assigned:
    that read cannot absorb. Once the planner counts alone, the first committed batch has it read again,
    once, and the next start takes the new read as it absorbs."""
    store = three_tenants()
    store.positions = {TOPIC: 10}
    metrics = PlannerMetrics(CollectorRegistry())
    run = issuer(store, Published(), metrics, statistics_max_age_s=10, statistics_live_s=60)
    store.live = [live("a", "starting"), live("b", "starting")]
    asyncio.run(run.issue(started("a")))  # kept to be shared, not absorbing
    batch = hot_six()
    assert not run.counts_committed(batch, commit(store, batch, 11)), "not counting alone: nothing to do"
    run.counting_alone(True)
    assert run.counts_committed(batch, commit(store, batch, 12)), "a read to make again"
    asyncio.run(absorbed_and_refreshed(run))
    assert len(store.asked) == 2
    assert run.counts_committed(batch, commit(store, batch, 13)), "held: the new read absorbs"
    asyncio.run(absorbed_and_refreshed(run))
    assert len(store.asked) == 2, "made again once"
    plan = asyncio.run(run.issue(started("b"), committed_at=time.monotonic()))
    assert len(store.asked) == 2
    assert plan is not None and 6 in {item.prefix_id for item in plan.items}


def test_without_absorbing_no_read_is_made_again() -> None:
    store = three_tenants()
    store.positions = {TOPIC: 10}
    run = issuer(store, Published(), PlannerMetrics(CollectorRegistry()), statistics_live_s=0)
    store.live = [live("a", "starting")]
    asyncio.run(run.issue(started("a")))
    run.counting_alone(True)
    batch = hot_six()
    assert not run.counts_committed(batch, commit(store, batch, 11))
    asyncio.run(absorbed_and_refreshed(run))
    assert len(store.asked) == 1
