"""The whole program applied by the real Pulumi engine to a local cluster, then workloads.

The support lives in tools/harness (it also serves `make demo` and bench/): stack.py starts the
cluster and drives `pulumi up`/`preview`/`refresh`/`destroy` of one stack (pulumi_engine.py),
charts.py makes the local charts the Helm releases install, workloads.py runs what the stack
deploys (its scheduler, its gate) as local processes on the pods' addresses. The test_*.py
files here are the scenarios.
"""
