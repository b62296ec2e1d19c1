"""The query API: read model and admin actions over HTTP (OpenAPI), metrics, the status page."""
