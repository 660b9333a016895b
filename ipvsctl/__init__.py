"""ipvsctl: a per-node Kubernetes service proxy on Linux IPVS with graceful termination."""

# `make dist` (release/dist.sh) writes both from git, the tag and the commit, into the copy
# it builds the wheel, the sdist and the image from; a checkout keeps these.
__version__ = "0.2.0"
__commit__ = ""
