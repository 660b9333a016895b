"""Development kit shared by the tests, `make demo` and `make bench` (never shipped: the
wheel holds `ipvsctl` only). Everything here imports `ipvsctl` and the standard library,
never tests/, bench/ or demo/, so those three import downward only:

- fakeapi: a real HTTP server speaking the Kubernetes API wire protocol, with fault controls
- labkit: network namespaces, nodes, pods and the daemon under test on the lab VM's kernel
- harness, builders: an Engine on the in-memory kernel, and Kubernetes object builders
- ipvsnl: a lean hand-packed IPVS netlink client (benchmarks' baseline and priming)
- fakenetlink: the one netlink fake: the kernel's side of NetlinkKernel's sockets, modelled
"""
