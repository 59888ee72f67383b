"""The hub's own answer to a request at a user's origin, relayed: one path for strangers.

At ``<name>.<hub>/user/<name>/...`` a stranger (a request without credentials the
server accepts) must get the same answer, in words and in time, whether ``<name>``'s
server runs or not (issue 60). Both sides answer through :func:`answer_from_hub`:

- a running server's gate (:mod:`pdl_server.entry_gate`) relays the stranger's request
  to the hub;
- the hub, where no server runs at that origin (:mod:`pdl_spawner.hub.server_entry`),
  relays it to itself the same way.

So a stranger's request always takes one hop more than the proxy's, through the same
code, and the hub's answer to the relayed request (JupyterHub's for a path no server
serves) is the answer: status, headers and body as the hub wrote them. A relayed
request carries :data:`MARK_HEADER` with the hub's mark (:func:`relay_mark`), which the
hub answers itself instead of relaying again. The mark is no secret from the lab's
users (every server is told it, ``PDL_RELAY_MARK``): with it a request gets the hub's
answer one hop sooner, nothing more; an anonymous visitor does not know it.

The two sides are different processes (a user's Jupyter server does more per request
than the hub), and a stranger could tell them apart by the clock alone: in a run, the
medians of 80 answers were 3.7 ms at a running server and 2.8 ms where none ran. So
neither side writes its answer sooner than :data:`ANSWER_FLOOR_S` after the request
arrived: both then answer in the same time wherever their own work is shorter.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac

from tornado import httpclient, web

#: The header that marks a request as relayed (its value: :func:`relay_mark`).
MARK_HEADER = "X-PDL-Relayed"
#: Request and response headers that belong to one connection, not passed on.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade"})
#: Seconds the hub has to answer a relayed request.
TIMEOUT_S = 10.0
#: Seconds after a stranger's request arrived before its answer is written, on both
#: sides: above either side's own work on a machine at rest (2-4 ms), so that the work
#: does not show in the answer's time.
ANSWER_FLOOR_S = 0.02


@functools.lru_cache(maxsize=4)
def relay_mark(cookie_secret: bytes) -> str:
    """The hub's mark of a relayed request, derived from its cookie secret."""
    return hmac.new(cookie_secret, b"pdl-relay-mark", hashlib.sha256).hexdigest()


def is_marked(request, mark: str) -> bool:
    """Whether ``request`` (tornado's) carries ``mark`` (compared in constant time)."""
    return bool(mark) and hmac.compare_digest(request.headers.get(MARK_HEADER, ""), mark)


async def answer_from_hub(handler: web.RequestHandler, hub_origin: str, mark: str) -> None:
    """Relay ``handler``'s request as it came (method, path and query, headers, body) to
    the hub at ``hub_origin`` (``http://host:port``), marked, and write the hub's answer
    as ``handler``'s, then finish it, no sooner than :data:`ANSWER_FLOOR_S` after the
    request arrived. HTTPError(503) where the hub does not answer."""
    request = handler.request
    headers = {name: value for name, value in request.headers.get_all()
               if name.lower() not in HOP_BY_HOP and name.lower() not in ("content-length", MARK_HEADER.lower())}
    headers[MARK_HEADER] = mark
    relayed = httpclient.HTTPRequest(
        hub_origin + request.uri, method=request.method, headers=headers,
        body=request.body if request.body or request.method in ("POST", "PUT", "PATCH") else None,
        follow_redirects=False, decompress_response=False, allow_nonstandard_methods=True,
        request_timeout=TIMEOUT_S)
    try:
        answer = await httpclient.AsyncHTTPClient().fetch(relayed, raise_error=False)
    except (OSError, httpclient.HTTPClientError):  # refused, or no answer in time (tornado's 599)
        answer = None
    await asyncio.sleep(max(0.0, ANSWER_FLOOR_S - request.request_time()))
    if answer is None:
        raise web.HTTPError(503, "the hub does not answer")
    handler.clear()
    for name in list(handler._headers):  # tornado's and the handler's defaults: the hub's headers only
        handler.clear_header(name)
    handler.set_status(answer.code, answer.reason)
    for name, value in answer.headers.get_all():
        if name.lower() not in HOP_BY_HOP:
            handler.add_header(name, value)
    # the base class's finish: a handler's own (Jupyter's APIHandler records activity) is not the hub's
    web.RequestHandler.finish(handler, answer.body or b"")
