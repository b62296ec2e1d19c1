"""Every Redis key prefix Warmplane writes, in one place (an operator can scan or flush by prefix).

Redis holds only what can be rebuilt: losing it costs cache hits, never correctness.
"""

from __future__ import annotations

RESULT_ANSWERS = "warmplane:results:v1:"
"""The gateway's cached answers: `RESULT_ANSWERS + hex SHA-256 of (tenant, model, epoch, request key)`,
each with its time to live."""
