"""A front end's link to workers another process runs (``shardbus serve --frontends M``: the supervisor runs the
workers, each front-end process reaches them through an ``AttachedCluster``). Placement is ``LocalCluster``'s
(``supervisor.remote_partition``); the addresses are fixed. In memory: one link per worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ..partition.handle import PartitionHandle, PartitionSpec
from .remote import ClusterClient
from .supervisor import READY_TIMEOUT, remote_partition


class AttachedCluster:
    """A front end's client for workers another process runs: ``LocalCluster``'s placement, fixed addresses."""

    def __init__(
        self, data_dir: Path | str, addresses: list[tuple[str, int]], key: str, clock: Callable[[], float] = time.time
    ) -> None:
        if not addresses:
            raise ValueError("a front end needs at least one worker")
        self.data_dir = Path(data_dir)
        self.workers = len(addresses)
        self.client = ClusterClient(key, clock)
        for index, address in enumerate(addresses):
            self.client.link(str(index), address)
        self._closed = False

    def wait_connected(self, timeout: float = READY_TIMEOUT) -> bool:
        return self.client.wait_connected(timeout)

    def partition(self, spec: PartitionSpec) -> PartitionHandle:
        return remote_partition(self.client, self.data_dir, self.workers, spec)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.client.close()
