"""``ringfeed.lightning.DataModule`` under the real PyTorch Lightning ``Trainer`` (CPU), against the
real ``ringfeed serve``: epochs, checkpoint resume through Lightning's loop state, and ranks from
the trainer's DDP processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _fleet import make_dataset

import ringfeed
from ringfeed.lightning import DataModule

# Lightning 2.6 itself, with torch 2.10 and later: not ours to fix.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
    # The resumed run writes its checkpoints where the first one did, on purpose.
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty:UserWarning"),
]

N, B = 48, 4
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("lightning"), N)


class Recorder(pl.LightningModule):
    """A one-weight model that records (epoch, batch indices) of every training step."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch["index"].tolist()))
        return (self.w * batch["image"].float().mean()).sum() + self.w.square().sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(**kw: Any) -> Any:
    kw.setdefault("enable_checkpointing", False)
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kw,
    )


def module(dataset: Path, sock: str) -> DataModule:
    return DataModule(
        dataset,
        batch_size=B,
        train_transform=ringfeed.Resize((8, 8)),
        fields=["index"],
        seed=3,
        server=ringfeed.Server(socket=sock, spawn=True),
    )


def test_every_epoch_covers_the_dataset_once_in_its_own_order(dataset: Path, sock: str) -> None:
    """Under Trainer.fit, each epoch delivers every sample exactly once, and epochs differ in order."""
    model = Recorder()
    trainer(max_epochs=2).fit(model, datamodule=module(dataset, sock))
    epochs = [[i for e, b in model.seen if e == epoch for i in b] for epoch in (0, 1)]
    for seen in epochs:
        assert sorted(seen) == list(range(N))
    assert epochs[0] != epochs[1]


def test_a_mid_epoch_checkpoint_resumes_with_the_next_unused_batch(dataset: Path, sock: str, tmp_path: Path) -> None:
    """Resuming from a checkpoint saved after step 5 continues with the batches the uninterrupted run used next."""
    ckpts = tmp_path / "ckpt"
    every = pl.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=5, save_top_k=-1, filename="{step}")
    full = Recorder()
    trainer(max_epochs=2, callbacks=[every], enable_checkpointing=True).fit(full, datamodule=module(dataset, sock))
    saved = torch.load(ckpts / "step=5.ckpt", weights_only=False)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batches_delivered"] == 5

    resumed = Recorder()
    again = pl.callbacks.ModelCheckpoint(dirpath=ckpts, every_n_train_steps=5, save_top_k=-1, filename="{step}")
    resume = trainer(max_epochs=2, callbacks=[again], enable_checkpointing=True)
    resume.fit(resumed, datamodule=module(dataset, sock), ckpt_path=ckpts / "step=5.ckpt")
    assert resumed.seen == full.seen[5:]


def test_ranks_come_from_the_trainer_and_split_each_epoch(dataset: Path, tmp_path: Path) -> None:
    """With Lightning's DDP on two CPU processes, the two ranks' batches cover each epoch exactly once."""
    out = tmp_path / "seen"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("RINGFEED_SOCKET", None)
    env["RINGFEED_SOCKET"] = str(tmp_path / "s.sock")
    r = subprocess.run(
        [sys.executable, str(TESTS / "_lightning_ddp.py"), str(dataset), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [x["world_size"] for x in ranks] == [2, 2]
    for epoch in ("0", "1"):
        both = ranks[0]["seen"][epoch] + ranks[1]["seen"][epoch]
        assert sorted(both) == list(range(N)), f"epoch {epoch}"
        assert set(ranks[0]["seen"][epoch]).isdisjoint(ranks[1]["seen"][epoch])
