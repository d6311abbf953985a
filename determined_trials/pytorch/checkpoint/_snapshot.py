"""Host memory for a PyTorchTrial's background checkpoints: one set of buffers shaped like the
checkpoint's tensors, allocated on a helper thread before the first checkpoint and reused by every
snapshot; on CUDA pinned, and filled by non-blocking device-to-host copies on a side stream, so the
training thread only queues the copies and the writer waits for them."""

from __future__ import annotations

import concurrent.futures
import copy as _copy
import logging
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["HostBuffers", "copy_to_host", "host_copy", "tree_nbytes", "wait_copied"]

logger = logging.getLogger("determined_trials.pytorch")

_SIDE_STREAMS: dict[int, Any] = {}  # CUDA device index -> the stream snapshots copy on (made once)


@dataclass(frozen=True)
class _Spec:
    """What one host buffer must be: the shape and dtype of a checkpoint tensor; pinned for a CUDA one."""

    shape: torch.Size
    dtype: torch.dtype
    pinned: bool


class HostBuffers:
    """The host buffers background checkpoints copy into: prepared once off the training thread, then
    the latest snapshot's tensors (at most one snapshot is in flight, so one set is enough).

    Holds one host copy of the checkpoint's tensors from ``prepare`` until ``release``; pinned blocks
    come from PyTorch's pinned-memory allocator, which rounds each up to a power of two (at most twice
    the bytes)."""

    def __init__(self) -> None:
        self._tree: Any = None
        self._pending: concurrent.futures.Future[Any] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pinned = False

    @property
    def prepared(self) -> bool:
        """Whether buffers exist or are being allocated."""
        return self._tree is not None or self._pending is not None

    @property
    def pinned(self) -> bool:
        """Whether the prepared buffers are pinned memory (the state lives on a GPU)."""
        return self._pinned

    def prepare(self, template: Any, device: torch.device) -> None:
        """Start allocating (and touching) a host buffer for every tensor of ``template`` on a helper
        thread; ``template``'s structure is read here, on the calling thread, and nothing else.
        ``device``: the trial's (the helper thread makes it current, so it touches no other GPU)."""
        spec = _spec_tree(template)
        self._pinned = any(s.pinned for s in _leaves(spec))
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="det-snapshot-buffers")
        self._pending = self._executor.submit(_allocate_for, spec, device)

    def take(self) -> Any:
        """The buffers to copy the next snapshot into (waits for a preparation still running)."""
        if self._pending is not None:
            self._tree = self._pending.result()
            self._pending = None
            self._shutdown()
        return self._tree

    def keep(self, tree: Any) -> None:
        """``tree`` (a snapshot just taken) holds the buffers now: the next snapshot reuses them."""
        self._tree = tree

    def nbytes(self) -> int:
        """Bytes of the tensors held (0 before ``prepare`` and after ``release``)."""
        return tree_nbytes(self.take())

    def release(self) -> None:
        """Drop every buffer (and PyTorch's cache of pinned blocks, when any was pinned)."""
        self.take()
        self._tree = None
        if self._pinned:
            _empty_pinned_cache()
        self._pinned = False

    def _shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def copy_to_host(state: Any, reuse: Any, device: torch.device) -> tuple[Any, Any]:
    """(a host copy of ``state``, the CUDA event the writer waits for before reading it, or None).

    On CUDA the copies run on a side stream that first waits for the work queued so far (the state at
    this step); the training stream then waits for the copies before its next kernel may change a
    tensor. Neither wait holds the host: the training thread only queues the copies."""
    if device.type != "cuda":
        return host_copy(state, reuse), None
    main = torch.cuda.current_stream(device)
    side = _side_stream(device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        copied = host_copy(state, reuse, async_device=device)
    ready = side.record_event()
    main.wait_stream(side)
    return copied, ready


def wait_copied(ready: Any) -> None:
    """On the writer thread: block until the copies ``copy_to_host`` queued are in host memory."""
    if ready is not None:
        ready.synchronize()


def host_copy(value: Any, reuse: Any = None, async_device: torch.device | None = None) -> Any:
    """A copy of ``value`` sharing no tensor storage or container with it; tensors land in host memory.

    ``reuse``: an earlier copy no longer in use; its tensors of the same shape, dtype and place in the
    structure are overwritten instead of allocating new ones. ``async_device``: tensors on this CUDA
    device copy into pinned buffers without waiting (the caller makes the copies' stream current and
    waits for them); every other tensor is copied before this returns.
    """
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value.detach(), reuse, async_device)
    if isinstance(value, dict):
        copied = _copy.copy(value)  # keeps the type and attributes (a state_dict's ``_metadata``)
        old = reuse if isinstance(reuse, dict) else {}
        for key, item in value.items():
            copied[key] = host_copy(item, old.get(key), async_device)
        return copied
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        old_items = list(reuse) if isinstance(reuse, (list, tuple)) and len(reuse) == len(value) else []
        items = [host_copy(item, old_items[i] if old_items else None, async_device) for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    return _copy.deepcopy(value)


def _copy_tensor(source: torch.Tensor, reuse: Any, async_device: torch.device | None) -> torch.Tensor:
    if source.layout != torch.strided:  # sparse and other layouts: no buffer reuse
        return source.to("cpu", copy=True)
    if not (isinstance(reuse, torch.Tensor) and reuse.shape == source.shape and reuse.dtype == source.dtype
            and reuse.device.type == "cpu" and reuse.layout == torch.strided):
        reuse = torch.empty(source.shape, dtype=source.dtype, pin_memory=source.is_cuda)
    queued = async_device is not None and source.device == async_device and reuse.is_pinned()
    return reuse.copy_(source, non_blocking=queued)


def tree_nbytes(tree: Any) -> int:
    """Bytes of every tensor in a nested structure of dicts, lists and tuples."""
    return sum(t.numel() * t.element_size() for t in _tensors(tree))


def _empty_pinned_cache() -> None:
    """Give PyTorch's cached, unused pinned blocks back to the system (the public call where it exists)."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def _side_stream(device: torch.device) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def _spec_tree(value: Any) -> Any:
    """``value``'s structure with a ``_Spec`` for each strided tensor and None for everything else."""
    if isinstance(value, torch.Tensor):
        return _Spec(value.shape, value.dtype, value.is_cuda) if value.layout == torch.strided else None
    if isinstance(value, dict):
        return {key: _spec_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return [_spec_tree(item) for item in value]
    return None


def _allocate_for(spec: Any, device: torch.device) -> Any:
    """``_allocate`` with ``device`` current when it is a GPU."""
    if device.type != "cuda":
        return _allocate(spec)
    with torch.cuda.device(device):
        return _allocate(spec)


def _allocate(spec: Any) -> Any:
    """On the helper thread: a buffer for every ``_Spec`` of ``spec`` (same structure), its pages touched
    (a pageable buffer is zeroed; pinning touches every page) so the first copy into it does not fault."""
    if isinstance(spec, _Spec):
        if spec.pinned:
            try:
                return torch.empty(spec.shape, dtype=spec.dtype, pin_memory=True)
            except RuntimeError as err:  # e.g. the locked-memory limit: copies then wait, but still work
                logger.warning("could not pin %s bytes of host memory for checkpoints (%s); using pageable memory",
                               spec.shape.numel() * spec.dtype.itemsize, err)
        return torch.zeros(spec.shape, dtype=spec.dtype)
    if isinstance(spec, dict):
        return {key: _allocate(item) for key, item in spec.items()}
    if isinstance(spec, list):
        return [_allocate(item) for item in spec]
    return None


def _leaves(spec: Any) -> list[_Spec]:
    if isinstance(spec, _Spec):
        return [spec]
    items = spec.values() if isinstance(spec, dict) else spec if isinstance(spec, list) else ()
    return [leaf for item in items for leaf in _leaves(item)]


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return [tensor for item in items for tensor in _tensors(item)]
