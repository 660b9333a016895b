"""The stateful core: the engine (source events in, per-Service plans applied to the kernel;
engine.py lists its parts) and the change feed it tells the rest of the daemon on, its
read-only view, the loop that decides when to sync, the background reads of the kernel
(drain check, audit, conntrack sweep, the node drain's count) and their paced runner, the
drain state's writer, and `ipvsctl plan`'s whole-cluster planning (cluster)."""
