"""A dispatch-mode tracker of live tensor bytes by category, exact to the byte.

Counts each live storage once (views share storage) by its ``nbytes``; works on real and
fake tensors. It does not see allocator rounding/reserve, CUDA context or workspaces,
memory a kernel allocates internally without a tensor, nor tensors never passed to an op.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from tuneplan.adapters.probe.allocator import replay

_LIFT_OPS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)

CATEGORIES = (
    "parameters",
    "quant_state",
    "buffers",
    "inputs",
    "activations",
    "gradients",
    "optimizer",
    "temporaries",
    "other",
)


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a traceable wrapper subclass holds (``__tensor_flatten__``)."""
    names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
    inner = (getattr(t, n) for n in names)
    return [x for x in inner if isinstance(x, torch.Tensor)]


@dataclass(slots=True, eq=False)
class _Record:
    """One storage: its size and (final) category. Mutable: categories are refined later."""

    nbytes: int
    category: str
    ref: Any = None  # the weakref whose callback books the free; kept alive here
    step_alloc: bool = False  # allocated during an optimizer step (state or temporary)


@dataclass(slots=True)
class TrackerResult:
    """Peak of live bytes, its breakdown and phase, and each category's own maximum."""

    peak_bytes: int
    peak_by_category: dict[str, int]
    max_by_category: dict[str, int]
    peak_phase: str
    events: int
    peak_by_phase: dict[str, int] = field(default_factory=dict)
    #: the CUDA caching allocator's reserved peak for these storages, replayed in event order
    #: (``allocator.replay``: segments, block rounding, best-fit splits and merges)
    allocator_reserved_bytes: int = 0


