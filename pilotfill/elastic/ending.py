"""How a rank of an app ended, in words: what the campaign's future and terminal say when the app itself ended.

An app ends once, with what it did (issue "Nothing an app or a value does relaunches a job for ever"): an exception
(its traceback), ``sys.exit(n)`` or a ``KeyboardInterrupt`` raised by its own code (:class:`AppExited`, with the
frames that did it), or a signal that killed its process (``killed by SIGSEGV (segmentation fault)``). Only the
loss of a node — its pilot preempted, released, lost — relaunches a job.
"""

from __future__ import annotations

import signal
import traceback

SIGNAL_WORDS = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "floating-point exception",
    signal.SIGILL: "illegal instruction",
    signal.SIGKILL: "killed (out of memory, or by someone)",
    signal.SIGTERM: "terminated",
}


class AppExited(RuntimeError):
    """The app's own code ended its process's work without a result: ``sys.exit(…)`` or a ``KeyboardInterrupt`` (never
    re-raised as such in the campaign: a ``SystemExit`` from ``f.result()`` would end the campaign's script)."""


def exited(exc: BaseException) -> AppExited:
    """An :class:`AppExited` saying what ``exc``
    (a ``SystemExit``, ``KeyboardInterrupt``, … raised by the app) was."""
    if isinstance(exc, SystemExit):
        what = f"the app called sys.exit({exc.code!r})" if exc.code is not None else "the app called sys.exit()"
    else:
        what = f"the app raised {type(exc).__name__}" + (f": {exc}" if str(exc) else "")
    out = AppExited(f"{what} instead of returning a value")
    out.__cause__ = exc
    return out


def exited_text(exc: BaseException) -> str:
    """The traceback of where the app exited, then what :func:`exited` says (its last line: what a terminal shows)."""
    frames = "".join(traceback.format_exception(exc))
    return f"{frames}{exited(exc)}"


def exit_words(returncode: int) -> str:
    """``-11`` -> ``killed by SIGSEGV (segmentation fault)``; ``3`` -> ``exited 3``; 128+N as shells report signals."""
    if returncode == 0:
        return "exited 0 without returning a value or raising (os._exit ends a process at once)"
    number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else None
    if number is not None:
        try:
            sig = signal.Signals(number)
        except ValueError:
            return f"exited {returncode}"
        words = SIGNAL_WORDS.get(sig)
        return f"killed by {sig.name}" + (f" ({words})" if words else "")
    return f"exited {returncode}"
