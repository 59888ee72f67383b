"""The settings as the admin's guide shows them, written from the code so that the two
cannot drift: ``python -m pdl_spawner.settings.guide variables`` prints the table of
``docs/admin.md``'s "Every setting, in one place"; ``... settings`` prints
``docs/settings.md``, every ``c.<Class>.<name>`` of PDL's classes with its default and
help (a test checks that both documents hold exactly these).

Imports every kind's spawner (the Swarm one needs the ``swarm`` extra).
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

from traitlets import TraitType
from traitlets.traitlets import DefaultHandler
from traitlets.config import Configurable

from pdl_spawner.kinds import ClusterKind, kinds
from pdl_spawner.settings.variables import VARIABLES, markdown_table


def _class(name: str, registered: dict[str, ClusterKind]) -> type:
    if name == "JupyterHub":
        return importlib.import_module("jupyterhub.app").JupyterHub
    for kind in registered.values():
        for cls in kind.spawner_class().__mro__:
            if cls.__name__ == name:
                return cls
    from pdl_spawner.accounts.authenticator import PDLAuthenticator
    from pdl_spawner.accounts.lab_logins import LAB_LOGINS

    for login in (PDLAuthenticator, *LAB_LOGINS):
        if name == login.__name__:
            return login
    raise KeyError(f"no class {name} in PDL's settings")


def trait_default(trait: str, registered: dict[str, ClusterKind] | None = None) -> Any:
    """The default of ``"Class.name"`` as its class has it (a dynamic default computed on an
    instance made without config)."""
    registered = kinds() if registered is None else registered
    section, _, name = trait.partition(".")
    cls = _class(section, registered)
    if cls.__name__ in {k.spawner.rpartition(":")[2] for k in registered.values()} or section in (
            "SpawnerCore", "HostServer"):
        kind_spawner = next(k.spawner_class() for k in registered.values() if issubclass(k.spawner_class(), cls))
        return getattr(kind_spawner(), name)
    return cls.class_traits()[name].default()


def variables_table() -> str:
    """docs/admin.md's table: every kind's variables, the common ones first."""
    registered = kinds()
    every = [(v, "") for v in VARIABLES]
    for name in sorted(registered):
        every += [(v, name) for v in registered[name].variables]
    return markdown_table(every, lambda trait: trait_default(trait, registered))


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip().replace("|", "\\|")


def _declared(cls: type) -> dict[str, TraitType]:
    return {name: value for name, value in vars(cls).items()
            if isinstance(value, TraitType) and value.metadata.get("config")}


def settings_sections() -> list[tuple[str, str, dict[str, TraitType]]]:
    """(section, where it applies, its traits declared by PDL) for every settable class:
    the core's, the login's, each kind's spawner (with its mixins' settings)."""
    from pdl_spawner.accounts.authenticator import PDLAuthenticator
    from pdl_spawner.accounts.lab_logins import GuardedLogin, PDLLDAPAuthenticator
    from pdl_spawner.host.server import HostServer
    from pdl_spawner.core.spawner import SpawnerCore
    from pdl_spawner.hub.metrics import PDLMetrics

    def gathered(cls: type, elsewhere: tuple[type, ...]) -> dict[str, TraitType]:
        """The settings of ``cls`` and its mixins, but those documented with ``elsewhere``."""
        left_out = {base for other in elsewhere for base in other.__mro__}
        found: dict[str, TraitType] = {}
        for base in reversed(cls.__mro__):
            if base.__module__.startswith("pdl_spawner") and base not in left_out and (
                    base is cls or not issubclass(base, Configurable)):
                found.update(_declared(base))
        return found

    registered = kinds()
    sections = [("SpawnerCore", "every kind", gathered(SpawnerCore, ())),
                ("HostServer", "the kinds whose servers run on the hub's machine: "
                 + ", ".join(sorted(k.name for k in registered.values() if issubclass(k.spawner_class(), HostServer))),
                 gathered(HostServer, ())),
                ("PDLAuthenticator", "the login (every kind)", _declared(PDLAuthenticator)),
                ("GuardedLogin", "the lab's logins, `PDL_AUTH=pam` or `ldap` (every kind; "
                 "`c.PDLPAMAuthenticator` or `c.PDLLDAPAuthenticator` for one of them)", _declared(GuardedLogin)),
                ("PDLLDAPAuthenticator", "the login with `PDL_AUTH=ldap` (every kind), besides "
                 "jupyterhub-ldapauthenticator's own settings", _declared(PDLLDAPAuthenticator)),
                ("PDLMetrics", "PDL's series on `/hub/metrics` (every kind)", _declared(PDLMetrics))]
    for name in sorted(registered):
        spawner = registered[name].spawner_class()
        sections.append((spawner.__name__, f"`PDL_SPAWNER={name}`", gathered(spawner, (SpawnerCore, HostServer))))
    return sections


def settings_document() -> str:
    """docs/settings.md."""
    lines = ["# Every `c.*` setting of PDL", "",
             "Written by `python -m pdl_spawner.settings.guide settings` from the code (a test keeps this",
             "file equal to it). Set them in the admin's own config file (`/etc/pdl/hub_config.py`, or",
             "`PDL_LOCAL_CONFIG`; docs/admin.md, \"Every setting, in one place\"). A kind's own section",
             "(`c.PDLLocalSpawner.<name>`) wins over the core's (`c.SpawnerCore.<name>`); a name that no",
             "class has stops the hub in one line naming the nearest one.", ""]
    for section, where, traits in settings_sections():
        lines += [f"## `c.{section}`", "", f"Applies to {where}.", "",
                  "| Setting | Default | What it does |", "|---|---|---|"]
        cls = next(k for k in _settable_classes() if k.__name__ == section)
        for name in sorted(traits):
            shown = "computed (see its help)" if _computed(cls, name) else \
                f"`{_one_line(repr(traits[name].default()))}`"
            lines.append(f"| `{name}` | {shown} | {_one_line(traits[name].help)} |")
        lines.append("")
    return "\n".join(lines)


def _settable_classes() -> list[type]:
    from pdl_spawner.accounts.authenticator import PDLAuthenticator
    from pdl_spawner.accounts.lab_logins import LAB_LOGINS
    from pdl_spawner.host.server import HostServer
    from pdl_spawner.core.spawner import SpawnerCore
    from pdl_spawner.hub.metrics import PDLMetrics

    return [SpawnerCore, HostServer, PDLAuthenticator, *LAB_LOGINS, PDLMetrics,
            *(k.spawner_class() for k in kinds().values())]


def _computed(cls: type, name: str) -> bool:
    """Whether ``cls`` computes the default of ``name`` (a ``@default`` method: from the
    machine, the environment or another setting) rather than declaring it."""
    return any(isinstance(value, DefaultHandler) and value.trait_name == name
               for base in cls.__mro__ for value in vars(base).values())


def main(argv: list[str] | None = None) -> int:
    what = (argv if argv is not None else sys.argv[1:]) or ["variables"]
    if what[0] == "variables":
        print(variables_table())
    elif what[0] == "settings":
        print(settings_document(), end="")
    else:
        print("usage: python -m pdl_spawner.settings.guide variables|settings", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
