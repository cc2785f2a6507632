"""``ringfeed.TokenLoader``: windows of token data from a ringfeed server, as dicts of tensors.

A token stream is the server's second sample kind (``proto/control.md``, "Token streams"): the
same connection, ring, ``start``/``ready``/``release`` cycle, resume and reconnect as an image
stream. So ``TokenLoader`` is the same ``_stream.Stream`` as ``Loader`` with another batch maker,
``TokenBatches``, whose ``open`` asks for windows instead of images and whose batches are dicts of
fields instead of ``(images, labels)``. Everything else (slot ownership, CUDA copies on a side
stream, ``state_dict``, ``stats``, reconnecting) is the stream's code, not a copy of it.

Why a class beside ``Loader`` rather than a mode of it: a token stream takes none of the image
arguments (``transform``, ``layout``, ``normalize``, ``lmdb``, ``on_error``) and has its own
(``seq_len``, ``mode``, boundary fields), so one signature for both would accept combinations
that mean nothing; two classes over one stream keep each signature honest and share the machinery.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._base import BaseLoader, From
from ._errors import ProtocolError
from ._options import (
    Server,
    StreamConfig,
    Tuning,
    check_remote_protocol,
    dataset_path,
    int_in,
    legacy_group,
    no_other_keywords,
    refuse_both,
    remote_scheme,
)
from ._options import deprecated as warn_deprecated
from ._stream import BatchMaker

__all__ = ["TokenLoader"]

#: Fields a token stream always carries, and the ones it carries on request (ring.md, "Fields
#: of a token stream"), with each one's dtype; shapes depend on ``seq_len`` and ``max_docs``.
TOKEN_ALWAYS = ("input_ids", "labels")
TOKEN_FIELDS: dict[str, str] = {
    "input_ids": "int64",
    "labels": "int64",
    "position_ids": "int32",
    "document_ids": "int32",
    "cu_seqlens": "int32",
    "index": "int64",
    "dataset_index": "int32",
}
#: The label of a position that carries no loss (PyTorch's ``ignore_index``).
IGNORE_INDEX = -100
MODES = ("concat", "pack")


@dataclass(frozen=True)
class TokenOptions:
    """``TokenLoader``'s token arguments, checked (see ``TokenLoader`` for each)."""

    seq_len: int
    mode: str
    max_docs: int
    pad_id: int | None
    #: A flat token file's dtype (``TokenLoader(token_dtype=)``).
    token_dtype: str | None
    #: Every field the ring carries: ``input_ids``, ``labels``, then the ones asked for.
    token_fields: tuple[str, ...]
    #: ``[(absolute path or s3:// URL, weight)]``: the datasets of the stream, the first one ``open.dataset``.
    mix: list[tuple[str, float]]

    @classmethod
    def check(
        cls, path: Any, seq_len: Any, mode: Any, fields: Any, max_docs: Any, pad_id: Any, token_dtype: Any
    ) -> TokenOptions:
        seq_len = int_in("seq_len", seq_len, 1, 1 << 20)
        if mode not in MODES:
            raise ValueError(f"mode must be 'concat' or 'pack', got {mode!r}")
        max_docs = seq_len if max_docs is None else int_in("max_docs", max_docs, 1, seq_len)
        pad_id = None if pad_id is None else int_in("pad_id", pad_id, 0, (1 << 32) - 1)
        if token_dtype not in (None, "uint16", "uint32"):
            raise ValueError(f"token_dtype must be 'uint16' or 'uint32' (a flat token file's), got {token_dtype!r}")
        return cls(seq_len, mode, max_docs, pad_id, token_dtype, _check_token_fields(fields), _check_mix(path))


