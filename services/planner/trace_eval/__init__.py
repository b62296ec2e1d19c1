"""The trace evaluator: warm-set policies replayed on a recorded trace against simulated replicas.

`fleet_sim` is the simulation (a hash ring, an LRU block cache per replica, a replica joining mid-trace);
`policies` the warm sets compared (no warming, the seed's baselines, peer copy, the planner's own path);
`evaluation` runs them and measures the newcomer; `report` renders the figures as Markdown. No network,
no clock: `bench.evaluate_policy` runs it on Mooncake files, `warmplane evaluate-traffic` on Warmplane's
own recorded request events.
"""
