"""Run by ``test_multinode.py`` under ``torchrun --nnodes 2 --node_rank K --nproc_per_node 2``: one
training process of a two-"node" job on one machine (gloo over 127.0.0.1). Each node's ranks use
their own sidecar (``RINGFEED_SOCKET`` differs by node; the first local rank starts it). Every rank
takes two epochs of batch indices; rank 0 gathers them with ``all_gather_object`` and writes them,
with what each rank's sidecar reported, to ``OUT/result.json``. argv: dataset out."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import ringfeed


def main() -> None:
    dataset, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    # Rank and world size from torchrun's RANK/WORLD_SIZE; LOCAL_WORLD_SIZE reaches the server.
    loader = ringfeed.Loader(dataset, 3, ringfeed.Resize((8, 8)), fields=["index"], seed=4, drop_last=False)
    dist.barrier()  # every rank's stream is open: each sidecar's snapshot below lists its node's
    seen = {}
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        seen[epoch] = [i for b in loader for i in b["index"].tolist()]
    dist.barrier()
    view = ringfeed.snapshot(loader.socket_path)
    mine = {
        "rank": dist.get_rank(),
        "node": int(os.environ["GROUP_RANK"]),
        "socket": loader.socket_path,
        "server_pid": view["server"]["pid"],
        "cores": view["server"]["cores"],
        "threads": view["server"]["threads"],
        "cpu_budget": view["server"]["cpu_budget"],
        "streams": sorted(s["pid"] for s in view["streams"]),
        "pid": os.getpid(),
        "seen": seen,
    }
    everyone: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    dist.barrier()  # every rank has taken its snapshot before any loader closes
    loader.close()
    if dist.get_rank() == 0:
        (out / "result.json").write_text(json.dumps(everyone))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
