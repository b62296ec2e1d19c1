"""The event contract as documents a producer in any language can follow (issue 17): a JSON Schema of every
event, an AsyncAPI description of the topics with their keys and headers, test vectors of prefix ids, and
test vectors of the routing ring (which replica a prefix id goes to).

They are generated from the code that defines the contract (`events`, `topics`, `prefix_chain`,
`hash_ring`), never written by hand, and committed under `docs/contract/`:
`python -m warmplane.shared.contract docs/contract` writes them, and a test keeps the committed files equal
to what the code generates and checks every golden payload against the schema.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from warmplane.shared.contract_vectors import prefix_vectors, ring_vectors
from warmplane.shared.events import EVENT_TYPES, SCHEMA_VERSION, AnyEvent, Event
from warmplane.shared.topics import SIGNATURE_HEADER, DeadLetterHeaders, Topics, key_rule

SCHEMA_FILE: Final = "events.schema.json"
ASYNCAPI_FILE: Final = "asyncapi.json"
VECTORS_FILE: Final = "prefix-ids.json"
RING_FILE: Final = "ring-owners.json"
_SCHEMA_ID: Final = "https://warmplane.dev/contract/v1/events.schema.json"
_PREFIX: Final = Topics().prefix

_CHANNELS: Final = {
    "requests": "Every answered request: what the planner counts. Sent by gateways and by emitters in "
    "serving stacks.",
    "misses": "Prefixes a request had to compute. Sent by gateways and by emitters in serving stacks.",
    "lifecycle": "Replica lifecycle (warmers), deploys, scaling, epochs and re-warm requests (the API, "
    "deploy tooling, autoscalers, the planner). Consumers accept only signed records when event keys are "
    "set.",
    "heartbeats": "Each warmer's word, every heartbeat interval, that its replicas live; read by planners "
    "only (a replica whose heartbeats stop is announced lost on the lifecycle topic), kept an hour. Signed "
    "when event keys are set.",
    "plans": "Warm plans, from the planner to each node's warmer. Signed when event keys are set.",
    "warm-results": "Warm progress, outcomes and residency, from the warmers.",
}
"""Channel (the topic's name after the prefix) → what flows on it; which events do is `Topics`' to say."""
_SIGNED: Final = frozenset({"lifecycle", "heartbeats", "plans"})


def event_schema() -> dict[str, Any]:
    """A JSON Schema (2020-12) of one event: any of the event types, told apart by `type`."""
    schema = msgspec.json.schema(AnyEvent)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": _SCHEMA_ID,
        "title": "Warmplane event",
        "description": _ENVELOPE,
        **schema,
    }


def asyncapi() -> dict[str, Any]:
    """An AsyncAPI 3.0 document: a channel per topic, a message per event type, Kafka keys and headers."""
    definitions = msgspec.json.schema_components([AnyEvent], ref_template="#/components/schemas/{name}")[1]
    messages: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    named = Topics("{prefix}")
    for channel, says in _CHANNELS.items():
        carried = sorted(
            tag for tag, cls in EVENT_TYPES.items() if named.for_family(cls.FAMILY) == f"{{prefix}}.{channel}"
        )
        for tag in carried:
            messages[tag] = _message(tag, EVENT_TYPES[tag], signed=channel in _SIGNED)
        channels[channel] = _channel(
            channel, says, {tag: {"$ref": f"#/components/messages/{tag}"} for tag in carried}
        )
        operations[f"send-{channel}"] = {
            "action": "send",
            "channel": {"$ref": f"#/channels/{channel}"},
            "messages": [{"$ref": f"#/channels/{channel}/messages/{tag}"} for tag in carried],
        }
    messages["dead-letter"] = _dead_letter()
    channels["dead-letter"] = _channel(
        "dead-letter",
        "Records a consumer could not take (malformed, refused, unsigned), with why and where from.",
        {"dead-letter": {"$ref": "#/components/messages/dead-letter"}},
    )
    return {
        "asyncapi": "3.0.0",
        "info": {"title": "Warmplane events", "version": str(SCHEMA_VERSION), "description": _ENVELOPE},
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": definitions},
    }


def documents() -> dict[str, str]:
    """Each file's name and text, as committed."""
    texts = {
        SCHEMA_FILE: event_schema(),
        ASYNCAPI_FILE: asyncapi(),
        VECTORS_FILE: prefix_vectors(),
        RING_FILE: ring_vectors(),
    }
    return {name: json.dumps(value, indent=2, ensure_ascii=False) + "\n" for name, value in texts.items()}


_ENVELOPE: Final = (
    "Every event is a JSON object whose `type` names what happened and whose `schema_version` says which "
    f"shape of that type it is (now {SCHEMA_VERSION}). Within a version changes are additive only: new "
    "optional fields, never a removed or retyped one; readers ignore fields they do not know. `event_id` "
    "(a UUID) is every consumer's idempotency key; prefix ids are signed 64-bit integers (prefix-ids.json)."
)


def _channel(name: str, says: str, messages: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "address": f"{{prefix}}.{name}",
        "description": says,
        "parameters": {"prefix": {"default": _PREFIX, "description": "WARMPLANE_KAFKA__TOPIC_PREFIX"}},
        "messages": dict(messages),
    }


def _message(tag: str, cls: type[Event], *, signed: bool) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": tag,
        "title": cls.__name__,
        "summary": (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
        "contentType": "application/json",
        "payload": {"$ref": f"#/components/schemas/{cls.__name__}"},
        "bindings": {
            "kafka": {
                "key": {"type": "string", "description": key_rule(cls).says},
                "bindingVersion": "0.5.0",
            }
        },
    }
    if signed:
        message["headers"] = {
            "type": "object",
            "properties": {
                SIGNATURE_HEADER: {
                    "type": "string",
                    "pattern": "^hmac-sha256=[A-Za-z0-9+/]+=*$",
                    "description": "HMAC-SHA256 of the record's value under a shared event key, base64 "
                    "(WARMPLANE_EVENT_KEYS); required when keys are set",
                }
            },
        }
    return message


def _dead_letter() -> dict[str, Any]:
    headers = {
        DeadLetterHeaders.REASON: "why the consumer refused the record",
        DeadLetterHeaders.SOURCE_TOPIC: "the topic it came from",
        DeadLetterHeaders.SOURCE_PARTITION: "its partition",
        DeadLetterHeaders.SOURCE_OFFSET: "its offset",
        DeadLetterHeaders.CONSUMER: "the consumer that refused it",
    }
    return {
        "name": "dead-letter",
        "title": "A refused record",
        "summary": "The original record's bytes, untouched, with headers saying why and where from.",
        "contentType": "application/octet-stream",
        "payload": {"type": "string", "contentEncoding": "binary"},
        "headers": {
            "type": "object",
            "properties": {name: {"type": "string", "description": says} for name, says in headers.items()},
            "required": [DeadLetterHeaders.REASON, DeadLetterHeaders.SOURCE_TOPIC],
        },
    }


def main(argv: Sequence[str] = tuple(sys.argv[1:])) -> int:
    """Write the documents into the folder `argv[0]`."""
    if len(argv) != 1:
        print("usage: python -m warmplane.shared.contract FOLDER", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in documents().items():
        (folder / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
