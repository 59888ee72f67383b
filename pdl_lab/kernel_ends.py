"""Why a kernel of this server ended, said in the first cell of the kernel that Jupyter
starts in its place: "ended by your memory limit", where the OOM killer took it.

Jupyter restarts a kernel that died and the notebook says only that it died. Two halves:

- **In the server** (:func:`watch`, from the server extension :mod:`pdl_lab`): for each
  kernel the server starts, a restart callback; when Jupyter restarts a kernel that was
  killed (SIGKILL) while the OOM killer ended a process of this account's memory cgroup
  (:func:`pdl.memory_limit.oom_kills` rose since the kernel started or last restarted),
  the one line goes into :func:`notice_file`, beside the kernel's connection file in the
  account's own runtime folder (0700: no other account writes or reads it). The OOM
  killer does not say which process it ended: one of the user's engines ended at the
  same moment as a kernel killed for another reason would be named the same way.
- **In the kernel** (:func:`load_ipython_extension`, which every kernel loads through
  PDL's ``etc/ipython/ipython_kernel_config.py``): the line, taken from that file (which
  is removed), is printed on stderr before the first cell runs, once.

The same restart callback marks the kernel Jupyter starts in place as ``starting``.
jupyter_server keeps the state the dead kernel had, ``busy`` when it died in a cell
(jupyter_server issue 1395): the kernels API then says busy forever, and a client that
connects skips the server's check that the new kernel answers and that its output
reaches the connection, so the first cell's output could be lost. From ``starting``,
the server's own activity watch makes it ``idle`` at the new kernel's first status.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from pdl import memory_limit

#: jupyter_server's event of a kernel action (its start among them), with the kernel's id.
KERNEL_ACTIONS = "https://events.jupyter.org/jupyter_server/kernel_actions/v1"


def notice_file(connection_file: str | Path) -> Path:
    """Where the line for the kernel of ``connection_file`` waits: beside it (the kernel
    keeps its connection file across a restart)."""
    path = Path(connection_file)
    return path.with_name(f"pdl-{path.stem}-ended.txt")


def ended_line(exit_code: int | None, kills_before: int | None, kills_now: int | None,
               now: float | None = None) -> str | None:
    """The line for a kernel that exited with ``exit_code`` (a Popen returncode), where the
    account's OOM kills went from ``kills_before`` to ``kills_now``; None unless it was
    killed while they rose."""
    if exit_code != -signal.SIGKILL or kills_before is None or kills_now is None or kills_now <= kills_before:
        return None
    at = time.strftime("%H:%M:%S UTC", time.gmtime(now))
    return (f"Your kernel was ended at {at} by {memory_limit.limit_text()}; this is a new kernel: "
            "its variables are gone. Use less memory, or ask the admin for a larger mem_limit.")


def watch(serverapp) -> None:
    """Watch every kernel ``serverapp`` starts from now on (see the module's doc)."""
    kernels = serverapp.kernel_manager
    kills: dict[str, int | None] = {}

    def on_restart(kernel_id: str) -> None:
        try:
            kernel = kernels.get_kernel(kernel_id)
        except KeyError:
            return
        kernel.execution_state = "starting"
        process = getattr(kernel.provisioner, "process", None)
        before, kills[kernel_id] = kills.get(kernel_id), memory_limit.oom_kills()
        line = ended_line(getattr(process, "returncode", None), before, kills[kernel_id])
        if line is None:
            return
        try:
            notice_file(kernel.connection_file).write_text(line + "\n")
        except OSError as e:
            serverapp.log.warning(f"pdl_lab: cannot leave the kernel's ending for its next cell: {e}")
        serverapp.log.info(f"pdl_lab: kernel {kernel_id}: {line}")

    async def on_action(logger, schema_id: str, data: dict) -> None:
        kernel_id = data.get("kernel_id")
        if data.get("action") == "start" and data.get("status") == "success" and kernel_id:
            kills[kernel_id] = memory_limit.oom_kills()
            kernels.add_restart_callback(kernel_id, lambda: on_restart(kernel_id), "restart")

    serverapp.event_logger.add_listener(schema_id=KERNEL_ACTIONS, listener=on_action)


def load_ipython_extension(ipython) -> None:
    """In a kernel: print the line its server left for it before the first cell, once."""
    try:
        from ipykernel.connect import get_connection_file

        notice = notice_file(get_connection_file())
        line = notice.read_text().strip()
        notice.unlink()
    except (ImportError, RuntimeError, OSError):  # not a kernel of a server, or nothing to say
        return

    def say(*_args) -> None:
        ipython.events.unregister("pre_run_cell", say)
        print(line, file=sys.stderr, flush=True)

    if line:
        ipython.events.register("pre_run_cell", say)
