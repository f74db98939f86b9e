"""Checkpoint-engine backend ``ray_store``: trainer → rollout weights through Ray's object store.

verl's backends for separate pools (nccl, nixl, hccl, ...) need CUDA/cupy or RDMA,
and ``naive`` only works colocated. This backend needs nothing but Ray, so it
works on CPU and across nodes: trainer rank 0 packs the full tensors into
buckets, ``ray.put``s each bucket and publishes the references on a named
channel actor; every rollout worker reads the buckets in order. All trainer
ranks still iterate the weight generator, because gathering FSDP2 shards into
full tensors is a collective.

Select it with ``actor_rollout_ref.rollout.checkpoint_engine.backend=ray_store``.
"""

import asyncio
import uuid
from typing import Any, AsyncGenerator, Generator

import ray
import torch

from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

_CHANNEL_NAMESPACE = "verl_pipe"


@ray.remote(num_cpus=0)
class WeightChannel:
    """Ordered bucket references per transfer; readers wait for the next bucket."""

    def __init__(self):
        self._items: dict[str, list] = {}
        self._cond = asyncio.Condition()

    async def put(self, key: str, item) -> None:
        async with self._cond:
            self._items.setdefault(key, []).append(item)
            self._cond.notify_all()

    async def get(self, key: str, index: int):
        async with self._cond:
            await self._cond.wait_for(lambda: len(self._items.get(key, ())) > index)
            return self._items[key][index]

    async def begin(self, key: str) -> None:
        """A new transfer: drop every other one (a sync cut short never reached its finalize's clear)."""
        async with self._cond:
            self._items = {key: []}

    async def clear(self, key: str) -> None:
        async with self._cond:
            self._items.pop(key, None)

    def node_id(self) -> str:
        """The Ray node this channel lives on."""
        return ray.get_runtime_context().get_node_id()


def _create_channel(name: str):
    """The run's channel, owned by the trainer's rank 0 (it lives and dies with that worker) and pinned to its node.
    Placed by Ray alone (0 CPUs) it could land on a rollout node of a multi-node cluster: losing that node then broke
    the weight sync of the replicas left. On the trainer's node it goes only with the trainer."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return WeightChannel.options(name=name, namespace=_CHANNEL_NAMESPACE, scheduling_strategy=here).remote()


def _lookup_channel(name: str):
    return ray.get_actor(name, namespace=_CHANNEL_NAMESPACE)


@CheckpointEngineRegistry.register("ray_store")
class RayStoreCheckpointEngine(CheckpointEngine):
    def __init__(self, bucket_size: int, is_master: bool = False, **kwargs) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.channel_name: str | None = None
        self.transfer: str | None = None
        self._handle = None  # the channel of ``channel_name``: the master creates it at its first prepare, a reader
        # looks it up at its first init_process_group; both keep it for the run

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        # One channel for the run, a fresh transfer id per sync (a reader never sees a previous sync's buckets).
        # A channel actor per sync made Ray start, register and tear down an actor every step: the raylet and the
        # GCS grew with each one (docs/reliability.md, soak).
        if self._handle is None:
            self.channel_name = f"weights-{uuid.uuid4().hex[:8]}"
            self._handle = _create_channel(self.channel_name)
        transfer = uuid.uuid4().hex
        ray.get(self._handle.begin.remote(transfer))  # before any reader or writer of this sync touches it
        return {"channel": self.channel_name, "transfer": transfer}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        master = metadata[0]
        if "channel" not in master:
            raise RuntimeError("ray_store: trainer rank 0 must be the checkpoint-engine master")
        actor = {"channel": [master["channel"]] * actor_wg_world_size, "transfer": [master["transfer"]] * actor_wg_world_size}
        rollout = {"channel": [master["channel"]] * rollout_world_size, "transfer": [master["transfer"]] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, channel: str, transfer: str, **kwargs):
        if channel != self.channel_name:  # a reader, the first time (the master made it in prepare)
            self.channel_name, self._handle = channel, _lookup_channel(channel)
        self.transfer = transfer

    def finalize(self):
        if self.is_master and self.transfer is not None:
            ray.get(self._handle.clear.remote(self.transfer))  # the buckets' object refs go with it
        self.transfer = None

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None):
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        async for name, tensor in ensure_async_iterator(weights):
            if not self.is_master:
                continue  # still drive the generator: the full-tensor gather is collective
            tensor = tensor.detach().to("cpu", copy=True).contiguous()
            bucket.append((name, tensor))
            size += tensor.nbytes
            if size >= self.bucket_size:
                await self._publish(bucket)
                bucket, size = [], 0
        if self.is_master:
            if bucket:
                await self._publish(bucket)
            await self._handle.put.remote(self.transfer, None)  # end of transfer
        return {}

    async def _publish(self, bucket) -> None:
        # Wrapped in a list so the channel stores the reference, not the bucket.
        await self._handle.put.remote(self.transfer, [ray.put(bucket)])

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        index = 0
        while True:
            item = await self._handle.get.remote(self.transfer, index)
            if item is None:
                return
            for name, tensor in await item[0]:
                yield name, tensor
            index += 1
