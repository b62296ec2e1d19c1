"""The API's pure parts: tokens and what each may see, windows, coverage, previews, CLI tables."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from warmplane.services.api import figures
from warmplane.services.api.auth import Forbidden, Principal, TokenBook, Unauthenticated
from warmplane.services.api.settings import ApiCaller, ApiSettings
from warmplane.services.cli.replica_text import REPLICA_COLUMNS, replica_row, residency_line
from warmplane.services.cli.tables import render
from warmplane.shared.settings import SettingsError, load_settings

ADMIN = ApiCaller(name="ci", token=SecretStr("admin-token-0123456789"), role="admin")
ACME = ApiCaller(name="acme", token=SecretStr("acme-token-0123456789"), role="tenant", tenant="acme")


def test_a_token_is_found_by_its_bearer_header_and_anything_else_is_refused() -> None:
    book = TokenBook([ADMIN, ACME])
    assert book.authenticate("Bearer acme-token-0123456789") == Principal("acme", "tenant", "acme")
    assert book.authenticate("bearer  admin-token-0123456789 ").is_admin
    for header, reason in [
        (None, "missing Authorization header"),
        ("", "missing Authorization header"),
        ("Basic YWRtaW46eA==", "must be 'Bearer <token>'"),
        ("Bearer ", "must be 'Bearer <token>'"),
        ("Bearer acme-token-0123456780", "unknown token"),
    ]:
        with pytest.raises(Unauthenticated, match=reason):
            book.authenticate(header)


def test_a_tenant_principal_reads_only_its_tenant_and_no_fleet_view_or_action() -> None:
    acme = Principal("acme", "tenant", "acme")
    assert acme.tenant_scope(None) == "acme" and acme.tenant_scope("acme") == "acme"
    with pytest.raises(Forbidden) as refused:
        acme.tenant_scope("globex")
    assert "globex" not in str(refused.value)
    assert acme.may_see_payloads("acme") and not acme.may_see_payloads("globex")
    with pytest.raises(Forbidden):
        acme.require_fleet()
    with pytest.raises(Forbidden):
        acme.require_admin()


def test_readers_see_every_tenant_but_no_payloads_and_admins_see_all() -> None:
    reader, admin = Principal("grafana", "reader"), Principal("ci", "admin")
    assert reader.tenant_scope("globex") == "globex" and reader.tenant_scope(None) is None
    assert not reader.may_see_payloads("acme") and admin.may_see_payloads("acme")
    reader.require_fleet()
    admin.require_admin()
    with pytest.raises(Forbidden):
        reader.require_admin()


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ('[{"name": "a", "token": "short", "role": "admin"}]', "at least 16 characters"),
        ('[{"name": "a", "token": "0123456789abcdefg", "role": "tenant"}]', "`tenant` is required"),
        (
            '[{"name": "a", "token": "0123456789abcdefg", "role": "admin", "tenant": "x"}]',
            "`tenant` is required",
        ),
        (
            '[{"name": "a", "token": "0123456789abcdefg", "role": "admin"},'
            ' {"name": "b", "token": "0123456789abcdefg", "role": "reader"}]',
            "share a token",
        ),
    ],
)
def test_bad_token_settings_fail_at_start_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tokens: str, message: str
) -> None:
    monkeypatch.setenv("WARMPLANE_API_CALLERS", tokens)
    with pytest.raises(SettingsError, match="WARMPLANE_API_CALLERS") as failed:
        load_settings(ApiSettings)
    assert message in str(failed.value) and "0123456789abcdefg" not in str(failed.value)


def test_a_window_covers_whole_buckets_back_from_now() -> None:
    window = figures.window(now_s=10_000, window_s=3_600, step_s=600, bucket_seconds=60)
    assert (window.since_bucket, window.step_buckets) == ((10_000 - 3_600) // 60, 10)
    assert figures.window(10_000, 3_600, None, 60).step_buckets == 60
    assert figures.window(10_000, 3_600, 1, 60).step_buckets == 1
    # The first bucket starts at or before the window's start, never after it.
    assert window.start_s == 6_360 <= 10_000 - 3_600 < window.start_s + 60


def test_coverage_counts_requests_whose_chain_passes_a_warm_prefix() -> None:
    parents: dict[int, int | None] = {1: None, 2: 1, 3: 2, 4: 1, 9: None, 10: 9}
    leaves = {3: 5, 4: 2, 10: 7, 1: 1}
    assert figures.coverage([2], parents, leaves) == (5, 15)
    assert figures.coverage([1], parents, leaves) == (8, 15)
    assert figures.coverage([], parents, leaves) == (0, 15)
    assert figures.coverage([3, 10], parents, {}) == (0, 0)


@given(st.dictionaries(st.integers(0, 30), st.integers(0, 29), max_size=30), st.sets(st.integers(0, 30)))
def test_coverage_agrees_with_walking_each_chain(raw: dict[int, int], warm: set[int]) -> None:
    parents: dict[int, int | None] = {
        node: (parent if parent < node else None) for node, parent in raw.items()
    }
    leaves = {node: node + 1 for node in parents}

    def through(node: int | None) -> bool:
        while node is not None:
            if node in warm:
                return True
            node = parents.get(node)
        return False

    expected = sum(count for leaf, count in leaves.items() if through(leaf))
    assert figures.coverage(warm, parents, leaves) == (expected, sum(leaves.values()))


def test_previews_render_chat_text_and_tokens_and_are_cut() -> None:
    chat = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    assert figures.preview(chat) == "system: be brief\nuser: hi"
    assert figures.preview({"prompt": "x" * 500}, chars=10) == "x" * 9 + "…"
    assert figures.preview({"prompt": [1, 2, 3]}) == "tokens [1, 2, 3]"
    assert figures.preview(None) == ""
    assert figures.ratio(1, 0) is None and figures.ratio(1, 4) == 0.25


def test_tables_align_numbers_right_and_show_missing_values() -> None:
    rows: list[dict[str, object]] = [
        {"replica": "r-1", "items": 12, "ratio": 0.5},
        {"replica": "replica-22", "items": None, "ratio": 1.0},
    ]
    assert render(rows, ("replica", "items", "ratio")).splitlines() == [
        "REPLICA     ITEMS  RATIO",
        "r-1            12  0.500",
        "replica-22      -  1.000",
    ]
    assert render([], ("replica",)) == "(none)"


def test_the_replicas_table_shows_each_replicas_requests_and_hit_rate_from_the_api_answer() -> None:
    answer: list[dict[str, Any]] = [
        {"replica": "r-1", "state": "ready", "latest_plan": None,
         "hits": {"requests": 9, "prefix_hit_ratio": 600 / 1509}},
        {"replica": "r-2", "state": "starting", "latest_plan": {"state": "issued", "items": 3},
         "hits": {"requests": 0, "prefix_hit_ratio": None}},
    ]  # fmt: skip
    rows = [replica_row(replica) for replica in answer]
    assert render(rows, ("replica", "plan", "items", "requests", "hit_rate")).splitlines() == [
        "REPLICA  PLAN    ITEMS  REQUESTS  HIT_RATE",
        "r-1      -           -         9     0.398",
        "r-2      issued      3         0         -",
    ]
    assert set(REPLICA_COLUMNS) >= {"requests", "hit_rate"}


def test_a_replicas_residency_reads_as_one_line_of_counts_and_namespaces() -> None:
    residency: dict[str, Any] = {
        "held": 6, "lost": 2, "complete": False, "reported_at": "2026-11-30T06:00:00Z",
        "by_tenant": [
            {"tenant": "acme", "prompt_rev": "v1", "epoch": 2, "prefixes": 3},
            {"tenant": "", "prompt_rev": "", "epoch": 0, "prefixes": 3},
        ],
    }  # fmt: skip
    assert residency_line(residency) == (
        "residency (reported 2026-11-30T06:00:00Z): 6 held, 2 lost, incomplete: more may be held;"
        " acme/v1@2: 3, -@0: 3"
    )
    # A tenant-scoped answer has no `lost`; a complete report of nothing held says just that.
    assert residency_line({**residency, "held": 0, "lost": None, "complete": True, "by_tenant": []}) == (
        "residency (reported 2026-11-30T06:00:00Z): 0 held"
    )
