"""The pyzmq transport behind ``DistributedContext``'s collectives.

Owns one process's star of sockets (``_transport``), the chief's and a worker's ends of it (``_chief``,
``_worker``), the message layout they share (``_common``) and how endpoints are named and checked
(``_addresses``: ipc paths, TCP ports, the job key).

Besides pyzmq, nothing else of ``core`` (the store, the channel and the contexts sit above it), nor any
framework.

May import: errors
"""
