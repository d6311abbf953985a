"""The store channel: a remote trial's way to the runner's local store (an authenticated pyzmq
request/reply channel), used when trials run away from the runner's machine (Ray).

Owns the runner's server (``_server``: ``StoreChannelServer``, ``ChannelToken``), which serves the methods of
``core.store.TrialStore`` and no other, and the trial's client (``_client``: ``RemoteStore``, which implements
that contract as ``LocalStore`` does; ``open_store``; ``own_store``: a plain script's own ``LocalStore``).

A room of its own, not part of ``core.transport``: its peers (runner and trial, not the ranks of one job),
its lifetime and its authentication differ from the collectives', and it depends on the store while the
collectives must not. Never ``core.transport`` nor any framework.

May import: errors, core.store
"""

from determined_trials.core.channel._client import STORE_CHANNEL_ENV, RemoteStore, open_store, own_store
from determined_trials.core.channel._server import ChannelToken, StoreChannelServer

__all__ = [
    "ChannelToken",
    "RemoteStore",
    "STORE_CHANNEL_ENV",
    "StoreChannelServer",
    "open_store",
    "own_store",
]
