"""The pyzmq transport behind ``DistributedContext``'s collectives.

Owns one process's star of sockets (``_transport``), the chief's and a worker's ends of it (``_chief``,
``_worker``), the message layout they share (``_common``) and how endpoints are named and checked
(``_addresses``: ipc paths, TCP ports, the job key).

Besides pyzmq, nothing else of ``core`` (the store, the channel and the contexts sit above it), nor any
framework.

May import: errors
"""

from determined_trials.core.transport._addresses import WRAP_RANK_PARENT_ENV, WRAP_RANK_PID_ENV
from determined_trials.core.transport._common import Layout
from determined_trials.core.transport._transport import End, Transport

__all__ = [
    "End",
    "Layout",
    "Transport",
    "WRAP_RANK_PARENT_ENV",
    "WRAP_RANK_PID_ENV",
]
