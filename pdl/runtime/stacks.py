"""A rank's Python stack on request, even while it is blocked in native code.

The hang watchdog (:mod:`pdl_magics.session`) sends
:data:`pdl.engine_channel.STACK_SIGNAL` to the engines of a cell that has stopped making
progress (through ipyparallel's nanny, like an interrupt). :func:`install` has
registered :mod:`faulthandler` for it, which writes the stack of every thread into a
pipe from inside the signal handler, without needing the interpreter: it works while
the main thread waits in a collective, ``time.sleep`` or any other native call
(faulthandler restarts interrupted syscalls). A daemon thread reads the pipe and
publishes the main thread's stack on the running cell's data channel under
:data:`pdl.engine_channel.STACK_KEY` as ``{"count": n, "stack": [lines]}``: the frames
from the user's cell to the innermost call, most recent call last, each ``File "...",
line N, in f`` followed by that source line when it is known, as in a Python traceback.

The engine keeps running: this only reports where it is.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import re
import select
import threading

from pdl.engine_channel import STACK_KEY, STACK_SIGNAL

#: Seconds of silence on the pipe that end one dump.
_DUMP_GAP_S = 0.2
#: A frame of PDL's own cell runner: frames from here down are not the user's.
_RUNNER = re.compile(r'File ".*[/\\]pdl[/\\]runtime[/\\]engine\.py", line \d+ in _run_cell')
#: One frame as faulthandler writes it.
_FRAME = re.compile(r'File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)')

_installed = False
_count = 0


def install(publish=None) -> None:
    """Register the stack dump for :data:`~pdl.engine_channel.STACK_SIGNAL` in this process (once).

    ``publish(dict)`` sends data to the notebook; default: ipyparallel's
    ``publish_data`` (the running cell's data channel).
    """
    global _installed
    if _installed:
        return
    if publish is None:
        from ipyparallel.datapub import publish_data as publish
    read_fd, write_fd = os.pipe()
    faulthandler.register(STACK_SIGNAL, file=write_fd, all_threads=True, chain=False)
    threading.Thread(target=_relay, args=(read_fd, publish), name="pdl-stacks", daemon=True).start()
    _installed = True


def _relay(read_fd: int, publish) -> None:
    global _count
    main_id = threading.main_thread().ident
    while True:
        dump = os.read(read_fd, 1 << 16)
        while select.select([read_fd], [], [], _DUMP_GAP_S)[0]:
            dump += os.read(read_fd, 1 << 16)
        _count += 1
        try:
            publish({STACK_KEY: {"count": _count, "stack": main_thread_stack(dump.decode(errors="replace"), main_id)}})
        except Exception:  # noqa: BLE001 - never let the relay die
            pass


def main_thread_stack(dump: str, main_id: int) -> list[str]:
    """The frames of thread ``main_id`` in a faulthandler ``dump``, most recent call
    last, from the user's cell up (PDL's and ipyparallel's frames below it left out)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump.strip())
    wanted = f"0x{main_id:016x}"
    for block in blocks:
        header, _, body = block.partition("\n")
        if wanted in header:
            frames = [line.strip() for line in body.splitlines() if line.strip().startswith("File ")]
            frames.reverse()  # faulthandler lists the most recent call first
            for i, line in enumerate(frames):
                if _RUNNER.search(line):
                    frames = frames[i + 1:]
                    break
            return [text for line in frames for text in _with_source(line)]
    return []


def _with_source(frame: str) -> list[str]:
    """``File "f", line N in g`` as a traceback shows it, with the source line when known."""
    m = _FRAME.search(frame)
    if not m:
        return [frame]
    source = linecache.getline(m["file"], int(m["line"])).strip()
    head = f'File "{m["file"]}", line {m["line"]}, in {m["func"]}'
    return [head, f"  {source}"] if source else [head]
