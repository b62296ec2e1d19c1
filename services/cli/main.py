"""`warmplane`: the command line.

warmplane up [--trace FILE] [--limit N] [--keep-running] [--credentials FILE]   the main job on
                                          embedded defaults (no settings needed): the whole product, a
                                          real small model, a scale-up and its proof; SIGINT or SIGTERM
                                          stops all it started, exit 130 or 143
warmplane migrate                         migrate WARMPLANE_POSTGRES__URL to the newest schema
warmplane planner                         run the planner from WARMPLANE_* settings
warmplane warmer                          run one node's warmer from WARMPLANE_* settings
warmplane gateway                         run the OpenAI-compatible gateway from WARMPLANE_* settings
warmplane api                             run the query API from WARMPLANE_* settings
warmplane replay TRACE --tenant T --model M   publish a recorded trace as request events
warmplane evaluate-traffic --tenant T --model M [--since 2h]   what warming would buy on recorded traffic
warmplane calibrate-cache [PAIRS] [--target-precision 0.95]   the result cache's semantic threshold, chosen
                                          on labelled prompt pairs (default: the shipped set)

Over the API (WARMPLANE_API_URL, WARMPLANE_CLI_TOKEN; `--json` for scripts):
warmplane replicas | replica R | plans | epochs | misses | traffic | warm-sets --model M
warmplane bump-epoch --tenant T --model M | deploy started|finished --model M
warmplane scale --model M --to N [--from N]
warmplane wait-ready R                    wait for replica R to turn ready, showing its warm-up
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from warmplane.services.cli import api_commands
from warmplane.services.cli.api_client import ApiClient, ApiClientSettings
from warmplane.shared.settings import DatabaseSettings, WarmplaneSettings, load_settings

# The main job and the services import their own dependencies (alembic, faststream, the embedded
# parts) only when they run: the API commands start in a fraction of the time.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warmplane", description="Warm-up control plane for vLLM fleets.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run the main job on embedded defaults and print a summary")
    up.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="a Mooncake JSONL trace to replay (default: the conversation trace)",
    )
    up.add_argument(
        "--limit",
        type=int,
        default=None,
        help="learn from the trace's first N requests (default 10,000); the next ones are the proof's",
    )
    up.add_argument(
        "--workdir", type=Path, default=None, help="keep the parts' data here (default: a temp dir)"
    )
    up.add_argument(
        "--keep-running",
        action="store_true",
        help="keep everything running until Ctrl-C or SIGTERM (exit code 130 or 143: 128 + the signal)",
    )
    up.add_argument(
        "--credentials",
        type=Path,
        default=None,
        help="a JSON file pinning any of admin_token, api_key, tenant_secret, event_key (default: generated)",
    )
    up.add_argument("--verbose", action="store_true", help="log what the services do")
    commands.add_parser("migrate", help="migrate WARMPLANE_POSTGRES__URL to the newest schema")
    commands.add_parser("planner", help="run the planner from WARMPLANE_* settings")
    commands.add_parser("warmer", help="run one node's warmer from WARMPLANE_* settings")
    commands.add_parser("gateway", help="run the OpenAI-compatible gateway from WARMPLANE_* settings")
    commands.add_parser("api", help="run the query API from WARMPLANE_* settings")
    replay = commands.add_parser(
        "replay", help="publish a recorded trace (Mooncake JSONL) as request events to WARMPLANE_KAFKA__*"
    )
    replay.add_argument("trace", type=Path)
    replay.add_argument("--tenant", required=True)
    replay.add_argument("--model", required=True, help="the served model name the events carry")
    replay.add_argument("--revision", default="", help="the model's weights revision")
    replay.add_argument("--limit", type=int, default=None, help="only the first N requests")
    replay.add_argument("--block-tokens", type=int, default=512, help="tokens per hash id (512: Mooncake)")
    _add_evaluate_traffic(commands)
    _add_calibrate_cache(commands)
    api_commands.add_commands(commands)
    args = parser.parse_args(argv)

    runners: dict[str, Callable[[argparse.Namespace], int]] = {
        "up": _up,
        "replay": _replay,
        "calibrate-cache": _calibrate_cache,
    }
    if args.command in runners:
        return runners[args.command](args)
    if args.command == "migrate":
        from warmplane.shared import migrate  # noqa: PLC0415 - see the imports above

        settings = load_settings(DatabaseSettings)
        migrate.upgrade(settings.postgres.sqlalchemy_url())
        print("database is at the newest schema")
        return 0
    if args.command == "evaluate-traffic":
        return _evaluate_traffic(args, argv if argv is not None else sys.argv[1:])
    if args.command in api_commands.HANDLERS:
        client = ApiClient(load_settings(ApiClientSettings))
        try:
            return api_commands.run(client, args, sys.stdout)
        finally:
            client.close()
    # A service is imported only when it is the one run: each pulls in its own dependencies.
    service = importlib.import_module(f"warmplane.services.{args.command}.__main__")
    service.main()
    return 0


def _replay(args: argparse.Namespace) -> int:
    from warmplane.services.cli.replay import ReplayOptions, replay  # noqa: PLC0415 - see above
    from warmplane.shared.events import ModelRef  # noqa: PLC0415

    kafka = load_settings(WarmplaneSettings).kafka
    model = ModelRef(args.model, args.revision)
    options = ReplayOptions(args.trace, args.tenant, model, args.limit, args.block_tokens)
    try:
        return asyncio.run(replay(options, kafka, sys.stdout))
    except FileNotFoundError as exc:
        print(f"warmplane replay: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _add_evaluate_traffic(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    text = "what warming would buy on recorded request events (WARMPLANE_KAFKA__*), as Markdown"
    p = commands.add_parser("evaluate-traffic", help=text, description=text)
    p.add_argument("--tenant", required=True)
    p.add_argument("--model", required=True, help="the served model name the events carry")
    p.add_argument("--revision", default=None, help="only this weights revision (default: any)")
    p.add_argument("--since", help="ISO 8601 time with offset, or a duration back from now: 90s, 30m, 2h, 7d")
    p.add_argument("--until", help="as --since; default: the end of the topic")
    p.add_argument("--block-tokens", type=int, default=16, help="tokens per block (vLLM's default: 16)")
    p.add_argument(
        "--partial-blocks",
        choices=("drop", "keep"),
        default="drop",
        help="a request's trailing tokens short of a block: drop (vLLM caches full blocks only) or keep"
        " as a partial block (Mooncake's convention)",
    )
    p.add_argument("--replicas", type=int, default=4, help="simulated replicas before one joins")
    p.add_argument("--capacity-blocks", type=int, help="a replica's KV capacity (default: 4,096,000 tokens)")
    p.add_argument("--join-at", type=float, default=0.5, help="when the replica joins, share of the span")
    p.add_argument("--output", type=Path, help="also write the report here")
    p.add_argument("--trace-output", type=Path, help="write the exported Mooncake JSONL trace here")
    p.add_argument("--deadline-s", type=float, default=300.0, help="give up reading the topic after this")


def _evaluate_traffic(args: argparse.Namespace, argv: list[str]) -> int:
    import shlex  # noqa: PLC0415 - see the imports above
    from datetime import UTC, datetime  # noqa: PLC0415

    from warmplane.services.cli import evaluate_traffic as et  # noqa: PLC0415
    from warmplane.services.planner.trace_eval.own_trace import TrafficFilter  # noqa: PLC0415
    from warmplane.services.planner.trace_eval.params import EvalParams  # noqa: PLC0415

    now = datetime.now(UTC)
    try:
        since = et.parse_time(args.since, now) if args.since else None
        until = et.parse_time(args.until, now) if args.until else None
        if args.block_tokens <= 0:
            raise ValueError("--block-tokens must be positive")
        capacity = args.capacity_blocks or et.DEFAULT_CAPACITY_TOKENS // args.block_tokens
        params = EvalParams(args.block_tokens, args.replicas, capacity, join_at=args.join_at)
    except ValueError as exc:
        print(f"warmplane evaluate-traffic: {exc}", file=sys.stderr)
        return 2
    options = et.TrafficOptions(
        TrafficFilter(args.tenant, args.model, args.revision, since, until),
        params,
        args.partial_blocks,
        args.output,
        args.trace_output,
        args.deadline_s,
        shlex.join(["warmplane", *argv]),
    )
    try:
        return asyncio.run(et.evaluate_traffic(options, load_settings(WarmplaneSettings).kafka, sys.stdout))
    except (LookupError, TimeoutError) as exc:
        print(f"warmplane evaluate-traffic: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _add_calibrate_cache(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    text = (
        "choose the result cache's semantic similarity threshold on labelled prompt pairs, embedded with"
        " the gateway's embedder (WARMPLANE_RESULT_CACHE__EMBEDDER)"
    )
    p = commands.add_parser("calibrate-cache", help=text, description=text)
    p.add_argument(
        "pairs",
        nargs="?",
        type=Path,
        help='JSON Lines of {"a": ..., "b": ..., "same": true|false, "kind": ...} (default: the shipped set)',
    )
    p.add_argument(
        "--target-precision",
        type=float,
        default=0.95,
        help="least share of semantic hits that must share an answer (default 0.95)",
    )


def _calibrate_cache(args: argparse.Namespace) -> int:
    from warmplane.services.cli.calibrate_cache import calibrate_cache  # noqa: PLC0415 - see above
    from warmplane.services.gateway.labelled_pairs import shipped_pairs_path  # noqa: PLC0415
    from warmplane.services.gateway.settings import GatewaySettings  # noqa: PLC0415

    settings = load_settings(GatewaySettings).result_cache
    path = args.pairs if args.pairs is not None else shipped_pairs_path()
    try:
        return asyncio.run(calibrate_cache(path, args.target_precision, settings, sys.stdout))
    except (OSError, ValueError) as exc:  # a missing or malformed file, a bad target, a missing model
        print(f"warmplane calibrate-cache: {exc}", file=sys.stderr)
        return 2


def _up(args: argparse.Namespace) -> int:
    from warmplane.services.cli.stop_signals import exit_code, run_until_signalled  # noqa: PLC0415
    from warmplane.services.devstack.job import (  # noqa: PLC0415 - see above
        DEFAULT_TRACE,
        TraceTooShort,
        UpOptions,
        run_up,
    )
    from warmplane.services.devstack.product import Credentials, InvalidCredentials  # noqa: PLC0415

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request (the warmer's health checks)
    if not args.verbose:
        for name in ("faststream", "faststream.access.kafka"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # aiokafka logs a fetch the busy embedded broker did not answer in time at ERROR, and then
        # retries it; --verbose shows those.
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        credentials = Credentials.read(args.credentials) if args.credentials else None
    except InvalidCredentials as exc:
        print(f"warmplane up: {exc}", file=sys.stderr)
        return 2
    options = UpOptions(
        args.trace or DEFAULT_TRACE, args.limit, args.workdir, args.keep_running, credentials=credentials
    )
    try:
        received = asyncio.run(run_until_signalled(run_up(options, sys.stdout), sys.stdout))
    except (FileNotFoundError, TraceTooShort) as exc:
        print(f"warmplane up: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside the job's own handlers (before or after it ran)
        return 130
    return 0 if received is None else exit_code(received)


if __name__ == "__main__":
    sys.exit(main())
