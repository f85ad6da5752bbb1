"""Adapters for the harnesses people run: BenchFlow, Harbor, Inspect AI.

Each module imports its harness only when used; install the harness yourself (the kit pins
none). Each freezes through quiesce before the verifier and raises on anything but
`quiescent`, which the harness records as an error of the rollout, trial or sample: no reward.
"""
