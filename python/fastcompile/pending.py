"""Async compile (config.async_compile): the graphs whose kernels are not in use yet.

Each frontend registers what it defers or builds in the background: the torch backend's
deferred graphs (not lowered yet) and runners (kernels building), our tracer's first calls
(kernels building while the trace's values were returned). Each has ``ready`` and
``wait(timeout)``. ``fastcompile.pending_compiles()`` reads this.
"""

import threading
import time
import weakref

_PENDING = weakref.WeakSet()
_LOCK = threading.Lock()


def add(obj):
    with _LOCK:
        _PENDING.add(obj)


def pending():
    """The registered objects not ready yet."""
    with _LOCK:
        objs = list(_PENDING)
    return [o for o in objs if not o.ready]


def wait(timeout=None):
    """Waits for the background builds already started (at most `timeout` s in all); True when
    none is left. A graph whose lowering waits for its next call (async_delay_calls) has no
    build to wait for: it stays pending until called."""
    end = None if timeout is None else time.monotonic() + timeout
    for o in pending():
        o.wait(None if end is None else max(0.0, end - time.monotonic()))
    return not pending()
