"""Route each request to the replica its admission chose, and abort it in vLLM when its task is cancelled.

verl's ``LLMServerClient`` asks a global load balancer for a server per request
(least in-flight). Frontier-group dispatch needs the admission policy to decide
(all n requests of a group on one replica, per-replica windows), so the request's
admission travels with the asyncio task in a context variable and this client
reads it. Requests without an admission (validation) use verl's balancer.

A request whose task is cancelled (a full batch's leftovers, a dropped group, a timeout, a failed step) is
cancelled in the server too (``ray.cancel`` of its ``generate`` call): vLLM aborts it and frees its slot at once,
instead of running it until the weight sync that ends the step aborts it. The rollout asks vLLM for its final output
only (``agent_worker.rollout_sampling_params``), and verl's server counts a request as still being admitted until its
first output arrives; its weight-sync abort waits for that count to reach zero, so a leftover left running would
hold the weight sync until it finished.
"""

import asyncio
import contextvars

import ray
from verl.workers.rollout.llm_server import LLMServerClient

# (replica index, priority) of the request the current asyncio task runs.
CURRENT_ADMISSION: contextvars.ContextVar = contextvars.ContextVar("verl_pipe_admission", default=None)


async def _cancelling(ref):
    """Awaits an actor call's result; cancelled, it cancels the call (an async actor's task gets CancelledError)."""
    try:
        return await ref
    except asyncio.CancelledError:
        ray.cancel(ref)
        raise


class _Call:
    """An actor call's result, awaitable once, like the ObjectRef it wraps (``ref``), but cancelled with its awaiter."""

    def __init__(self, ref):
        self.ref = ref

    def __await__(self):
        return _cancelling(self.ref).__await__()


class _Method:
    def __init__(self, method):
        self._method = method

    def remote(self, *args, **kwargs) -> _Call:
        return _Call(self._method.remote(*args, **kwargs))


class CancellingServer:
    """A server actor handle whose ``generate.remote(...)`` is cancelled with the task awaiting it. Seam: verl's
    ``LLMServerClient.generate`` awaits ``server.generate.remote(...)`` on the handle ``_acquire_server`` returns, and
    calls nothing else on it."""

    def __init__(self, handle):
        self._handle = handle
        self.generate = _Method(handle.generate)

    def __getattr__(self, name):
        handle = self.__dict__.get("_handle")  # absent in a copy made without __init__: no recursion through here
        if handle is None:
            raise AttributeError(name)
        return getattr(handle, name)


class AdmissionRoutedClient(LLMServerClient):
    def __init__(self, config, load_balancer_handle=None, servers: list[tuple[str, object]] = (), **kwargs):
        super().__init__(config, load_balancer_handle=load_balancer_handle, **kwargs)
        self.set_servers(servers)

    def set_servers(self, servers: list[tuple[str, object]]) -> None:
        # Index = replica rank, value = (server address, Ray actor handle).
        self._servers = [(address, CancellingServer(handle)) for address, handle in servers]

    async def _acquire_server(self, request_id: str, **extra):
        admission = CURRENT_ADMISSION.get()
        if admission is None:
            server_id, handle = await super()._acquire_server(request_id, **extra)
            return server_id, CancellingServer(handle)
        return self._servers[admission.replica]

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        if CURRENT_ADMISSION.get() is None:
            super()._release_server(server_id, request_id=request_id)
