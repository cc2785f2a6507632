"""Run by ``test_lightning.py``: ``Trainer.fit`` with Lightning's DDP on two CPU processes (gloo).
Lightning starts rank 1 by running this script again; each rank writes the batch indices it
trained on, by epoch, to ``OUT/rank{R}.json``. argv: dataset out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

import ringfeed
from ringfeed.lightning import DataModule


class Recorder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[int, list[int]] = {}

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).extend(batch["index"].tolist())
        return (self.w * batch["image"].float().mean()).sum() + self.w.square().sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    dataset, out = sys.argv[1], Path(sys.argv[2])
    dm = DataModule(dataset, batch_size=4, train_transform=ringfeed.Resize((8, 8)), fields=["index"], seed=5)
    model = Recorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    record = {"world_size": trainer.world_size, "seen": model.seen}
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
