"""Two torchrun "nodes" on one machine (``--nnodes 2 --node_rank 0/1`` on 127.0.0.1, gloo), two
ranks each, against the real ``ringfeed serve``: each node's ranks share their own sidecar, the
four ranks together cover every epoch exactly once, and each sidecar sizes its CPU budget from
its own node's ranks (``LOCAL_WORLD_SIZE``), not the job's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from _fleet import make_dataset

N = 36  # 4 ranks x 3 batches of 3
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("multinode"), N)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_each_with_its_sidecar_cover_every_epoch_once(dataset: Path, sockdir: Path, tmp_path: Path) -> None:
    """Four ranks on two torchrun nodes, each node with its own sidecar, deliver each epoch exactly once."""
    port = free_port()
    path = os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    nodes = []
    for node in (0, 1):
        env = {**os.environ, "PYTHONPATH": path, "RINGFEED_SOCKET": str(sockdir / f"node{node}.sock")}
        env.pop("LOCAL_WORLD_SIZE", None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node)]
        cmd += ["--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port)]
        cmd += [str(TESTS / "_torchrun_node.py"), str(dataset), str(tmp_path)]
        nodes.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    ranks = json.loads((tmp_path / "result.json").read_text())
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3]
    for epoch in ("0", "1"):
        assert sorted(i for r in ranks for i in r["seen"][epoch]) == list(range(N)), f"epoch {epoch}"
    by_node = {n: [r for r in ranks if r["node"] == n] for n in (0, 1)}
    assert sorted(r["rank"] for r in by_node[0]) == [0, 1]
    servers = set()
    for node, mine in by_node.items():
        assert len({r["socket"] for r in mine}) == 1, "a node's ranks share one sidecar"
        assert len({r["server_pid"] for r in mine}) == 1
        servers.add(mine[0]["server_pid"])
        assert mine[0]["streams"] == sorted(r["pid"] for r in mine), f"node {node}'s sidecar serves its ranks only"
        cores, threads = mine[0]["cores"], mine[0]["threads"]
        assert mine[0]["cpu_budget"] == max(1, min(threads, cores - 2)), "one core left to each of the node's 2 ranks"
    assert len(servers) == 2, "one sidecar per node"
