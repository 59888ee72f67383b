"""Every ``c.<PDL class>.<name>`` must exist: a setting that no class reads is refused in
one line naming the nearest valid one, never ignored.

Checked are the sections of PDL's own classes: those of the hub's kind's spawner (its
configurable classes; a mixin of it that is not one is named with the class to set
instead), the logins' (``PDLAuthenticator``, ``lab_logins.LAB_LOGINS``), the metrics'
(``PDLMetrics``), the core's (``SpawnerCore``,
``HostServer``: refused where the kind has no such part), and any other section whose
name starts with ``PDL`` but is no class of PDL's. Sections of the other kinds'
spawners are left alone (one admin file may serve several hubs), as are JupyterHub's
and other packages' (traitlets warns of those).
"""

from __future__ import annotations

import difflib

from traitlets.config import Configurable

#: The prefix of PDL's class names.
PREFIX = "PDL"


def _nearest(word: str, choices) -> str | None:
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.5)
    return found[0] if found else None


def _classes(kind) -> tuple[dict[str, type], set[str]]:
    """The kind's settable PDL classes by name, and its PDL mixins that are not settable."""
    from pdl_spawner.accounts.authenticator import PDLAuthenticator
    from pdl_spawner.accounts.lab_logins import LAB_LOGINS
    from pdl_spawner.hub.metrics import PDLMetrics

    spawner = kind.spawner_class()
    classes = [cls for cls in spawner.__mro__ if cls is spawner or cls.__module__.startswith("pdl_spawner")]
    classes += [PDLAuthenticator, *LAB_LOGINS, PDLMetrics]
    settable = {cls.__name__: cls for cls in classes if issubclass(cls, Configurable)}
    return settable, {cls.__name__ for cls in classes if cls.__name__ not in settable}


def unknown_setting(c, kind, other_spawners: set[str] | None = None) -> str | None:
    """One line on the first ``c.<Class>.<name>`` of config ``c`` that the hub's ``kind``
    (:class:`pdl_spawner.kinds.ClusterKind`) would not read, or None. ``other_spawners``:
    the class names of the other kinds' spawners (default: from the registry)."""
    from pdl_spawner.host.server import HostServer
    from pdl_spawner.core.spawner import SpawnerCore

    if other_spawners is None:
        from pdl_spawner.kinds import kinds

        other_spawners = {k.spawner.rpartition(":")[2] for k in kinds().values() if k.name != kind.name}
    settable, mixins = _classes(kind)
    spawner = kind.spawner.rpartition(":")[2]
    for section in sorted(key for key in c.keys() if key[:1].isupper()):
        if section in other_spawners:
            continue
        if section in mixins:
            return (f"c.{section} is not a class of settings: set its settings as c.SpawnerCore.<name> "
                    f"or c.{spawner}.<name>")
        if section in settable:
            names = settable[section].class_trait_names(config=True)
            for key in sorted(c[section]):
                if key not in names:
                    near = _nearest(key, names)
                    hint = f"did you mean c.{section}.{near}?" if near else "docs/settings.md lists them"
                    return f"c.{section}.{key} is not a setting of {section}: {hint}"
        elif section in (HostServer.__name__, SpawnerCore.__name__):
            return f"c.{section} does not apply to PDL_SPAWNER={kind.name}: its spawner, {spawner}, has no {section}"
        elif section.startswith(PREFIX):
            near = _nearest(section, {*settable, *other_spawners})
            hint = f"did you mean c.{near}?" if near else "docs/settings.md lists PDL's classes"
            return f"c.{section} is not a class of PDL's settings: {hint}"
    return None
