"""`warmplane` commands over the query API: tables for people, `--json` for scripts, a progress bar
while waiting for a replica to turn ready. Exit codes: 0 done, 1 the API refused or the replica failed,
2 a wait timed out."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any, TextIO

from warmplane.services.cli.api_client import ApiClient, ApiError
from warmplane.services.cli.progress import Progress
from warmplane.services.cli.replica_text import REPLICA_COLUMNS, replica_row, residency_line
from warmplane.services.cli.tables import render
from warmplane.shared.events import LIVE_REPLICA_STATES

Handler = Callable[[ApiClient, argparse.Namespace, TextIO], int]
HANDLERS: dict[str, Handler] = {}


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the API's commands to the `warmplane` parser."""
    _add_reads(commands)
    _add_actions(commands)


def _command(commands: argparse._SubParsersAction, name: str, text: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=text, description=text + " (WARMPLANE_API_URL, WARMPLANE_CLI_TOKEN)"
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    return parser


def _add_reads(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(commands, "replicas", "list replicas with their state, warm progress and hit rate")
    p.add_argument("--model")
    p.add_argument("--state")
    _add_hit_window(p)
    p = _command(commands, "replica", "one replica, its hit rate and its transitions")
    p.add_argument("replica")
    _add_hit_window(p)
    p = _command(commands, "plans", "list warm plans and their outcomes, newest first")
    p.add_argument("--replica")
    p.add_argument("--model")
    p.add_argument("--state")
    p.add_argument("--limit", type=int, default=50)
    p = _command(commands, "epochs", "current cache epochs per tenant and model")
    p.add_argument("--tenant")
    p.add_argument("--model")
    p = _command(commands, "misses", "the prefixes that missed most")
    p.add_argument("--model")
    p.add_argument("--tenant")
    p.add_argument("--window-s", type=int)
    p.add_argument("--limit", type=int, default=20)
    p = _command(commands, "traffic", "prefix hit ratio and cold starts over time")
    p.add_argument("--model")
    p.add_argument("--tenant")
    p.add_argument("--window-s", type=int)
    p.add_argument("--step-s", type=int)
    p = _command(commands, "warm-sets", "what a model's live replicas hold, and the traffic it covers")
    p.add_argument("--model", required=True)
    p.add_argument("--tenant")
    p.add_argument("--window-s", type=int)
    p = _command(commands, "wait-ready", "wait until a replica is ready, showing its warm-up")
    p.add_argument("replica")
    p.add_argument("--timeout-s", type=float, default=600.0)
    p.add_argument("--poll-s", type=float, default=1.0)


def _add_hit_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="count only this tenant's requests in the hit rate")
    parser.add_argument("--window-s", type=int, help="the hit rate's window (the API's default if unset)")


def _add_actions(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _command(commands, "bump-epoch", "move (tenant, model) to a new cache epoch and re-warm it (admin)")
    p.add_argument("--tenant", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--reason", default="")
    p = _command(commands, "rewarm", "warm a replica again in full, even what it is believed to hold (admin)")
    p.add_argument("replica")
    p.add_argument("--reason", default="")
    p = _command(commands, "deploy", "announce that a rollout started or finished (admin; for CI/CD)")
    p.add_argument("phase", choices=["started", "finished"])
    p.add_argument("--model", required=True)
    p.add_argument("--tenant", default="")
    p.add_argument("--revision", default="", help="the weights revision rolled out")
    p.add_argument("--prompt-rev", action="append", default=[], help="a prompt revision (repeatable)")
    p = _command(commands, "scale", "announce a change of a model's replica count (admin; for autoscalers)")
    p.add_argument("--model", required=True)
    p.add_argument("--tenant", default="")
    p.add_argument("--revision", default="")
    p.add_argument(
        "--from", dest="from_replicas", type=int, help="the count before (default: its live replicas now)"
    )
    p.add_argument("--to", dest="to_replicas", type=int, required=True)


def run(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    """Run the API command `args.command`; print what the API answered, or why not."""
    try:
        return HANDLERS[args.command](client, args, out)
    except ApiError as exc:
        print(f"warmplane {args.command}: {exc}", file=out)
        return 1


def _handles(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        HANDLERS[name] = handler
        return handler

    return register


def _show(
    out: TextIO, args: argparse.Namespace, answer: Any, rows: list[dict[str, Any]], columns: tuple[str, ...]
) -> int:
    print(json.dumps(answer, indent=2) if args.json else render(rows, columns), file=out)
    return 0


def _acted(out: TextIO, args: argparse.Namespace, answer: dict[str, Any], done: str) -> int:
    """An action's answer: its JSON, or `done` and the event that carries it."""
    if args.json:
        return _show(out, args, answer, [], ())
    print(f"{done} (event {answer['event_id']})", file=out)
    return 0


@_handles("replicas")
def _replicas(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get(
        "/v1/replicas", model=args.model, state=args.state, tenant=args.tenant, window_s=args.window_s
    )
    return _show(out, args, answer, [replica_row(r) for r in answer], REPLICA_COLUMNS)


@_handles("replica")
def _replica(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get(f"/v1/replicas/{args.replica}", tenant=args.tenant, window_s=args.window_s)
    if args.json:
        return _show(out, args, answer, [], ())
    print(render([replica_row(answer)], REPLICA_COLUMNS), file=out)
    if answer.get("residency"):
        print(residency_line(answer["residency"]), file=out)
    print("\n" + render(answer["transitions"], ("occurred_at", "state", "reason")), file=out)
    return 0


@_handles("plans")
def _plans(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get(
        "/v1/plans", replica=args.replica, model=args.model, state=args.state, limit=args.limit
    )
    columns = ("plan_id", "replica", "state", "epoch", "items", "items_done", "verified_hits", "issued_at")
    _show(out, args, answer, answer, columns)
    if not args.json:  # one line per plan issued empty on purpose, under the table
        for plan in answer:
            if plan.get("empty_reason"):
                print(f"{plan['replica']}: {plan['empty_reason']}", file=out)
    return 0


@_handles("epochs")
def _epochs(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get("/v1/epochs", tenant=args.tenant, model=args.model)
    return _show(out, args, answer, answer, ("tenant", "model", "epoch", "bumped_at", "reason"))


@_handles("bump-epoch")
def _bump(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.post("/v1/epochs/bump", {"reason": args.reason}, tenant=args.tenant, model=args.model)
    if not args.json:
        print(
            f"epoch of {args.tenant}/{args.model} bumped to {answer['epoch']} (event {answer['event_id']})",
            file=out,
        )
        return 0
    return _show(out, args, answer, [], ())


@_handles("misses")
def _misses(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get(
        "/v1/misses/top", model=args.model, tenant=args.tenant, window_s=args.window_s, limit=args.limit
    )
    columns = ("tenant", "model", "prefix_id", "misses", "missed_tokens", "tokens", "preview")
    rows = [{**m, "preview": (m["preview"] or "").replace("\n", " ⏎ ")[:60] or None} for m in answer]
    return _show(out, args, answer, rows, columns)


@_handles("traffic")
def _traffic(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get(
        "/v1/traffic", model=args.model, tenant=args.tenant, window_s=args.window_s, step_s=args.step_s
    )
    columns = (
        "start",
        "tenant",
        "model",
        "requests",
        "cold_requests",
        "prefix_hit_ratio",
        "cold_start_ratio",
    )
    return _show(out, args, answer, answer, columns)


@_handles("warm-sets")
def _warm_sets(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.get("/v1/warm-sets", model=args.model, tenant=args.tenant, window_s=args.window_s)
    columns = ("tenant", "model", "epoch", "prefixes", "tokens", "replicas", "verified_replicas", "coverage")
    return _show(out, args, answer, answer, columns)


@_handles("rewarm")
def _rewarm(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    answer = client.post("/v1/rewarms", {"replica": args.replica, "reason": args.reason})
    return _acted(out, args, answer, f"re-warm of {args.replica} requested")


@_handles("deploy")
def _deploy(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    body = {
        "phase": args.phase,
        "tenant": args.tenant,
        "model": args.model,
        "revision": args.revision,
        "prompt_revs": args.prompt_rev,
    }
    answer = client.post("/v1/deploys", body)
    return _acted(out, args, answer, f"deploy.{args.phase} of {args.model} published")


@_handles("scale")
def _scale(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.from_replicas is None:
        replicas = client.get("/v1/replicas", model=args.model)
        args.from_replicas = sum(1 for r in replicas if r["state"] in LIVE_REPLICA_STATES)
    body = {
        "tenant": args.tenant,
        "model": args.model,
        "revision": args.revision,
        "from_replicas": args.from_replicas,
        "to_replicas": args.to_replicas,
    }
    answer = client.post("/v1/fleet/scale", body)
    return _acted(
        out,
        args,
        answer,
        f"fleet.scaled of {args.model} {args.from_replicas} -> {args.to_replicas} published",
    )


@_handles("wait-ready")
def _wait_ready(client: ApiClient, args: argparse.Namespace, out: TextIO) -> int:
    deadline = time.monotonic() + args.timeout_s
    progress: Progress | None = None
    while True:
        replica = client.get(f"/v1/replicas/{args.replica}")
        plan = replica.get("latest_plan") or {}
        if plan.get("items"):
            progress = progress or Progress(out, total=plan["items"], label=f"{args.replica} warming")
            done = plan.get("items_done") or 0
            progress.show(done, done, final=replica["state"] in ("ready", "failed"))
        if replica["state"] == "ready":
            print(f"{args.replica} is ready (plan {plan.get('state', 'none')})", file=out)
            return 0
        if replica["state"] in ("failed", "gone"):
            print(f"{args.replica} is {replica['state']}: {replica['reason']}", file=out)
            return 1
        if time.monotonic() > deadline:
            print(f"{args.replica} is still {replica['state']} after {args.timeout_s:.0f} s", file=out)
            return 2
        time.sleep(args.poll_s)