class TokenBatches(BatchMaker):
    """The token kind's batch maker: ``open``'s ``tokens`` members, the token fields, and the
    batch as a dict (``cu_seqlens`` flattened); the rest is ``BatchMaker``'s plain batch."""

    #: Nothing of a token stream is decoded, so hybrid decode is off (``Loader.gpu_decode_reason``).
    gpu_decode_reason = "gpu_decode=False"

    def __init__(self, opts: TokenOptions) -> None:
        self.opts = opts

    def open_members(self, cfg: StreamConfig, server_protocol: tuple[int, int]) -> dict[str, Any]:
        """The token stream's members of ``open`` (control.md, "Token streams")."""
        o = self.opts
        if server_protocol < (1, 2):
            raise ProtocolError(
                f"the server speaks protocol {server_protocol[0]}.{server_protocol[1]}; token streams "
                f"need 1.2 (install a ringfeed server that matches this package)"
            )
        tokens: dict[str, Any] = {"seq_len": o.seq_len, "mode": o.mode, "max_docs": o.max_docs}
        if o.pad_id is not None:
            tokens["pad_id"] = o.pad_id
        if o.token_dtype is not None:
            tokens["dtype"] = o.token_dtype
        check_remote_protocol([p for p, _ in o.mix], server_protocol)
        remote = [p for p, _ in o.mix if remote_scheme(p) is not None]
        if remote and server_protocol < (1, 7):
            raise ProtocolError(
                f"the server speaks protocol {server_protocol[0]}.{server_protocol[1]}; token datasets on S3 "
                f"({remote[0]}) need 1.7 (install a ringfeed server that matches this package)"
            )
        if len(o.mix) > 1:
            if server_protocol < (1, 3):
                raise ProtocolError(
                    f"the server speaks protocol {server_protocol[0]}.{server_protocol[1]}; mixing token "
                    f"datasets needs 1.3 (install a ringfeed server that matches this package)"
                )
            tokens["weight"] = o.mix[0][1]
            tokens["mix"] = [{"dataset": p, "weight": w} for p, w in o.mix[1:]]
        return {
            "sample_kind": "tokens",
            "tokens": tokens,
            "fields": [f for f in o.token_fields if f not in TOKEN_ALWAYS],
        }

    def ring_fields(self) -> tuple[str, ...]:
        return self.opts.token_fields

    def field_spec(self, name: str) -> tuple[str, tuple[int | None, ...]]:
        o = self.opts
        shape = {"cu_seqlens": (o.max_docs + 1,), "index": (), "dataset_index": ()}.get(name, (o.seq_len,))
        return TOKEN_FIELDS[name], shape

    def shape(self, out: dict[str, Any]) -> Any:
        if "cu_seqlens" in out:
            out = dict(out)
            out["cu_seqlens"] = flatten_cu_seqlens(out["cu_seqlens"], self.opts.seq_len)
        return out


