"""PyTorch Lightning glue: a ``LightningDataModule`` whose loaders are ``ringfeed.Loader``\\ s.

``import ringfeed.lightning`` needs Lightning (``pip install lightning``; the older
``pytorch_lightning`` package works too). ``docs/frameworks.md`` has a whole training script.

What the module takes care of, and why:

- **Rank and world size** come from the trainer (``trainer.global_rank``, ``trainer.world_size``),
  not the environment, so the ranks of any Lightning strategy split each epoch like
  ``DistributedSampler``. Lightning does not wrap or re-shard a ``Loader``: it only does that to
  ``torch.utils.data.DataLoader`` instances (``use_distributed_sampler``).
- **Device**: batches are delivered on the trainer's root device (in CUDA mode, copied there by the
  Loader on its side stream); Lightning's own transfer is then a no-op.
- **Epochs**: each training iteration starts at ``trainer.current_epoch``, so every epoch has its
  own order and augmentations (Lightning calls ``set_epoch`` only on a ``DataLoader``'s sampler).
- **Checkpoints**: the training loader has ``state_dict`` / ``load_state_dict``, which Lightning's
  fit loop saves in every checkpoint and restores with ``trainer.fit(..., ckpt_path=...)``. The
  position saved is the batches the training loop has *used*, not those fetched: Lightning fetches
  one batch ahead, so a mid-epoch resume continues with exactly the next unused batch.
- **CPU batches** stay valid while Lightning holds the next one: on the CPU the module asks for
  ``tuning=ringfeed.Tuning(hold=2)`` (a batch is a view of ring memory, valid until ``hold`` more
  are requested).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl  # type: ignore[no-redef]

from ._options import Tuning
from ._transforms import CenterCrop, Compose, Flip, RandomResizedCrop, Resize
from .loader import Loader

__all__ = ["DataModule"]


class _TrainLoader:
    """The iterable Lightning gets for training: a ``Loader`` that follows the trainer's epoch and
    saves the position of the batches the training loop has used."""

    def __init__(self, loader: Loader, trainer: Any) -> None:
        self.loader = loader
        self._trainer = trainer
        self._start = 0  # the epoch's batch this iteration started at
        self._used = 0  # batches of this iteration the training loop has used

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.loader.set_epoch(self._trainer.current_epoch)  # keeps a loaded resume point
        self._start = self.loader.state_dict()["batches_delivered"]
        self._used = 0
        return iter(self.loader)

    def used(self) -> None:
        """One more batch has reached a training step."""
        self._used += 1

    def state_dict(self) -> dict[str, Any]:
        stream = self.loader._stream
        return stream.state_at(min(self._start + self._used, stream.run_batches()))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self.loader.close()


class DataModule(pl.LightningDataModule):
    """Training and validation batches from ringfeed, for ``Trainer.fit`` and ``Trainer.validate``.

    Args:
        train: the training dataset (a packed dataset, an LMDB, an image folder or a manifest;
            see ``Loader``), or ``None``.
        val: the validation dataset, or ``None``.
        batch_size: samples per batch, per rank.
        train_transform: default ``RandomResizedCrop(224) + Flip()``.
        val_transform: default ``Compose([Resize(256), CenterCrop(224)])``.
        val_batch_size: default ``batch_size``.
        **loader_options: passed to every ``Loader`` (``seed``, ``server``, ``tuning``,
            ``dtype``, ``layout``, ``fields``, ``on_error``, ...). ``rank``, ``world_size`` and
            ``device`` come from the trainer unless given here; on the CPU ``tuning`` defaults to
            ``ringfeed.Tuning(hold=2)`` (pass ``hold=2`` in your own ``Tuning`` too).

    The training loader shuffles and drops the last partial batch; the validation loader does
    neither. A model that overrides ``on_before_batch_transfer`` as well should call this
    module's (``trainer.datamodule.on_before_batch_transfer(batch, i)``): Lightning calls only
    one of the two, and this one counts the batches used for checkpoints.
    """

    def __init__(
        self,
        train: str | None = None,
        val: str | None = None,
        *,
        batch_size: int,
        train_transform: Any = None,
        val_transform: Any = None,
        val_batch_size: int | None = None,
        **loader_options: Any,
    ) -> None:
        super().__init__()
        if train is None and val is None:
            raise ValueError("DataModule needs a train or a val dataset (or both)")
        self.train = train
        self.val = val
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.train_transform = train_transform or RandomResizedCrop(224) + Flip()
        self.val_transform = val_transform or Compose([Resize(256), CenterCrop(224)])
        self.loader_options = dict(loader_options)
        self._train: _TrainLoader | None = None
        self._val: Loader | None = None
        # Lightning decides from whether `*_dataloader` is overridden if there is such a loader
        # at all: without a dataset, this instance shows Lightning's own (never called) methods.
        if train is None:
            self.train_dataloader = super().train_dataloader  # type: ignore[method-assign]
        if val is None:
            self.val_dataloader = super().val_dataloader  # type: ignore[method-assign]

    def _options(self) -> dict[str, Any]:
        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("the DataModule's loaders are made by a Trainer (trainer.fit(model, datamodule=dm))")
        opts = dict(self.loader_options)
        opts.setdefault("rank", trainer.global_rank)
        opts.setdefault("world_size", trainer.world_size)
        device = trainer.strategy.root_device
        opts.setdefault("device", device)
        if getattr(device, "type", str(device)) == "cpu" and "tuning" not in opts and "hold" not in opts:
            opts["tuning"] = Tuning(hold=2)
        return opts

    def train_dataloader(self) -> _TrainLoader:
        assert self.train is not None
        if self._train is None:
            opts = self._options()
            opts.setdefault("shuffle", True)
            opts.setdefault("drop_last", True)
            loader = Loader(self.train, self.batch_size, self.train_transform, **opts)
            self._train = _TrainLoader(loader, self.trainer)
        return self._train

    def val_dataloader(self) -> Loader:
        assert self.val is not None
        if self._val is None:
            opts = self._options()
            opts.setdefault("shuffle", False)
            opts.setdefault("drop_last", False)
            self._val = Loader(self.val, self.val_batch_size, self.val_transform, **opts)
        return self._val

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self._train is not None and self.trainer is not None and self.trainer.training:
            self._train.used()
        return batch

    def teardown(self, stage: str) -> None:
        for loader in (self._train, self._val):
            if loader is not None:
                loader.close()
        self._train = self._val = None
