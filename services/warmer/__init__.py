"""The warmer: pre-fills a replica's prefix cache with the planned warm set before it takes traffic."""
