"""`make demo`: a rolling update behind ipvsctl on a real IPVS kernel, with and without
draining (see demo/rollout.py and docs/demo.md)."""
