"""memsnap's PyTorch attachment: every tensor's allocation history, recorded by memsnap.

``memsnap run -- python train.py`` loads this module by itself (its startup hook attaches once
``torch`` is imported). By hand::

    import torch, memsnap_torch
    memsnap_torch.attach()        # before or after CUDA is initialised

What it does: registers a trace tracker on PyTorch's CUDA caching allocator (the allocator calls
it for each alloc, free, segment map/unmap and OOM, also while its own history recording is off)
and feeds memsnap's recorder, configured as every memsnap source is (MEMSNAP_CONFIG,
MEMSNAP_<KEY>). Batches are counted from NVTX ranges where memsnap's CUPTI library sees them,
from ``memsnap_torch.step()`` calls, and otherwise from optimizer steps
(``torch.optim``'s global step post hook).

Inside a training job this module never raises: anything that goes wrong gives one line on
stderr and the job runs on unrecorded.
"""

import atexit
import ctypes
import os
import sys
import threading
import weakref

__all__ = ["attach", "step", "dump", "recording", "library_path"]

_lock = threading.Lock()
_lib = None
_gil = None  # the same library through ctypes.PyDLL: calls that need the GIL held
_attach_called = False
_warned = set()


def _warn(key, text):
    if key in _warned:
        return
    _warned.add(key)
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("SLURM_PROCID")
    prefix = "memsnap[rank %s]" % rank if rank is not None else "memsnap"
    sys.stderr.write("%s warning: %s\n" % (prefix, text))


def library_path():
    """Where libmemsnap_pytorch.so is looked for: $MEMSNAP_TORCH_LIBRARY, else the lib folder this
    module was installed under (<lib>/memsnap/python/memsnap_torch/)."""
    named = os.environ.get("MEMSNAP_TORCH_LIBRARY")
    if named:
        return named
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "libmemsnap_pytorch.so"))


def _load():
    global _lib, _gil
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        _warn("load", "the PyTorch attachment %s is not there (memsnap was built without torch?); "
                      "this process records no tensors, the job goes on" % path)
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        _warn("load", "cannot load the PyTorch attachment %s (%s); this process records no tensors, "
                      "the job goes on" % (path, e))
        return None
    lib.memsnap_torch_attach.argtypes = [ctypes.c_char_p]
    lib.memsnap_torch_attach.restype = ctypes.c_int
    lib.memsnap_torch_set_device_total.argtypes = [ctypes.c_int, ctypes.c_uint64]
    lib.memsnap_torch_set_device_total.restype = None
    lib.memsnap_torch_step_hint.restype = None
    lib.memsnap_torch_step.restype = None
    lib.memsnap_torch_dump.restype = ctypes.c_int
    lib.memsnap_torch_recording.restype = ctypes.c_int
    lib.memsnap_torch_events.restype = ctypes.c_uint64
    lib.memsnap_torch_batch.restype = ctypes.c_int64
    gil = ctypes.PyDLL(path)
    gil.memsnap_torch_probe_python.restype = ctypes.c_int
    gil.memsnap_torch_resolve_python.restype = None
    _lib, _gil = lib, gil
    atexit.register(_resolve)  # before the recorder writes the last window, at C exit
    return lib


def _resolve():
    try:
        if _gil is not None:
            _gil.memsnap_torch_resolve_python()
    except Exception:  # noqa: BLE001 - do no harm
        pass


def _on_cuda_ready(torch, lib):
    # Runs at CUDA's lazy initialisation (or at once if it happened): the allocator's per-device
    # state exists only from then on. Must never raise: torch would fail its own initialisation.
    try:
        for device in range(torch.cuda.device_count()):
            lib.memsnap_torch_set_device_total(device, torch.cuda.get_device_properties(device).total_memory)
        name = torch.cuda.get_device_name(torch.cuda.current_device())
        _gil.memsnap_torch_probe_python()  # with the GIL: where this interpreter keeps its frames
        lib.memsnap_torch_attach(name.encode("utf-8", "replace"))
    except Exception as e:  # noqa: BLE001 - do no harm
        _warn("attach", "cannot attach to PyTorch's allocator (%s); the job goes on" % e)


class _StepCounter:
    """A batch ends when the first optimizer that ever stepped steps again: one count per batch
    with several optimizers (a GAN's two), none per micro-batch of gradient accumulation."""

    def __init__(self, lib):
        self._lib = lib
        self._first = None

    def __call__(self, optimizer, args, kwargs):
        try:
            first = self._first() if self._first is not None else None
            if first is None:  # the first optimizer, or a new one after the first was dropped
                self._first = weakref.ref(optimizer)
                first = optimizer
            _resolve()
            if optimizer is first:
                self._lib.memsnap_torch_step_hint()
        except Exception:  # noqa: BLE001 - do no harm
            pass


def attach():
    """Attach memsnap to PyTorch's CUDA caching allocator. True when the attachment is in place or
    will be once CUDA initialises; False (after one line) when this process cannot record tensors.
    Calling it again does nothing."""
    global _attach_called
    with _lock:
        if _attach_called:
            return _lib is not None
        _attach_called = True
        if os.environ.get("MEMSNAP_ENABLED", "true").lower() in ("0", "false", "no", "off"):
            return False  # memsnap run does not record this job (it said why) or the user turned memsnap off
        try:
            import torch
        except Exception as e:  # noqa: BLE001
            _warn("torch", "torch cannot be imported (%s); nothing to attach to" % e)
            return False
        try:
            settings = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
            if "cudaMallocAsync" in settings:
                _warn("backend", "PyTorch uses the cudaMallocAsync backend, which has no trace tracker: "
                                 "memsnap's CUPTI library records its allocations instead")
                return False
            lib = _load()
            if lib is None:
                return False
            torch.cuda._lazy_call(lambda: _on_cuda_ready(torch, lib))
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook
                register_optimizer_step_post_hook(_StepCounter(lib))
            except Exception as e:  # noqa: BLE001
                _warn("hook", "no optimizer step hook (%s); batches come from NVTX ranges or step() only" % e)
            return True
        except Exception as e:  # noqa: BLE001 - do no harm
            _warn("attach", "cannot attach to PyTorch's allocator (%s); the job goes on" % e)
            return False


def step():
    """Mark the end of a batch explicitly. Once called, optimizer steps no longer count."""
    if _lib is not None:
        _resolve()
        _lib.memsnap_torch_step()


def dump():
    """Write the current window (or the recent history outside a window) now. True on success."""
    _resolve()
    return _lib is not None and _lib.memsnap_torch_dump() == 1


def recording():
    """True while this process records through the attachment."""
    return _lib is not None and _lib.memsnap_torch_recording() == 1


def _stats():
    """(events seen, batch now running): for memsnap's tests and benchmarks."""
    if _lib is None:
        return (0, 0)
    return (int(_lib.memsnap_torch_events()), int(_lib.memsnap_torch_batch()))
