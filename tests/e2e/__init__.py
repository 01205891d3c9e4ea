"""The whole program applied to a local cluster (tools/harness/cluster.py) in the engine's order.

engine.py runs __main__.py and keeps state; providers.py routes each resource type to the
stand-in for its provider plugin; workloads.py runs what the stack deploys (its scheduler, its
gate) as local processes on the pods' addresses; the test_*.py files are the scenarios.
"""
