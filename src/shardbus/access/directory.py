"""Which namespace a connection talks to, by the host name it opened with, and who may do what there.

Both front ends resolve through one ``NamespaceDirectory`` built where the process starts (``server.py``). It keeps
the namespaces it was given and one ``Authority`` each (their rules): a fixed set, built once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model.authorization import AuthorizationRule
from .authority import Authority

if TYPE_CHECKING:
    from ..namespace import Namespace


class NamespaceDirectory:
    """Which namespace a connection talks to (by the host name it opened with), and who may do what there.

    ``rules`` gives each namespace's shared access rules: a list of ``AuthorizationRule``, or a plain
    ``{key name: key}`` map whose keys have every right."""

    def __init__(
        self,
        namespaces: dict[str, Namespace],
        default: str,
        rules: dict[str, dict[str, str] | list[AuthorizationRule]],
    ) -> None:
        self.namespaces = {name.lower(): ns for name, ns in namespaces.items()}
        self.default = default.lower()
        self.authorities: dict[str, Authority] = {}
        for name, given in rules.items():
            ns = self.namespaces.get(name.lower())
            if isinstance(given, dict):
                self.authorities[name.lower()] = Authority.of_keys(ns, given)
            else:
                self.authorities[name.lower()] = Authority(ns, given)

    def resolve(self, hostname: str | None) -> tuple[Namespace, Authority]:
        label = (hostname or "").split(":")[0].split(".")[0].lower()
        name = label if label in self.namespaces else self.default
        namespace = self.namespaces[name]
        return namespace, self.authorities.get(name) or Authority(namespace, ())
