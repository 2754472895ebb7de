"""SIGTERM and SIGINT as a graceful stop, shared by every runtime of one event loop.

``loop.add_signal_handler`` keeps one handler per signal, so a Scheduler and a
Dispatcher run side by side on one loop would each replace the other's. Here a
loop's signal calls the ``stop`` of every runtime running on it; the handler is
removed when the last of them returns.

By default (``handle_signals=None``) a signal is taken only when that is safe
and expected: in the main thread, on a loop that supports signal handlers (not
Windows' proactor loop), and only if the application has not claimed the
signal itself (its own ``signal.signal`` or ``loop.add_signal_handler``, or the
signal ignored, as ``nohup`` and shells do for background jobs). Python's
default SIGINT handler and the one ``asyncio.run`` installs are not claims.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import threading
import weakref
from collections.abc import Callable

SIGNALS = (signal.SIGTERM, signal.SIGINT)

Stop = Callable[[], None]

#: Per loop, per signal taken here: the stops it calls, in registration order.
_taken: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, list[Stop]]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _unclaimed(sig: signal.Signals) -> bool:
    """True when nothing but Python's or asyncio.run's defaults handle ``sig``."""
    handler = signal.getsignal(sig)
    if handler in (signal.SIG_DFL, signal.default_int_handler):
        return True
    # 3.11+: asyncio.run's SIGINT handler, a partial of a bound method of its Runner.
    runner = getattr(asyncio, "Runner", None)
    method = handler.func if isinstance(handler, functools.partial) else handler
    return runner is not None and isinstance(getattr(method, "__self__", None), runner)


def _fire(loop: asyncio.AbstractEventLoop, sig: int) -> None:
    with _lock:
        stops = list(_taken.get(loop, {}).get(sig, ()))
    for stop in stops:
        stop()


def take(loop: asyncio.AbstractEventLoop, stop: Stop, handle_signals: bool | None) -> list[int]:
    """Route SIGTERM and SIGINT on ``loop`` to ``stop``; the signals taken (for ``give_back``).

    ``False``: none. ``True``: both, replacing any handler (raises where the loop
    cannot: outside the main thread, or a loop without signal support). ``None``:
    those that are safe to take, as the module says; never raises for that.
    """
    if handle_signals is False:
        return []
    if handle_signals is None and threading.current_thread() is not threading.main_thread():
        return []
    taken: list[int] = []
    with _lock:
        per_signal = _taken.setdefault(loop, {})
        for sig in SIGNALS:
            stops = per_signal.get(sig)
            if stops is None:
                if handle_signals is None and not _unclaimed(sig):
                    continue
                try:
                    loop.add_signal_handler(sig, _fire, loop, sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    if handle_signals:
                        raise
                    continue
                stops = per_signal[sig] = []
            stops.append(stop)
            taken.append(sig)
    return taken


def give_back(loop: asyncio.AbstractEventLoop, stop: Stop, signals: list[int]) -> None:
    """Undo ``take``: the last runtime to leave a signal removes its handler."""
    with _lock:
        per_signal = _taken.get(loop, {})
        for sig in signals:
            stops = per_signal.get(sig, [])
            if stop in stops:
                stops.remove(stop)
            if not stops and sig in per_signal:
                del per_signal[sig]
                if not loop.is_closed():
                    loop.remove_signal_handler(sig)
