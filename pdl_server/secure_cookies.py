"""Over https, the user's server sets only Secure cookies (a Jupyter server extension).

The hub tells every server its public URL (``JUPYTERHUB_PUBLIC_URL``) and its cookie
options; JupyterHub's login cookies follow them, but the Jupyter server's own ``_xsrf``
cookie is set from its tornado ``xsrf_cookie_kwargs``, which say nothing of the scheme:
a browser would send it over plain HTTP too. With an https public URL that cookie is
marked Secure as well.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit


def served_over_https(environ=os.environ) -> bool:
    """Whether the hub says this server is reached over https."""
    return urlsplit(environ.get("JUPYTERHUB_PUBLIC_URL", "")).scheme == "https"


def _load_jupyter_server_extension(serverapp) -> None:
    if not served_over_https():
        return
    settings = serverapp.web_app.settings
    # the server's own default path (its base URL) is kept
    kwargs = settings.setdefault("xsrf_cookie_kwargs", {"path": settings.get("base_url", "/")})
    kwargs["secure"] = True
    serverapp.log.info("pdl_server: served over https: every cookie is Secure")