class StorageTracker(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Books every storage an op creates (or first touches) and its death, in event order.

    Categories are assigned at allocation from the phase (forward → activations; backward →
    temporaries, or activations when grad mode is on, i.e. checkpoint recomputation;
    optimizer → optimizer) and refined later (gradients on accumulation, optimizer-step
    temporaries once the step is over). The peak breakdown is computed at the end by
    replaying the event log with the final categories.
    """

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let ``torch.compile`` trace while the tracker is on: it is switched off while dynamo
        and aot_autograd trace (their fake tensors are not booked) and on again while the
        compiled graphs run, whose aten ops it books like any other."""
        return True

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._records: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._events: list[tuple[_Record, int, str]] = []
        self._phase = "setup"
        self._total = 0
        self._peak = 0
        self._peak_index = -1
        self._window_peak = 0
        self._paused = False

    # -- registration ---------------------------------------------------------------
    def _storage_of(self, t: torch.Tensor) -> torch.UntypedStorage | None:
        if t.layout != torch.strided or t.is_nested:
            return None
        try:
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None

    def _lookup(self, st: torch.UntypedStorage) -> _Record | None:
        rec: _Record | None = self._records.get(st)  # type: ignore[no-untyped-call]
        return rec

    def register(self, t: torch.Tensor, category: str, *, retag: bool = False) -> None:
        """Book ``t``'s storage under ``category`` (or re-label it when ``retag``). A wrapper
        subclass (DTensor: FSDP2's sharded parameters, gradients and optimizer state) owns no
        memory of its own: its inner tensors (the local shard) are booked instead."""
        if is_traceable_wrapper_subclass(t):
            for inner in _inner_tensors(t):
                self.register(inner, category, retag=retag)
            return
        st = self._storage_of(t)
        if st is None:
            return
        rec = self._lookup(st)
        if rec is not None:
            if retag:
                rec.category = category
            return
        rec = _Record(nbytes=int(st.nbytes()), category=category)
        rec.ref = weakref.ref(st, self._freed_callback(rec))
        self._records[st] = rec
        self._book(rec, rec.nbytes)

    def register_all(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        for t in tensors:
            self.register(t, category, retag=True)

    def _freed_callback(self, rec: _Record) -> Any:
        def freed(_: Any) -> None:
            self._book(rec, -rec.nbytes)

        return freed

    def _book(self, rec: _Record, delta: int) -> None:
        if delta == 0:
            return
        self._events.append((rec, delta, self._phase))
        self._total += delta
        if self._total > self._peak:
            self._peak = self._total
            self._peak_index = len(self._events) - 1
        if self._total > self._window_peak:
            self._window_peak = self._total

    # -- phases -----------------------------------------------------------------------
    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = previous

    def storage_resized(self, st: torch.UntypedStorage) -> None:
        """``st`` was resized in place outside any op (FSDP frees and re-allocates unsharded
        parameters with ``storage.resize_``): book the change, or the storage if new."""
        rec = self._lookup(st)
        nbytes = int(st.nbytes())
        if rec is None:
            if nbytes and not self._paused:
                rec = _Record(nbytes=nbytes, category=self._category_now())
                rec.ref = weakref.ref(st, self._freed_callback(rec))
                self._records[st] = rec
                self._book(rec, nbytes)
            return
        if nbytes != rec.nbytes:
            self._book(rec, nbytes - rec.nbytes)
            rec.nbytes = nbytes

    def mark_gradient(self, t: torch.Tensor) -> None:
        self.register(t, "gradients", retag=True)

    def finish_optimizer_step(self, state_tensors: Iterable[torch.Tensor]) -> None:
        """Everything the step allocated that is not optimizer state was a temporary."""
        keep = set()
        for t in state_tensors:
            st = self._storage_of(t)
            rec = None if st is None else self._lookup(st)
            if rec is not None:
                rec.category = "optimizer"
                keep.add(id(rec))
        for rec, delta, _ in self._events:
            if delta > 0 and rec.step_alloc and id(rec) not in keep:
                rec.category = "temporaries"
                rec.step_alloc = False

    # -- dispatch ---------------------------------------------------------------------
    def _category_now(self) -> str:
        if self._phase == "forward":
            return "activations"
        if self._phase == "backward":
            # Non-reentrant checkpointing recomputes the forward with grad mode on.
            return "activations" if torch.is_grad_enabled() else "temporaries"
        if self._phase == "optimizer":
            return "optimizer"
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        category = self._category_now()
        # torch.tensor(...) allocates outside the dispatcher and shows up first as the input
        # of lift_fresh: it belongs to the current phase. Any other tensor first seen as an
        # input existed before tracking began: book it as "other".
        lifting = func in _LIFT_OPS
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                if lifting:
                    self._register_output(t, category)
                else:
                    self.register(t, "other")
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._register_output(t, category)
        return out

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Book nothing new inside (a CPU collective backend's own scratch tensors, which the
        GPU backend does not allocate); frees of tensors already booked still count."""
        previous, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = previous

    def _register_output(self, t: torch.Tensor, category: str) -> None:
        if is_traceable_wrapper_subclass(t):
            for inner in _inner_tensors(t):
                self._register_output(inner, category)
            return
        st = self._storage_of(t)
        if st is None:
            return
        rec = self._lookup(st)
        if rec is None:
            self.register(t, category)
            if self._phase == "optimizer":
                self._records[st].step_alloc = True
            return
        nbytes = int(st.nbytes())
        if nbytes != rec.nbytes:  # resized in place (resize_, out= variants)
            self._book(rec, nbytes - rec.nbytes)
            rec.nbytes = nbytes

    # -- result -----------------------------------------------------------------------
    def result(self) -> TrackerResult:
        """Replay the event log with final categories: breakdown at the peak, per-category max."""
        current = dict.fromkeys(CATEGORIES, 0)
        maxima = dict.fromkeys(CATEGORIES, 0)
        at_peak = dict.fromkeys(CATEGORIES, 0)
        peak_phase = "setup"
        by_phase: dict[str, int] = {}
        total = 0
        for i, (rec, delta, phase) in enumerate(self._events):
            cat = rec.category if rec.category in current else "other"
            current[cat] += delta
            total += delta
            if current[cat] > maxima[cat]:
                maxima[cat] = current[cat]
            if total > by_phase.get(phase, 0):
                by_phase[phase] = total
            if i == self._peak_index:
                at_peak = dict(current)
                peak_phase = phase
        return TrackerResult(
            peak_bytes=self._peak,
            peak_by_category=at_peak,
            max_by_category=maxima,
            peak_phase=peak_phase,
            events=len(self._events),
            peak_by_phase=by_phase,
            allocator_reserved_bytes=replay(self.allocation_events()).reserved_peak_bytes,
        )

    def allocation_events(self) -> list[tuple[int, int]]:
        """``(storage key, its size from then on)`` in event order, 0 when it dies: what a
        CUDA caching allocator would have been asked (``allocator.replay``)."""
        sizes: dict[int, int] = {}
        out = []
        for rec, delta, _ in self._events:
            key = id(rec)  # records live as long as the log: keys are never reused
            sizes[key] = sizes.get(key, 0) + delta
            out.append((key, sizes[key]))
        return out

    @property
    def live_bytes(self) -> int:
        return self._total

    def take_window_peak(self) -> int:
        """The peak since the previous call (e.g. one step's own peak), then restart."""
        peak, self._window_peak = self._window_peak, self._total
        return peak
