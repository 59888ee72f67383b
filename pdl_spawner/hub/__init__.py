"""The hub process's own parts, which every other part of the hub side may use.

- :mod:`pdl_spawner.hub.public_url`: the hub's public URL, each user's server an
  origin of its own; :mod:`pdl_spawner.hub.tls`: how the lab reaches it over HTTPS
  (the hub's certificate, or the lab's reverse proxy in front), checked at start.
- :mod:`pdl_spawner.hub.request_limits`: the largest request body, line and headers the hub reads.
- :mod:`pdl_spawner.hub.log_lines`: log lines that quote at most 2,000 characters.
- :mod:`pdl_spawner.hub.spawn_routes`: JupyterHub's spawn routes, a PDL spawner answering
  each request before JupyterHub prepares the spawn;
  :mod:`pdl_spawner.hub.server_entry`: the way on to a running server, with an entry ticket.
- :mod:`pdl_spawner.hub.metrics`: PDL's series on JupyterHub's ``/hub/metrics``.
- :mod:`pdl_spawner.hub.usage_book`: worker-hours per person per day, as the hub keeps them.
- :mod:`pdl_spawner.hub.sqlite_file` and :mod:`pdl_spawner.hub.db_thread`: the hub's
  SQLite files, and the one thread that calls them off the event loop.
- :mod:`pdl_spawner.hub.hub_database`: JupyterHub's own SQLite database in WAL mode.
"""
