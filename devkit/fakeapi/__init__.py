"""A real local HTTP server that speaks the Kubernetes API wire protocol (list, paginated
list, chunked watch streams, GET), with controls to inject the failures a node proxy must
survive, and builders for the objects it serves. Used by the unit tests, the daemon's
end-to-end tests, `make demo` and `make bench`.
"""

from devkit.fakeapi import objects
from devkit.fakeapi.server import FakeAPIServer
from devkit.fakeapi.state import RESOURCES, RequestRecord, ResourceInfo

__all__ = ["RESOURCES", "FakeAPIServer", "RequestRecord", "ResourceInfo", "objects"]
