"""The gateway: an OpenAI-compatible front for a pool of vLLM replicas (design brief, sections 6 to 8).

It authenticates a request's API key to a tenant, injects the tenant's `cache_salt`, routes the request
by the root of its prefix chain on a bounded-load hash ring over the ready replicas, passes the answer
through untouched (SSE framing included), and reports what the engine did (`request.observed`,
`prefix.missed`) through the emitter, never waiting on the broker.
"""
