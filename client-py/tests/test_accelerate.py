"""``ringfeed.Loader`` under the real Hugging Face ``accelerate`` (CPU): ``prepare`` leaves the loader
as it is (it wraps and re-shards only ``torch.utils.data.DataLoader``), the loader gets its rank,
world size and device from the ``Accelerator``, and ``save_state``/``load_state`` resume it
exactly through ``register_for_checkpointing``."""

from __future__ import annotations

from pathlib import Path

import accelerate
import pytest
import torch
from _fleet import make_dataset

import ringfeed

N, B = 40, 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("accelerate"), N)


def loader_for(acc: object, dataset: Path, sock: str) -> ringfeed.Loader:
    # What to pass (docs/frameworks.md): the rank, world size and device accelerate decided.
    return ringfeed.Loader(
        dataset,
        B,
        ringfeed.Resize((8, 8)),
        rank=acc.process_index,  # type: ignore[attr-defined]
        world_size=acc.num_processes,  # type: ignore[attr-defined]
        device=acc.device,  # type: ignore[attr-defined]
        fields=["index"],
        seed=9,
        server=ringfeed.Server(socket=sock, spawn=True),
        tuning=ringfeed.Tuning(hold=2),
    )


def test_prepare_leaves_the_loader_alone_and_an_epoch_is_whole(dataset: Path, sock: str) -> None:
    """accelerator.prepare returns the Loader itself, unwrapped, and its epoch still covers every sample once."""
    acc = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with loader_for(acc, dataset, sock) as loader:
        model, opt, prepared = acc.prepare(model, opt, loader)
        assert prepared is loader
        seen = []
        for batch in prepared:
            x = batch["image"].float().mean(dim=(1, 2))
            loss = model(x).square().mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            seen += batch["index"].tolist()
        assert sorted(seen) == list(range(N))


def test_save_state_and_load_state_resume_the_loader_exactly(dataset: Path, sock: str, tmp_path: Path) -> None:
    """A loader registered for checkpointing resumes after load_state with exactly the batches not yet taken."""
    acc = accelerate.Accelerator(cpu=True)
    with loader_for(acc, dataset, sock) as loader:
        acc.register_for_checkpointing(loader)
        loader.set_epoch(2)
        batches = iter(loader)
        first = [next(batches)["index"].tolist() for _ in range(3)]
        acc.save_state(str(tmp_path / "state"))
        rest = [b["index"].tolist() for b in batches]
    assert len(first) + len(rest) == N // B

    acc2 = accelerate.Accelerator(cpu=True)
    with loader_for(acc2, dataset, sock) as again:
        acc2.register_for_checkpointing(again)
        acc2.load_state(str(tmp_path / "state"))
        again.set_epoch(2)  # the epoch the state holds: keeps its resume point
        assert [b["index"].tolist() for b in again] == rest
