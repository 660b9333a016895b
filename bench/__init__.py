"""ipvsctl benchmarks (`make bench`, `make bench-smoke`): event to kernel against a
kube-router-style full resync, initial sync, drain reaction, daemon memory and CPU, and the
rollout from `make demo`. Results go to bench/results/*.json; docs/benchmarks.md is rendered
from them by `python -m bench.report`. Benchmarks measure, they never fail a build."""
