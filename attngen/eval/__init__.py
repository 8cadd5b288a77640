"""The evaluation layer: what runs generated kernels and judges them.

- `verify/`: run every mask variant over a suite of shapes and compare with an fp32 reference;
- `bench/`: time kernels beside torch SDPA's backends, after the verifier's error rule passed;
- `sweep/`: search a base spec's neighbourhood for the fastest verified variant per shape.

verify/ and bench/ have a room per call convention (`<call>.py`, named by core.calls.CALLS) beside
their shared pieces, which name none; conventions.py gathers the rooms.
Nothing here imports torch before a function runs.
"""
