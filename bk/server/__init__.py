"""The bookie server: uvloop listener -> codec -> request processor -> Bookie."""
from .connection import BookieConnection
from .processor import RequestProcessor
from .server import BookieServer, ClusterNotInitializedError

__all__ = ["BookieServer", "BookieConnection", "RequestProcessor", "ClusterNotInitializedError"]
