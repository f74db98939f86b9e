"""Route each request to the replica its admission chose.

verl's ``LLMServerClient`` asks a global load balancer for a server per request
(least in-flight). Frontier-group dispatch needs the admission policy to decide
(all n requests of a group on one replica, per-replica windows), so the request's
admission travels with the asyncio task in a context variable and this client
reads it. Requests without an admission (validation) use verl's balancer.
"""

import contextvars

from verl.workers.rollout.llm_server import LLMServerClient

# (replica index, priority) of the request the current asyncio task runs.
CURRENT_ADMISSION: contextvars.ContextVar = contextvars.ContextVar("verl_pipe_admission", default=None)


class AdmissionRoutedClient(LLMServerClient):
    def __init__(self, config, load_balancer_handle=None, servers: list[tuple[str, object]] = (), **kwargs):
        super().__init__(config, load_balancer_handle=load_balancer_handle, **kwargs)
        # Index = replica rank, value = (server address, Ray actor handle).
        self._servers = list(servers)

    def set_servers(self, servers: list[tuple[str, object]]) -> None:
        self._servers = list(servers)

    async def _acquire_server(self, request_id: str, **extra):
        admission = CURRENT_ADMISSION.get()
        if admission is None:
            return await super()._acquire_server(request_id, **extra)
        return self._servers[admission.replica]

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        if CURRENT_ADMISSION.get() is None:
            super()._release_server(server_id, request_id=request_id)
