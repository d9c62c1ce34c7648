"""SIGTERM, SIGHUP and SIGINT to the launcher (``psflow train``, a cluster or ``--in-process``).

:class:`LauncherSignals` turns each into :class:`LaunchInterrupted` (a ``KeyboardInterrupt``, as SIGINT always
was): raised at once, or, while the launcher is inside a section that must not be cut (starting a task, its
watch loop, stopping every task), recorded and raised at the next check. Only the first signal counts: the
cleanup it starts is never interrupted by a second one. A section that may hang (an ``--in-process``
checkpoint save) is deferred with ``second_cuts``: there a second signal raises at once, so the user can still
stop the run. A section of the cleanup that may hang (the interrupted end's writing, to a run directory that may
not answer) is deferred with ``repeat_cuts``: there the next signal is said on stderr and ignored (a double Ctrl-C
leaves the cleanup whole), and the one after raises at once. The handler runs on the main thread, when it next runs
Python code: the launcher's long waits there (a save, the eval set's read, the reader process's next batch) are
made of short ones (:mod:`psflow.waits`), so that a signal the kernel handed to another thread is raised in time.

*After the end.* Once the run's end is written (:attr:`LauncherSignals.ended`: metrics.json and the status files, a
finished or a failed run's), a signal no longer decides how the run ended: its :class:`LaunchInterrupted` still
stops every task, but carries that end, and the launcher's exit status is the end's own (0 finished; a failed run's
code, 1), not ``128 + n``: a script or a scheduler reading the status reads the run's outcome, which metrics.json
says too. Only an end written counts: a second signal that cuts the writing (``second_cuts``) leaves none, and nor
does one whose metrics.json could not be written (a full disk, a read-only or vanished run directory): of a finished
or a failed run's end (:attr:`LauncherSignals.unwritten`), the run failed: exit status 1 (:class:`EndNotWritten`), a
later signal's too, and its report names the file and the error. metrics.json is the end: where only status.json or
metrics.prom could not be written (the live page's file, a scrape file), the end is written.

*To the process's exit.* ``psflow train`` puts the handlers back once the run is over (:meth:`LauncherSignals.restore`),
and a signal from there to the process's exit (a supervisor's SIGTERM at the end of a job) killed it with ``128 + n``
beside a finished end. In a process whose exit follows the run (:func:`hold_to_exit`: ``psflow train``'s own
process), :meth:`~LauncherSignals.restore` after an end was written (or its metrics.json refused) puts handlers of
the end's own in their place: the signal is said on stderr (``psflow: SIGTERM arrived after the run had finished at
global_step N: its end stands (exit status 0); ...``) and ignored, the exit status the end's; the next one stops the
process at once with that status (a launcher stuck on its way out can still be stopped), its line saying what that
leaves undone (:func:`stop_at_once_leaves`: ``psflow train``'s summary not printed yet, where metrics.json holds its
figures; a run lock not released yet, a file naming the process: a run there from this host takes it over, from
another host it is deleted by hand: :mod:`psflow.checkpoint.lock`). Once the process exits normally (its
exit functions), they ignore the signal: Python, finalizing, puts the default action back in place of Python's
handlers, which killed the process with ``128 + n`` there. The handlers
are swapped one signal at a time, each the end's in place of the launcher's (never the default action between); a
signal meeting the launcher's while they are is the end's too.

*Between two starts.* A cluster started again (a port taken before training: :mod:`psflow.launch.port_retry`) is
left and the next one entered with the same :class:`LauncherSignals`: the first's leaving parks it
(:meth:`LauncherSignals.park`: the handlers stay in place, a signal is recorded, not raised), the next one's
:meth:`~LauncherSignals.install` takes it up and that start raises a signal recorded meanwhile where its end reports
it (an interrupted run, ``128 + n``, its locks released). Before, the caller's handlers were back in between: a
SIGTERM there killed the launcher with no report and its run lock left.

A stop signal the launcher inherited ignored (``nohup``) stays ignored, and so for its tasks
(:mod:`psflow.launch.stop_signals`). The task side of a stop is :mod:`psflow.launch.lifeline`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

from psflow.errors import PsflowError
from psflow.launch.stop_signals import STOP_SIGNALS, ignored_stop_signals, signal_name, stop_signals_notice

__all__ = ["EndNotWritten", "LaunchInterrupted", "LauncherSignals", "end_status", "hold_to_exit", "stop_at_once_leaves"]


class EndNotWritten(PsflowError, OSError):
    """A finished run's metrics.json could not be written: the run failed (exit status 1), its training done.
    ``final``: its end (the snapshot that file would hold: the caller still prints the run's result from it);
    ``str()``: ``could not write PATH: ERROR``."""

    def __init__(self, final: Mapping[str, Any], message: str) -> None:
        super().__init__(message)
        self.final = final


class LaunchInterrupted(KeyboardInterrupt):
    """The launcher was sent SIGTERM, SIGHUP or SIGINT; every task has been (or is being) stopped.

    Attributes:
        signum: the signal.
        ended: the run's end (its final snapshot) where it was written before the signal arrived, else None.
        unwritten: where a finished or failed end's metrics.json could not be written before the signal, why.
        final: the run's end where it was taken and its files' writing done before the signal, written or not
            (``ended``, or the end ``unwritten`` speaks of: a finished one's result is still printed), else None.
        exit_code: the launcher's exit status: ``128 + signum``; but the status of the run's end where it was
            written before the signal (:func:`end_status`: 0 finished, a failed run's code); 1 where ``unwritten``.
        report: lines for the user (set once the tasks are stopped).
    """

    def __init__(self, signum: int, report: str = "", *, ended: Mapping[str, Any] | None = None,
                 unwritten: str | None = None, final: Mapping[str, Any] | None = None) -> None:
        super().__init__(signum)
        self.signum = signum
        self.report = report
        self.ended = ended
        self.unwritten = unwritten
        self.final = final if final is not None else ended

    @property
    def exit_code(self) -> int:
        if self.unwritten is not None:
            return 1
        return 128 + self.signum if self.ended is None else end_status(self.ended)

    def __str__(self) -> str:
        return self.report or f"interrupted by {signal_name(self.signum)}"


def end_status(final: Mapping[str, Any]) -> int:
    """The exit status of a run whose end is ``final`` (its final snapshot): 0 finished, else its ``exit_code``
    (a failed run's 1; an interrupted one's ``128 + n``), 1 where it names none."""
    if final.get("phase") == "finished":
        return 0
    code = final.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else 1


def _say(line: str) -> None:
    """``line`` on stderr from a signal handler: written to file descriptor 2 directly, for the handler may run
    while the main thread is inside a ``print`` to ``sys.stderr`` (a reentrant call to its buffer raises)."""
    try:
        os.write(2, (line + "\n").encode(errors="replace"))
    except OSError:
        pass  # no stderr to tell: the signal is ignored all the same


#: The launcher's notices of ignored stop signals said so far in this process (each once).
_SAID: set[str] = set()


class LauncherSignals:
    """SIGTERM, SIGHUP and SIGINT to the launcher as :class:`LaunchInterrupted`; see the module docstring.

    Use from the main thread: :meth:`install` ... :meth:`restore`, with
    :meth:`deferring` around sections that must not be cut and :meth:`check`
    at the points where a deferred signal may be raised.
    """

    def __init__(self) -> None:
        self.received: int | None = None   # the first signal (written by the handler only)
        self._deferred = False
        self._second_cuts = False          # inside a deferred section that a second signal cuts
        self._repeat_cuts: str | None = None  # inside a cleanup that a third signal cuts: what it is doing
        self._previous: dict[int, Any] = {}  # signal -> the handler install replaced
        self._held = False  # restore is putting the end's handlers in place: a signal here is the end's
        self._parked = False  # between two starts of a cluster (park): a signal waits for the next start
        self.ignored: tuple[int, ...] = ()   # the stop signals install left ignored
        #: The run's end once written: its metrics.json (set by whoever wrote it: module docstring, *After the end*).
        self.ended: Mapping[str, Any] | None = None
        #: Why a finished or failed end's metrics.json could not be written (set by its writer): the run failed.
        self.unwritten: str | None = None
        #: The run's end once its files' writing is done, written or not (:meth:`end_written`).
        self.final: Mapping[str, Any] | None = None

    def install(self) -> bool:
        """Installs the handlers; False (nothing installed) off the main thread. Idempotent.

        A stop signal ignored now (``nohup``) stays ignored (module docstring, *Ignored signals*), and so
        for the tasks started from here; the first install in the process that leaves one ignored says so
        on stderr, once (``psflow: SIGHUP is ignored (inherited): stop with SIGTERM or SIGINT``).
        """
        if self._parked:  # the next start of a cluster: a signal raised from here on (one recorded: at its check)
            self._parked = self._deferred = False
        if threading.current_thread() is not threading.main_thread():
            return False
        if not self._previous:  # (not installed, or restored since)
            self.ignored = ignored_stop_signals()
            self._held = False
        for sig in STOP_SIGNALS:
            if sig not in self._previous and sig not in self.ignored:
                self._previous[sig] = signal.signal(sig, self._handle)
        notice = stop_signals_notice(self.ignored)
        if notice is not None and notice not in _SAID:
            _SAID.add(notice)
            print(f"psflow: {notice}", file=sys.stderr, flush=True)
        return True

    def restore(self) -> None:
        """Puts the previous handlers back (main thread); idempotent. In a process held to its exit
        (:func:`hold_to_exit`) once the run's end was written (:meth:`end_written`), the end's handlers instead: a
        signal no longer changes the exit status (module docstring, *To the process's exit*). The handlers are
        swapped one signal at a time: a signal meeting this one's handler meanwhile is handled as the end's would."""
        if self._parked:  # no next start came (the starts ended otherwise): nothing deferred any more
            self._parked = self._deferred = False
        if _HELD.on and self.final is not None and self._previous:
            _HELD.end(self.final, self.unwritten)  # what a signal is told, before any handler is the end's
            self._held = True
            _HELD.swap(self._previous)
            self._previous.clear()
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if previous is None else previous)  # None: set outside Python
        self._previous.clear()

    def park(self) -> None:
        """Leaves the handlers in place between two starts of a cluster (module docstring, *Between two starts*): a
        signal from here on is recorded, not raised, until the next :meth:`install`, after which :meth:`check`
        raises it; :meth:`restore` (no next start) puts the previous handlers back. Main thread."""
        self._deferred, self._second_cuts, self._repeat_cuts = True, False, None
        self._parked = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._held:  # a signal whose handler restore has not swapped yet: the end's, as one swapped
            _HELD.handle(signum, frame)
            return
        if self.received is not None:
            if self._deferred and self._second_cuts:
                raise self._interrupted(self.received)  # the section hangs: the user insists
            if self._deferred and self._repeat_cuts is not None:  # a cleanup that may hang: said, and the next cuts
                _say(f"psflow: {signal_name(signum)} while {self._repeat_cuts}: ignored; another signal stops the "
                     "launcher without it")
                self._second_cuts = True  # (restored on leaving the section)
            return  # a cleanup is under way: a second signal must not cut it
        self.received = signum
        if not self._deferred:
            raise self._interrupted(signum)

    def check(self) -> None:
        """Raises :class:`LaunchInterrupted` if a signal was received; never blocks."""
        if self.received is not None:
            raise self._interrupted(self.received)

    def _interrupted(self, signum: int) -> LaunchInterrupted:
        return LaunchInterrupted(signum, ended=self.ended, unwritten=self.unwritten, final=self.final)

    def writing_end(self, output_dir: str, *, cut_before: bool) -> contextlib.AbstractContextManager[None]:
        """The section that writes a run's end to ``output_dir`` (the module docstring, *After the end*): a signal
        received inside is raised once it is written; a second one cuts it (a write that hangs, a stuck mount, must
        not keep the user from stopping the launcher), but not the second of a signal that ended the run (a double
        Ctrl-C: the cleanup it starts is whole), unless a writing was cut before (``cut_before``: the directory did
        not answer); there the next signal is said and ignored, the one after cuts it (``repeat_cuts``)."""
        cuts = self.received is None or cut_before
        return self.deferring(second_cuts=cuts,
                              repeat_cuts=None if cuts else f"the run's end is written to {output_dir}")

    def end_written(self, final: Mapping[str, Any], metrics_error: str | None) -> None:
        """The end ``final``'s files were written, its metrics.json but where ``metrics_error`` says why not: the
        end is written (:attr:`ended`: a later signal leaves its exit status), else a finished or failed end's
        run failed (:attr:`unwritten`: exit status 1); an interrupted end unwritten keeps ``128 + n``."""
        self.final = final
        if metrics_error is None:
            self.ended = final
        elif final.get("phase") != "interrupted":
            self.unwritten = metrics_error

    @contextlib.contextmanager
    def deferring(self, *, check: bool = True, second_cuts: bool = False,
                  repeat_cuts: str | None = None) -> Iterator[None]:
        """A section no signal cuts: a signal received inside is raised by :meth:`check` inside, or
        on leaving the outermost such section (with ``check``, unless another exception leaves it).
        ``second_cuts``: a second signal inside raises the first at once (a section that may hang).
        ``repeat_cuts`` (a cleanup that may hang, after the first signal; what it does, ``the run's end is written
        to DIR``): a signal inside is said on stderr and ignored, the next one raises the first at once."""
        previous, self._deferred = self._deferred, True
        previous_cuts, self._second_cuts = self._second_cuts, second_cuts
        previous_repeat, self._repeat_cuts = self._repeat_cuts, repeat_cuts
        try:
            yield
        finally:
            self._deferred, self._second_cuts, self._repeat_cuts = previous, previous_cuts, previous_repeat
        if check and not previous:
            self.check()


class _Held:
    """The stop signals of a process held to its exit once a run's end was written (:func:`hold_to_exit`)."""

    def __init__(self) -> None:
        self.on = False
        self.previous: dict[int, Any] = {}  # signal -> its handler before the run (put back by the release)
        self.line = ""     # what a signal is told: the end and its exit status
        self.status = 0    # the end's exit status
        self.said = False  # a signal came: the next one stops the process
        self.final: Mapping[str, Any] = {}  # the end held
        self.written = True  # its metrics.json was written
        #: name -> what a stop at once leaves undone, asked then (:func:`stop_at_once_leaves`)
        self.undone: dict[str, Callable[[Mapping[str, Any], bool], str | None]] = {}

    def end(self, final: Mapping[str, Any], unwritten: str | None) -> None:
        """The end a signal is told of from now on (``unwritten``: why its metrics.json was not written)."""
        phase = {"interrupted": "been interrupted"}.get(str(final.get("phase")), str(final.get("phase")))
        self.status = 1 if unwritten is not None else end_status(final)
        self.final, self.written = final, unwritten is None
        stands = "its end was not written whole" if unwritten is not None else "its end stands"
        from psflow.launch.run_end import at_global_step  # (run_end imports this module)

        self.line = (f"arrived after the run had {phase} {at_global_step(final.get('global_step'))}: {stands} "
                     f"(exit status {self.status}); another signal stops the launcher at once")

    def swap(self, previous: Mapping[int, Any]) -> None:
        """The end's handlers in place of the launcher's (``previous``: the handlers they replaced), each one
        installed over the launcher's (signal.signal replaces it: never the default action between)."""
        for sig, handler in previous.items():
            self.previous.setdefault(sig, handler)
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.said:
            undone = "; ".join(self._undone())
            _say(f"psflow: {signal_name(signum)}: the launcher stops now, exit status {self.status}"
                 + (f"; not done: {undone}" if undone else ""))
            with contextlib.suppress(Exception):  # (a print to stdout it interrupted: reentrant)
                sys.stdout.flush()
            os._exit(self.status)
        self.said = True
        _say(f"psflow: {signal_name(signum)} {self.line}")

    def _undone(self) -> list[str]:
        """What stopping now leaves undone, each part's line (a part that fails to tell: left out, the stop goes on)."""
        lines = []
        for check in list(self.undone.values()):
            with contextlib.suppress(Exception):
                if (line := check(self.final, self.written)) is not None:
                    lines.append(line)
        return lines

    def at_exit(self) -> None:
        """The end's handlers ignore from here (an exit function: the process exits normally, its status decided):
        Python, finalizing, puts the default action in place of every Python handler, and a signal then killed the
        process with ``128 + n`` beside its end; an ignored one it leaves. (Registered when this module is imported,
        so that it runs after the exit functions of modules imported later.)"""
        for sig in list(self.previous):
            with contextlib.suppress(ValueError):  # (off the main thread: nothing to do)
                if signal.getsignal(sig) == self.handle:
                    signal.signal(sig, signal.SIG_IGN)

    def release(self) -> None:
        """Puts back the handlers the end's replaced (main thread), and holds no more."""
        for sig, handler in self.previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self.previous.clear()
        self.undone.clear()
        self.on, self.said = False, False


_HELD = _Held()
atexit.register(_HELD.at_exit)


def hold_to_exit() -> Callable[[], None]:
    """From now on, a run's end written in this process holds its exit status to the process's exit: the launcher's
    :meth:`LauncherSignals.restore` leaves handlers of that end in place (module docstring, *To the process's exit*).
    For a process whose exit follows the run (``psflow train``'s); returns the release (main thread), which puts
    back the handlers those replaced: for a caller that goes on (a test calling the CLI in its own process)."""
    _HELD.on = True
    return _HELD.release


def stop_at_once_leaves(name: str, undone: Callable[[Mapping[str, Any], bool], str | None] | None) -> None:
    """``name``'s part of what a held process's stop at once (the signal after the one said: :func:`hold_to_exit`)
    leaves undone, said on its line (``...; not done: PART; PART``): ``undone(end, written)`` (the end held, whether
    its metrics.json was written) asked then, in the signal handler (the main thread, cut anywhere: quick, no lock
    taken, no remote call), a line or None where nothing is left; None in place of ``undone`` removes ``name``'s."""
    if undone is None:
        _HELD.undone.pop(name, None)
    else:
        _HELD.undone[name] = undone
