"""How the dynamic providers reach the cluster: the current run's credentials.

The engine hands every dynamic provider the stack's configuration when it starts it
(`ResourceProvider.configure`), for `up`, `refresh` and `destroy` alike; the provider reads
its cluster access from it with components/kubeconfig.py's reader, as the program does. So credentials
are never resource inputs: they are not copied into the state (nor into every resource's
diff), a run from another machine or after a certificate rotation uses its own, and destroy
never uses a stale copy.
"""

from __future__ import annotations

from pulumi.dynamic import ConfigureRequest, ResourceProvider

from components.kubeconfig import kubernetes_access
from components.providers.node_api import NodeApiError


class RunCredentials(ResourceProvider):
    """A dynamic provider that reaches the cluster with the current run's credentials."""

    def __init__(self) -> None:
        super().__init__()
        self._credentials: tuple[str, str | None] | None = None

    def configure(self, req: ConfigureRequest) -> None:
        """Called by the engine with the stack's config before the provider's first call.

        Raises KubeconfigNotFound for a configured path missing on this machine:
        the engine then stops before the provider acts, with that message.
        """
        access = kubernetes_access(req.config)
        self._credentials = (access.kubeconfig, access.context)

    def credentials(self) -> tuple[str, str | None]:
        """(kubeconfig content, context) of this run."""
        if self._credentials is None:
            # Never fall back to ambient or stored credentials: either could be another cluster.
            raise NodeApiError("no cluster credentials: the engine did not configure the provider")
        return self._credentials
