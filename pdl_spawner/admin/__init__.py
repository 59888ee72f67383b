"""The admin's view: who holds which workers, the queue and the reclaims; the usage report.

- :mod:`pdl_spawner.admin.frame`: its page and hub-authenticated handlers, over a
  kind's source (the rows every kind shares).
- :mod:`pdl_spawner.admin.view`: the ``pdl-admin`` service
  (``python -m pdl_spawner.admin.view``), over the source of the hub's kind.
- :mod:`pdl_spawner.admin.usage_report`: ``pdl-usage``, the hub's worker-hours by day.
"""
