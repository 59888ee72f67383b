"""PDL's Jupyter server defaults, installed as <prefix>/etc/jupyter/jupyter_server_config.py.

Kernels listen on Unix sockets (jupyter_client's ``ipc`` transport), not on
127.0.0.1 TCP ports: the sockets lie next to the kernel's connection file in the
Jupyter runtime dir, which Jupyter makes mode 0700, so no other account can
connect to a kernel's channels (IOPub has no key for subscribers: over TCP, any
local account could read a cell's code and output).
"""

import atexit
import os
import shutil
import tempfile

from jupyter_core.paths import jupyter_runtime_dir

c = get_config()  # noqa: F821 - defined by the config loader

c.KernelManager.transport = "ipc"

#: A Unix socket's path has at most 107 bytes; a kernel's is
#: ``<runtime dir>/kernel-<36-char id>-ipc-<n>``: 51 bytes after the runtime dir (n < 100).
_SOCKET_PATH_MAX, _SOCKET_NAME_LEN = 107, 51

if len(os.fsencode(jupyter_runtime_dir())) + _SOCKET_NAME_LEN > _SOCKET_PATH_MAX:
    # Too deep for the kernels' sockets (a deep home or $JUPYTER_RUNTIME_DIR): this
    # server and its kernels use a new private folder (0700) in the temporary folder.
    _runtime = tempfile.mkdtemp(prefix="jupyter-runtime-")
    os.environ["JUPYTER_RUNTIME_DIR"] = _runtime
    atexit.register(shutil.rmtree, _runtime, True)