class TokenLoader(BaseLoader):
    """Batches of ``seq_len``-token windows of a token dataset, as a dict of tensors.

    ::

        loader = ringfeed.TokenLoader("/data/fineweb.tok", batch_size=16, seq_len=2048,
                                      fields=("position_ids", "cu_seqlens"), device="cuda")
        for epoch in range(2):
            loader.set_epoch(epoch)
            for batch in loader:
                out = model(input_ids=batch["input_ids"], labels=batch["labels"])

    Each window reads ``seq_len + 1`` tokens: ``input_ids`` are the first ``seq_len``, ``labels``
    the last ``seq_len`` (the shift is done; ``-100`` where no loss is taken), both int64
    ``[batch_size, seq_len]``.

    Args:
        path: a token dataset (``ringfeed pack --tokenizer``), a Megatron ``PREFIX.bin``, or a
            flat token file (with ``token_dtype``); or, protocol 1.7, the ``"s3://bucket/prefix"`` URL
            of a token dataset on S3-compatible storage (1.9: ``gs://``, ``az://``) (sent unchanged; the server
            fetches it into its cache with its own credentials: docs/remote.md); or a mapping of such paths to
            weights, to mix them
            into one stream (protocol 1.3; control.md, "Mixing"): ``{"/data/web.tok": 0.7,
            "/data/code.tok": 0.3}``. Weights count tokens (every window holds ``seq_len``), need
            not sum to 1, and hold at every prefix of the stream: after any number of windows
            taken by all ranks together, each dataset has had ``floor`` or ``ceil`` of its share.
            A mixed epoch has as many windows as the datasets together; a dataset whose weight
            asks for more windows than it has repeats them (a new shuffle each pass), one that
            asks for fewer is sampled. Shuffling (``shuffle``) happens inside each dataset.
        batch_size: windows per batch.
        seq_len: tokens per window (``seq_len + 1`` are read).
        mode: ``"concat"``: documents back to back with their EOS, cut into windows (pretraining;
            the windows of an epoch cover the stream once); ``"pack"``: whole documents placed
            into windows by best-fit decreasing, padded, never split, a document longer than
            ``seq_len + 1`` cut (SFT).
        fields: boundary fields to deliver besides ``input_ids`` and ``labels``:
            ``"position_ids"`` (int32, restarting at 0 at each document), ``"document_ids"``
            (int32, the documents of a window numbered from 0, padding ``-1``), ``"cu_seqlens"``
            (int32, cumulative sequence lengths for FlashAttention's varlen kernels, padded to
            ``max_docs + 1`` per window with ``seq_len``; the batch is flattened into one
            ``[batch_size * max_docs + 1]`` tensor of offsets into the ``batch_size * seq_len``
            tokens, a fixed shape so ``torch.compile`` does not recompile), ``"index"`` (the
            window's index in its dataset), ``"dataset_index"`` (int32, the window's dataset in a
            mix: its position in ``path``'s mapping; 0 without a mix).
        max_docs: sequences per window in ``cu_seqlens`` (default ``seq_len``, which always
            fits; a window with more has its last ones merged).
        pad_id: padding token in ``pack`` mode (default: the dataset's EOS, else 0).
        token_dtype: a flat token file's dtype, ``"uint16"`` or ``"uint32"`` (a token dataset and a
            Megatron ``.bin`` record theirs; a flat file has no header). ``input_ids`` and
            ``labels`` are int64 whatever it is. (Earlier releases called it ``dtype=``, which in
            ``Loader`` is an output type.)
        shuffle, seed, drop_last, device, rank, world_size: as for ``Loader``.
        server: ``ringfeed.Server(...)``, as for ``Loader``.
        tuning: ``ringfeed.Tuning(...)``, as for ``Loader``. Its ``threads`` are reading threads:
            with ``autotune``, a bound (the server starts a token stream at one thread, and for
            tokens the cost is reading, not decoding, so the tuner keeps it there unless the loop
            waits); without it, exactly this many (default 1).

    The keywords ``Server`` and ``Tuning`` replaced (``socket=``, ``threads=``, ...) and ``dtype=``
    still work in this release, each with a ``DeprecationWarning`` naming its new spelling.

    ``len()``, ``set_epoch``, ``state_dict``/``load_state_dict`` (a resume may change ``world_size`` and
    ``batch_size``: the rest of the epoch is re-striped by its global position), ``stats``
    and ``close`` are the ``Loader``'s (the same stream code, ``_base.BaseLoader``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Mapping[str | os.PathLike[str], float],
        batch_size: int,
        seq_len: int,
        *,
        mode: str = "concat",
        fields: Sequence[str] | None = None,
        max_docs: int | None = None,
        pad_id: int | None = None,
        token_dtype: str | None = None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        device: Any = "cpu",
        rank: int | None = None,
        world_size: int | None = None,
        server: Server | None = None,
        tuning: Tuning | None = None,
        **deprecated_keywords: Any,
    ) -> None:
        old = dict(deprecated_keywords)
        server = legacy_group("TokenLoader", old, "server", Server, server, 2)
        tuning = legacy_group("TokenLoader", old, "tuning", Tuning, tuning, 2)
        if "dtype" in old:
            given = old.pop("dtype")
            warn_deprecated("TokenLoader(dtype=...)", "token_dtype=... (the token file's type)", 2)
            if token_dtype is not None:
                refuse_both("TokenLoader", "dtype=", "token_dtype=")
            token_dtype = given
        no_other_keywords("TokenLoader", old)
        opts = TokenOptions.check(path, seq_len, mode, fields, max_docs, pad_id, token_dtype)
        cfg = StreamConfig.check(
            opts.mix[0][0], batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, device=device, rank=rank,
            world_size=world_size, server=server, tuning=tuning,
        )  # fmt: skip
        self._start(cfg, TokenBatches(opts))

    # The token kind's settings.
    seq_len = From("_kind.opts")
    mode = From("_kind.opts")
    max_docs = From("_kind.opts")
    pad_id = From("_kind.opts")
    token_dtype = From("_kind.opts")
    token_fields = From("_kind.opts")
    mix = From("_kind.opts")
    gpu_decode_reason = From("_kind")

    def __repr__(self) -> str:
        return (
            f"<ringfeed.TokenLoader {self.path!r} batch_size={self.batch_size} seq_len={self.seq_len} mode={self.mode} "
            f"rank={self.rank}/{self.world_size} device={self.device} ({self._state()})>"
        )


def flatten_cu_seqlens(per_window: Any, seq_len: int) -> Any:
    """``[B, max_docs + 1]`` per-window offsets → one ``[B * max_docs + 1]`` array of offsets
    into the flattened ``B * seq_len`` tokens: window ``b``'s offsets shifted by ``b * seq_len``,
    its padding entries empty sequences. A torch tensor stays on its device."""
    b = per_window.shape[0]
    if type(per_window).__module__ == "numpy":
        import numpy as np

        shift = np.arange(b, dtype=per_window.dtype)[:, None] * seq_len
        return np.concatenate([np.zeros(1, dtype=per_window.dtype), (per_window[:, 1:] + shift).reshape(-1)])
    import torch

    shift = torch.arange(b, dtype=per_window.dtype, device=per_window.device)[:, None] * seq_len
    return torch.cat([per_window.new_zeros(1), (per_window[:, 1:] + shift).reshape(-1)])


def _check_mix(path: Any) -> list[tuple[str, float]]:
    """``[(dataset, weight)]``: one dataset (weight 1), or a mapping's entries in order; each
    dataset an absolute path or an ``s3://`` URL (``_options.dataset_path``)."""
    if not isinstance(path, Mapping):
        return [(dataset_path(path), 1.0)]
    if not path:
        raise ValueError("path: a mix needs at least one dataset")
    out = []
    for p, w in path.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"path: the weight of {os.fspath(p)!r} must be a positive number, got {w!r}")
        out.append((dataset_path(p), float(w)))
    if len({p for p, _ in out}) != len(out):
        raise ValueError("path: a mix names a dataset twice")
    return out


def _check_token_fields(fields: Sequence[str] | None) -> tuple[str, ...]:
    if fields is None:
        return TOKEN_ALWAYS
    if isinstance(fields, str):
        fields = [fields]
    out = list(TOKEN_ALWAYS)
    for name in fields:
        if name not in TOKEN_FIELDS:
            raise ValueError(f"fields: unknown field {name!r}; a token stream delivers {', '.join(TOKEN_FIELDS)}")
        if name not in out:
            out.append(name)
    return tuple(out)
