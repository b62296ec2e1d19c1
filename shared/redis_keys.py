"""Every Redis key prefix Warmplane writes, in one place (an operator can scan or flush by prefix).

Redis holds only what can be rebuilt: losing it costs cache hits, never correctness.
"""

from __future__ import annotations

RESULT_ANSWERS = "warmplane:results:v3:"
"""The gateway's cached answers: `RESULT_ANSWERS + namespace digest + ":" + hex SHA-256 of (tenant, model,
epoch, request key)`, each with its time to live, in the form of `services/gateway/answer_record.py` (v2
keys had no namespace part, so a bumped epoch's answers could not be found to purge; v1 held bare
answers)."""

RESULT_LEASES = "warmplane:results:lease:v1:"
"""Single-flight leases across gateway pods: `RESULT_LEASES + the answer key's hex digest`, naming the
holding request, with the flight's deadline as time to live."""

RESULT_HOT = "warmplane:results:hot:v1:"
"""The result cache's record of asked-for answers: `RESULT_HOT + namespace digest + ":" + hour`, a sorted
set of answer keys by asks in that hour, kept 25 hours (`services/gateway/result_warming.py`)."""
RESULT_HOT_SPACES = "warmplane:results:hot:v1:spaces"
"""The namespaces the record holds: namespace digest -> JSON [tenant, model, epoch]."""
