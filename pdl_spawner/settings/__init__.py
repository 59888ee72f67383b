"""The hub's settings: one table of variables, one reading of them, one check.

- :mod:`pdl_spawner.settings.variables`: every ``PDL_*`` variable of every kind, how it
  is read and the trait it sets (each kind adds its own), and the admin guide's table.
- :mod:`pdl_spawner.settings.values`: how a variable's text becomes a value (one-line
  errors naming what is valid), and the one rule of a port range.
- :mod:`pdl_spawner.settings.hub_config`: the hub's configuration from them, what
  ``jupyterhub_config.py`` runs.
- :mod:`pdl_spawner.settings.checks`: every ``c.<PDL class>.<name>`` exists.
- :mod:`pdl_spawner.settings.guide`: the admin guide's tables, written from the code
  (``python -m pdl_spawner.settings.guide variables|settings``).
- :mod:`pdl_spawner.settings.config_reading`: a setting read back as a class sees it.
- :mod:`pdl_spawner.settings.local_config`: whether the admin's own config file is
  safe to load (only root or the hub's user can change it).
"""
