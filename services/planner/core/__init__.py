"""The planner's pure core: no I/O, no clock, no asyncio (an import contract in CI keeps it so).

Everything here is handed what it needs (events, `now`, what is stored) and returns decisions or deltas.
"""
