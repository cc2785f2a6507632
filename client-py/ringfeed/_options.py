"""A loader's settings: each checked once, in the constructor, before any connection is tried.

The option objects are what users write (issue 28, "one way to say each thing"): ``Server`` (how
to reach the server), ``Tuning`` (the ring and the decode threads), ``ShardBlocks`` (the
``shard_blocks`` order's members), ``GPUDecode`` (hybrid decode's share and room), and the source
formats ``LMDB`` and ``WebDataset``, given as a loader's ``path``. Each is a frozen, keyword-only
dataclass that checks its fields in ``__post_init__``, so a bad value fails where it is written.
``legacy_group``, ``legacy_order`` and ``legacy_gpu_decode`` turn the keywords they replace
(``Loader(socket=...)``, ``order_block=``, ...) into them, with one ``DeprecationWarning`` per
keyword naming the new spelling (``loader._legacy_source`` does the same for ``lmdb={...}`` and
``webdataset={...}``); an old keyword beside the object that now owns it is refused
(``refuse_both``).

``StreamConfig`` holds what every sample kind's stream takes (``proto/control.md``, "open": the
order, the ranks, the ring, the timeouts, the autotuner); each kind keeps its own options beside it
(``_images.ImageOptions``, ``_tokens.TokenOptions``). The dataclasses are frozen: what the server
was asked for at ``open`` is what a reconnect asks for again.

Every refusal is a ``ValueError`` that names the parameter, the bounds and the value given
(``tests/test_options.py`` pins the messages).
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

from ._errors import ProtocolError
from .wire.sidecar import default_socket_path

#: Bounds from control.md, "open".
MAX_BATCH_SIZE = 65536
MAX_SLOTS = 64
MAX_SEED = (1 << 53) - 1
#: The slot header's epoch is a u32.
MAX_EPOCH = (1 << 32) - 1
#: Datasets on object storage (protocol 1.3): sent to the server unchanged.
REMOTE_SCHEME = "s3://"
#: Every object store's scheme (``ringfeed_format::control::REMOTE_SCHEMES``) and the protocol a
#: server needs to fetch it: S3 1.3, Google Cloud Storage and Azure Blob Storage 1.9.
REMOTE_SCHEMES = {REMOTE_SCHEME: (1, 3), "gs://": (1, 9), "az://": (1, 9)}


def remote_scheme(path: str) -> str | None:
    """The scheme of ``REMOTE_SCHEMES`` that ``path`` starts with, if any."""
    return next((s for s in REMOTE_SCHEMES if path.startswith(s)), None)


def check_remote_protocol(paths: Sequence[str], server_protocol: tuple[int, int]) -> None:
    """Refuses, naming the server's version, a URL of a store the server does not fetch yet (a
    1.8 server takes ``gs://b/k`` for a relative path: control.md, "Other object stores")."""
    for p in paths:
        scheme = remote_scheme(p)
        if scheme is not None and server_protocol < REMOTE_SCHEMES[scheme]:
            need = REMOTE_SCHEMES[scheme]
            raise ProtocolError(
                f"the server speaks protocol {server_protocol[0]}.{server_protocol[1]}; {scheme} datasets ({p}) "
                f"need {need[0]}.{need[1]} (install a ringfeed server that matches this package)"
            )


#: Sample orders (control.md, "Order and randomness", 1.3) and the bounds of their members.
ORDERS = ("auto", "global", "shard_blocks")
MAX_ORDER_BLOCK = 1 << 20
MAX_ORDER_SHARD = 1 << 32


#: ``open.lmdb.layout`` values (control.md, "open").
LMDB_LAYOUTS = ("auto", "raw", "pickle", "msgpack")
#: ``open.webdataset`` members (control.md, "WebDataset shards", 1.3) and their types.
WEBDATASET_OPTIONS: dict[str, type] = {"image": str, "label": str, "label_key": str, "write_index": bool}


def _set(obj: Any, name: str, value: Any) -> None:
    """Stores a checked (normalised) value in a frozen dataclass, from its ``__post_init__``."""
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class Server:
    """How a loader reaches its ringfeed server: ``Loader(..., server=ringfeed.Server(socket=...))``.

    Args:
        socket: the server's Unix socket. Default: ``$RINGFEED_SOCKET``, else
            ``$XDG_RUNTIME_DIR/ringfeed/ringfeed.sock``, else ``/tmp/ringfeed-$UID/ringfeed.sock``.
        spawn: start ``ringfeed serve --exit-when-idle`` at the socket when nothing listens there.
            Default: only when ``socket`` is not given. The binary is ``$RINGFEED_BIN``, else the
            one installed with this package (the wheel), else ``ringfeed`` on ``PATH``.
        spawn_timeout: seconds to wait for a started sidecar to listen.
        timeout: seconds to wait for any one message from the server before raising
            ``ringfeed.TimeoutError``; ``None`` waits for ever. A dead server is reported at once
            either way (``ServerDiedError``).
        reconnect: how many times in a row the loader may re-establish a lost stream (``Loader``,
            "Losing the server"); ``0`` (the default) raises ``ServerDiedError`` at once.
        reconnect_timeout: seconds one re-establishment may take: waiting for a server to listen
            at ``socket`` again (or for the restarted sidecar), connecting and re-opening.
        on_opening: called as ``on_opening(files_listed, seconds)`` about every second while the
            server lists an image folder or manifest for this loader (a large tree takes a while;
            the progress is also logged at INFO on the ``ringfeed`` logger), or indexes WebDataset
            tars (then the count is of tar members). Each report resets ``timeout``, so a long
            listing never times out. Image loaders only.
    """

    _: KW_ONLY
    socket: str | os.PathLike[str] | None = None
    spawn: bool | None = None
    spawn_timeout: float = 10.0
    timeout: float | None = 60.0
    reconnect: int = 0
    reconnect_timeout: float = 30.0
    on_opening: Callable[[int, float], None] | None = None

    def __post_init__(self) -> None:
        if self.socket is not None and not isinstance(self.socket, (str, os.PathLike)):
            raise ValueError(f"Server: socket must be a path, got {self.socket!r}")
        if self.spawn is not None:
            boolean("Server: spawn", self.spawn)
        _set(self, "spawn_timeout", check_timeout("Server: spawn_timeout", self.spawn_timeout) or 10.0)
        _set(self, "timeout", check_timeout("Server: timeout", self.timeout))
        _set(self, "reconnect", int_in("Server: reconnect", self.reconnect, 0, 1 << 30))
        _set(self, "reconnect_timeout", check_timeout("Server: reconnect_timeout", self.reconnect_timeout) or 30.0)
        if self.on_opening is not None and not callable(self.on_opening):
            raise ValueError(f"Server: on_opening must be a callable (files_listed, seconds), got {self.on_opening!r}")


@dataclass(frozen=True)
class Tuning:
    """The ring and the decode threads of one stream: ``Loader(..., tuning=ringfeed.Tuning(slots=8))``.

    Args:
        autotune: let the server set this stream's decode threads and prefetch depth from the
            wait the loader measures (the default; see "Why is my GPU waiting?" in the README).
            ``False`` pins ``threads`` and ``prefetch``.
        threads: decode (for tokens: reading) threads for this stream: with ``autotune=False``
            exactly this many (at most the server's pool; default: the whole pool for images, 1 for
            tokens), with autotune an upper bound.
        prefetch: batches the server prepares at once, ``1 ..= slots``: fixed with
            ``autotune=False`` (default ``slots``), the starting depth with autotune. (The server
            and ``ringfeed top`` call it the stream's *depth*.)
        slots: batches in flight in the ring, ``1 ..= 64``.
        hold: CPU mode without batch ops: how many of the most recent batches stay valid
            (``1 ..= slots``). A batch is a view of ring memory that the server overwrites once
            it is released: it is valid until ``hold`` more batches have been requested, a new
            iteration starts, or the loader is closed, unless copied. Ignored in CUDA mode.
        log_every: every this many batches, print one line to stderr: samples/s, the share of
            time spent waiting for data, and the server's threads and depth for this stream.
    """

    _: KW_ONLY
    autotune: bool = True
    threads: int | None = None
    prefetch: int | None = None
    slots: int = 4
    hold: int = 1
    log_every: int | None = None

    def __post_init__(self) -> None:
        boolean("Tuning: autotune", self.autotune)
        if self.threads is not None:
            int_in("Tuning: threads", self.threads, 1, 1024)
        int_in("Tuning: slots", self.slots, 1, MAX_SLOTS)
        if self.prefetch is not None:
            int_in("Tuning: prefetch", self.prefetch, 1, self.slots)
        int_in("Tuning: hold", self.hold, 1, self.slots)
        if self.log_every is not None:
            int_in("Tuning: log_every", self.log_every, 1, 1 << 30)


@dataclass(frozen=True)
class ShardBlocks:
    """The ``shard_blocks`` order with its members: ``Loader(..., order=ringfeed.ShardBlocks(block=8))``
    (docs/order.md). ``order="shard_blocks"`` is ``ShardBlocks()``.

    Args:
        block: shards per shuffle block (default 16).
        shard: samples per stand-in shard for datasets without shard files (LMDBs, folders,
            manifests; default 1024).
    """

    _: KW_ONLY
    block: int | None = None
    shard: int | None = None

    def __post_init__(self) -> None:
        if self.block is not None:
            int_in("ShardBlocks: block", self.block, 1, MAX_ORDER_BLOCK)
        if self.shard is not None:
            int_in("ShardBlocks: shard", self.shard, 1, MAX_ORDER_SHARD)


@dataclass(frozen=True)
class GPUDecode:
    """Hybrid decode with its details: ``Loader(..., gpu_decode=ringfeed.GPUDecode(share=0.5))``
    (docs/hybrid-decode.md). ``gpu_decode="auto"``, ``True``, ``False`` or a share is
    ``GPUDecode(share=...)``.

    Args:
        share: ``"auto"`` (the autotuner's share, where hybrid decode can work), ``True`` (the
            same, but raising ``ValueError`` where it cannot), a number in ``0 ..= 1`` (pinned),
            or ``False`` (off).
        bytes_per_sample: room for encoded bytes per sample of a batch in each ring slot
            (default: ``max(3·H·W, 65536)`` for the view's size, ``max(9·H·W, 65536)`` with
            ``pixels``; raise it for large photos, whose files would not fit: those are then
            decoded by the server).
        pixels: whether the samples the server decodes come as decoded pixels, which this process
            finishes on its GPU (the crop's resize, the flips, the per-image ops): the server's
            CPU threads then only decode (protocol 1.11, docs/hybrid-decode.md). ``None`` (the
            default) is ``RINGFEED_GPU_PIXELS`` (``0`` or ``1``) where set, else on. A server
            older than 1.11 finishes its samples itself.
    """

    _: KW_ONLY
    share: bool | float | str = "auto"
    bytes_per_sample: int | None = None
    pixels: bool | None = None

    def use_pixels(self) -> bool:
        """Whether to ask for decoded pixels: ``pixels``, else ``RINGFEED_GPU_PIXELS``, else on."""
        if self.pixels is not None:
            return self.pixels
        env = os.environ.get("RINGFEED_GPU_PIXELS", "1")
        if env not in ("0", "1"):
            raise ValueError(f"RINGFEED_GPU_PIXELS must be 0 or 1, got {env!r}")
        return env == "1"

    def __post_init__(self) -> None:
        share = self.share
        ok = share == "auto" or isinstance(share, bool)
        ok = ok or (isinstance(share, (int, float)) and 0.0 <= share <= 1.0)
        if not ok:
            raise ValueError(f"gpu_decode must be 'auto', True, False or a share in 0..1, got {share!r}")
        if self.bytes_per_sample is not None:
            int_in("GPUDecode: bytes_per_sample", self.bytes_per_sample, 4096, 64 << 20)
        if self.pixels is not None:
            boolean("GPUDecode: pixels", self.pixels)


@dataclass(frozen=True)
class LMDB:
    """An LMDB as a loader's ``path``, with its options (docs/lmdb.md; ``ringfeed pack``'s
    ``--lmdb-layout``, ``--labels``, ``--labels-key``): ``Loader(ringfeed.LMDB("/data/x.lmdb",
    layout="raw", labels_key="__labels__"), 256, ...)``. A path alone (``"/data/x.lmdb"``) is
    ``LMDB(path)``.

    Args:
        path: the LMDB (its directory, or a ``*.mdb``/``*.lmdb`` file).
        layout: how values are laid out: ``"auto"`` (the server's default), ``"raw"``,
            ``"pickle"`` or ``"msgpack"``.
        labels: raw layout: labels from this file (CSV ``key,label``, JSON or JSONL).
        labels_key: raw layout: labels from the value of this key in the same LMDB.
    """

    path: str | os.PathLike[str]
    _: KW_ONLY
    layout: str | None = None
    labels: str | os.PathLike[str] | None = None
    labels_key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ValueError(f"LMDB: path must be a path, got {self.path!r}")
        if self.layout is not None and self.layout not in LMDB_LAYOUTS:
            raise ValueError(f"LMDB: layout must be one of {', '.join(map(repr, LMDB_LAYOUTS))}, got {self.layout!r}")
        if self.labels is not None and not isinstance(self.labels, (str, os.PathLike)):
            raise ValueError(f"LMDB: labels must be a file path, got {self.labels!r}")
        if self.labels_key is not None and not isinstance(self.labels_key, str):
            raise ValueError(f"LMDB: labels_key must be a str, got {self.labels_key!r}")
        if self.labels is not None and self.labels_key is not None:
            raise ValueError("LMDB: pass labels (a file) or labels_key (a key of the LMDB), not both")

    def options(self) -> dict[str, Any]:
        """``open.lmdb`` (control.md): the options given, a labels file made absolute."""
        out: dict[str, Any] = {}
        if self.layout is not None:
            out["layout"] = self.layout
        if self.labels is not None:
            out["labels"] = os.path.abspath(os.fspath(self.labels))  # noqa: PTH100
        if self.labels_key is not None:
            out["labels_key"] = self.labels_key
        return out


@dataclass(frozen=True)
class WebDataset:
    """WebDataset tars as a loader's ``path``, with their options (docs/webdataset.md):
    ``Loader(ringfeed.WebDataset("/data/shards-{000..099}.tar", label="json", label_key="target"),
    256, ...)``. A tar path alone is ``WebDataset(path)``.

    Args:
        path: a tar, a brace or glob pattern of tars, a directory of them, or their ``s3://`` URL.
        image: the image's extensions, ``;``-separated (default ``"jpg;jpeg;png;webp"``).
        label: the label's extension (default ``"cls"``); ``"json"``: the integer member
            ``label_key`` of a JSON member; ``""``: no labels.
        label_key: the JSON label's member (default ``"label"``).
        write_index: whether the server may write index files next to the tars (default ``True``).
    """

    path: str | os.PathLike[str]
    _: KW_ONLY
    image: str | None = None
    label: str | None = None
    label_key: str | None = None
    write_index: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ValueError(f"WebDataset: path must be a path or URL, got {self.path!r}")
        for key, kind in WEBDATASET_OPTIONS.items():
            value = getattr(self, key)
            if value is not None and (not isinstance(value, kind) or (kind is str and isinstance(value, bool))):
                raise ValueError(f"WebDataset: {key} must be a {kind.__name__}, got {value!r}")

    def options(self) -> dict[str, Any]:
        """``open.webdataset`` (control.md, "WebDataset shards"): the options given."""
        return {k: getattr(self, k) for k in WEBDATASET_OPTIONS if getattr(self, k) is not None}


@dataclass(frozen=True)
class Parquet:
    """Parquet files as a loader's ``path``, with their columns (protocol 1.9; docs/parquet.md):
    ``Loader(ringfeed.Parquet("/data/train", image="jpg", label="cls"), 256, ...)``. Rows are
    samples, read in place; a ``.parquet`` file or a directory of them alone is ``Parquet(path)``.

    Args:
        path: a ``.parquet`` file, or a directory of them (taken in bytewise order of names).
        image: the image column (default ``"image"``): binary, or Hugging Face's ``Image()``
            struct ``{bytes, path}`` (the bytes are read; a row with only a path is an error).
        label: the integer label column (default ``"label"``; a null is ``-1``); ``""``: no
            labels.
    """

    path: str | os.PathLike[str]
    _: KW_ONLY
    image: str | None = None
    label: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)):
            raise ValueError(f"Parquet: path must be a path, got {self.path!r}")
        for key in ("image", "label"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"Parquet: {key} must be a column name (a str), got {value!r}")
        if self.image == "":
            raise ValueError('Parquet: image must name the image column, e.g. "image"')

    def options(self) -> dict[str, Any]:
        """``open.parquet`` (control.md, "Parquet datasets (1.9)"): the options given."""
        return {k: getattr(self, k) for k in ("image", "label") if getattr(self, k) is not None}


#: ``open.meta[].dtype`` values (control.md, "Sample fields (1.9)").
META_DTYPES = ("float32", "int32", "int64", "bool")
#: Bounds of the sample fields (control.md, "Sample fields (1.9)").
MAX_TEXT_BYTES = 1 << 20
MAX_TEXT_LENGTH = 8192
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*")
#: Ring field names are at most 16 bytes (ring.md): a text field's ``NAME_mask`` must fit.
MAX_META_NAME = 16
MAX_TEXT_NAME = 11


def _field_name(who: str, name: Any, most: int) -> str:
    if not isinstance(name, str) or not _FIELD_NAME.fullmatch(name) or len(name) > most:
        raise ValueError(
            f"{who}: a field's name must match [a-z][a-z0-9_]* and have at most {most} bytes, got {name!r}"
        )
    return name


@dataclass(frozen=True)
class Text:
    """A text field of each sample (protocol 1.9; docs/fields.md): ``Loader(..., text=ringfeed.Text("txt"))``.

    The batch then is a dict with ``name`` as a list of Python strings, or, with a ``tokenizer``,
    ``{name}_ids`` (``int32 [N, max_length]``) and ``{name}_mask`` (``bool [N, max_length]``),
    tokenised in the server as the Python ``tokenizers`` library does with the same file
    (``add_special_tokens=True``, truncated on the right to ``max_length``, padded on the right with
    the tokenizer's padding id).

    Args:
        source: where the text is: a WebDataset member's extension (``"txt"``), a JSON member's key
            (``"json:caption"``, a dotted path for nested keys), or a manifest's column
            (``"caption"``).
        name: the field's name in the batch, ``[a-z][a-z0-9_]*``, at most 11 bytes (default ``"text"``).
        tokenizer: a Hugging Face ``tokenizer.json`` the server reads (made absolute here);
            ``None``: raw text.
        max_length: tokens per sample, ``1 ..= 8192`` (tokenised only).
        max_bytes: raw text: room per sample for its UTF-8 bytes, ``1 ..= 1048576``; a longer
            text is a sample error (``on_error``), never cut.
    """

    source: str
    _: KW_ONLY
    name: str = "text"
    tokenizer: str | os.PathLike[str] | None = None
    max_length: int = 77
    max_bytes: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"Text: source must be a member, JSON key or column name, got {self.source!r}")
        _field_name("Text", self.name, MAX_TEXT_NAME)
        if self.tokenizer is not None and not isinstance(self.tokenizer, (str, os.PathLike)):
            raise ValueError(f"Text: tokenizer must be the path of a tokenizer.json, got {self.tokenizer!r}")
        int_in("Text: max_length", self.max_length, 1, MAX_TEXT_LENGTH)
        int_in("Text: max_bytes", self.max_bytes, 1, MAX_TEXT_BYTES)

    def request(self) -> dict[str, Any]:
        """Its ``open.text`` entry (control.md, "Sample fields (1.9)")."""
        if self.tokenizer is None:
            return {"name": self.name, "source": self.source, "max_bytes": self.max_bytes}
        path = os.path.abspath(os.fspath(self.tokenizer))  # noqa: PTH100
        return {"name": self.name, "source": self.source, "tokenizer": path, "max_length": self.max_length}

    def ring_fields(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The ring fields it adds (ring.md), with their dtypes and per-sample shapes."""
        if self.tokenizer is None:
            return {self.name: ("uint8", (self.max_bytes,)), f"{self.name}_len": ("int32", ())}
        n = self.max_length
        return {f"{self.name}_ids": ("int32", (n,)), f"{self.name}_mask": ("uint8", (n,))}


@dataclass(frozen=True)
class Meta:
    """Typed metadata fields of each sample (protocol 1.9; docs/fields.md):
    ``Loader(..., meta=ringfeed.Meta("json", {"aesthetic": "float32", "width": "int32", "nsfw": "bool"}))``.

    Each key becomes a tensor of the batch named after it (dots become ``_``; at most 16 bytes): ``float32``,
    ``int32``, ``int64``, or ``torch.bool`` for ``"bool"``. A missing or ill-typed value is a
    sample error (``on_error``) naming the sample, the field and the value.

    Args:
        source: the JSON member the keys are read from (``"json"``: key ``k`` is ``json:k``); a Parquet
            struct column whose members the keys name; or ``None`` for a manifest's or Parquet file's columns
            and WebDataset members, which the keys name (a member is read whole: ``.aesthetic`` holding
            ``4.25``). A WebDataset member that is not JSON is also read whole as
            ``Meta("aesthetic", {"aesthetic": "float32"})`` (its own extension as the key; protocol 1.10).
        fields: each key (a dotted path in a JSON member) and its dtype, one of ``"float32"``,
            ``"int32"``, ``"int64"``, ``"bool"``.
    """

    source: str | None
    fields: Mapping[str, str]

    def __post_init__(self) -> None:
        if self.source is not None and (not isinstance(self.source, str) or not self.source):
            raise ValueError(f"Meta: source must be a JSON member ('json') or None for columns, got {self.source!r}")
        if not isinstance(self.fields, Mapping) or not self.fields:
            raise ValueError(f"Meta: fields must be a non-empty dict of key -> dtype, got {self.fields!r}")
        for key, dtype in self.fields.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"Meta: keys must be non-empty strings, got {key!r}")
            _field_name("Meta", key.replace(".", "_"), MAX_META_NAME)
            if dtype not in META_DTYPES:
                raise ValueError(f"Meta: the dtype of {key!r} must be one of {', '.join(META_DTYPES)}, got {dtype!r}")
        _set(self, "fields", dict(self.fields))

    def requests(self) -> list[dict[str, Any]]:
        """Its ``open.meta`` entries (control.md, "Sample fields (1.9)")."""
        out = []
        for key, dtype in self.fields.items():
            source = key if self.source is None else f"{self.source}:{key}"
            out.append({"name": key.replace(".", "_"), "source": source, "dtype": dtype})
        return out

    def ring_fields(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The ring fields it adds: one scalar each (``bool`` as ``uint8``)."""
        return {key.replace(".", "_"): ("uint8" if d == "bool" else d, ()) for key, d in self.fields.items()}


#: ``Targets``' bounds (control.md, "Detection and segmentation targets (1.10)").
MAX_BOXES = 4096
#: The ring fields of targets (ring.md): boxes, their labels and count, and the label map.
TARGET_FIELDS = ("boxes", "box_labels", "box_count", "mask", "instance_masks", "keypoints")


@dataclass(frozen=True)
class Targets:
    """Detection and segmentation targets of each sample (protocol 1.10; docs/detection.md):
    ``Loader(..., targets=ringfeed.Targets(boxes="stored", mask="stored"))``.

    The server moves them with the image through every geometric op of the pipeline, as
    torchvision v2 moves ``tv_tensors.BoundingBoxes`` (XYXY) and ``tv_tensors.Mask``, and removes
    boxes smaller than ``min_size``/``min_area`` at the end (``SanitizeBoundingBoxes``). The batch
    is then a dict with ``image``, ``label`` and, with boxes, ``boxes`` (``float32 [N, max_boxes,
    4]``, xyxy in output pixels, the first ``box_count`` meaningful), ``box_labels`` (``int64 [N,
    max_boxes]``, ``-1`` padding) and ``box_count`` (``int32 [N]``); with a mask, ``mask``
    (``uint8 [N, H, W]``); with ``instance_masks=True``, ``instance_masks`` (``uint8 [N,
    ceil(max_boxes / 8), H, W]``: box ``k``'s mask is bit ``k % 8`` of plane ``k // 8``, eight
    masks to a byte; ``ringfeed.detection_targets(batch)`` unpacks them into torchvision's
    ``masks`` ``uint8 [M, H, W]`` per image); with ``keypoints=K``, ``keypoints`` (``float32 [N,
    max_boxes, K, 3]``, ``[x, y, v]`` in output pixels, moved as ``tv_tensors.KeyPoints``). In
    CUDA mode they arrive on the device with the image.

    Args:
        boxes: where the boxes come from: ``"stored"`` (a dataset packed with ``ringfeed pack
            --coco``), or a WebDataset JSON member holding a list of COCO annotations (``"json"``,
            or ``"json:annotations"`` for a key of it); ``None``: no boxes.
        mask: where the label map comes from: ``"stored"`` (packed with ``--masks``) or a
            WebDataset PNG member's extension (``"png"``); ``None``: no mask.
        max_boxes: room per sample for boxes, ``1 ..= 4096``; a sample with more is a sample
            error (``on_error``). Optional with ``"stored"`` boxes (the packed file's largest count).
        min_size: boxes narrower or lower than this many output pixels are removed; default: the
            pipeline's ``ringfeed.SanitizeBoundingBoxes`` (torchvision's spelling), else 1.
        min_area: boxes smaller than this many square output pixels are removed; default as
            ``min_size``.
        mask_fill: the label of mask pixels no source pixel covers (padding, zoom-out), ``0 ..= 255``.
        instance_masks: deliver each box's instance mask (protocol 1.10, targets file 1.1): needs
            ``boxes="stored"`` of a dataset packed with ``--coco`` whose annotations have a
            ``segmentation``, or WebDataset annotations (``boxes="json"``), each (crowds aside)
            with a ``segmentation`` (polygons or RLE, rasterised at the stored image's size as
            pycocotools does). Pixels no source covers belong to no instance (fill 0).
        keypoints: deliver ``K`` keypoints per box (0: none): with ``boxes="stored"``, the stored
            count of a dataset packed with ``--coco`` whose annotations have ``keypoints``; with
            WebDataset annotations, each annotation (crowds aside) must have ``K`` (``[x, y, v] *
            K``). Flips do not swap left and right joints (torchvision v2 does not); a point
            outside the output keeps its coordinates and its ``v``.
    """

    boxes: str | None = None
    mask: str | None = None
    _: KW_ONLY
    max_boxes: int | None = None
    min_size: float | None = None
    min_area: float | None = None
    mask_fill: int = 0
    instance_masks: bool = False
    keypoints: int = 0

    def __post_init__(self) -> None:
        if self.boxes is None and self.mask is None:
            raise ValueError("Targets: give boxes, mask or both (e.g. Targets(boxes='stored'))")
        for name in ("boxes", "mask"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"Targets: {name} must be 'stored' or a WebDataset member, got {v!r}")
        if self.max_boxes is not None:
            if self.boxes is None:
                raise ValueError("Targets: max_boxes is for boxes; give boxes")
            int_in("Targets: max_boxes", self.max_boxes, 1, MAX_BOXES)
        elif self.boxes is not None and self.boxes != "stored":
            raise ValueError(
                f"Targets: boxes={self.boxes!r} needs max_boxes (room per sample, 1..={MAX_BOXES}); "
                f"only a packed dataset's targets know their largest count"
            )
        for name in ("min_size", "min_area"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"Targets: {name} must be a finite number >= 0, got {v!r}")
        int_in("Targets: mask_fill", self.mask_fill, 0, 255)
        if not isinstance(self.instance_masks, bool):
            raise ValueError(f"Targets: instance_masks must be True or False, got {self.instance_masks!r}")
        int_in("Targets: keypoints", self.keypoints, 0, 1 << 16)
        if (self.instance_masks or self.keypoints) and self.boxes is None:
            raise ValueError(
                "Targets: instance_masks and keypoints come with boxes: 'stored' (a dataset packed with --coco) "
                "or a WebDataset member of COCO annotations ('json' or 'json:KEY')"
            )

    def request(self, sanitize: Any = None) -> dict[str, Any]:
        """Its ``open.targets`` (control.md, "Detection and segmentation targets (1.10)"), with
        ``sanitize`` (the pipeline's ``SanitizeBoundingBoxes``, if any) for unset bounds."""
        size, area = self.min_size, self.min_area
        if sanitize is not None:
            for name, mine, theirs in (("min_size", size, sanitize.min_size), ("min_area", area, sanitize.min_area)):
                if mine is not None and float(mine) != theirs:
                    raise ValueError(
                        f"Targets: {name}={mine!r}, but the pipeline's SanitizeBoundingBoxes says {theirs!r}; give one"
                    )
            size, area = sanitize.min_size, sanitize.min_area
        out: dict[str, Any] = {
            "min_size": 1.0 if size is None else float(size),
            "min_area": 1.0 if area is None else float(area),
        }
        if self.boxes is not None:
            out["boxes"] = self.boxes
        if self.mask is not None:
            out["mask"] = self.mask
            out["mask_fill"] = self.mask_fill
        if self.max_boxes is not None:
            out["max_boxes"] = self.max_boxes
        if self.instance_masks:
            out["instance_masks"] = True
        if self.keypoints:
            out["keypoints"] = self.keypoints
        return out

    def ring_fields(self, size: tuple[int, int]) -> dict[str, tuple[str, tuple[int | None, ...]]]:
        """The ring fields it adds for a view of output ``size`` ``(h, w)``, with their dtypes and
        per-sample shapes (``None``: the server decides, from a packed file's largest count)."""
        out: dict[str, tuple[str, tuple[int | None, ...]]] = {}
        if self.boxes is not None:
            m = self.max_boxes
            out.update({"boxes": ("float32", (m, 4)), "box_labels": ("int64", (m,)), "box_count": ("int32", ())})
        if self.mask is not None:
            out["mask"] = ("uint8", size)
        if self.instance_masks:
            planes = None if self.max_boxes is None else -(-self.max_boxes // 8)
            out["instance_masks"] = ("uint8", (planes, *size))
        if self.keypoints:
            out["keypoints"] = ("float32", (self.max_boxes, self.keypoints, 3))
        return out


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != "_")


#: The keywords each option object took over, by the loader keyword that now holds the object.
SERVER_KEYWORDS = _names(Server)
TUNING_KEYWORDS = _names(Tuning)


def deprecated(old: str, new: str, stacklevel: int) -> None:
    """The one ``DeprecationWarning`` of an old keyword, naming its new spelling."""
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=stacklevel + 1)


def refuse_both(who: str, old: Any, owner: str) -> None:
    """An old keyword mixed with the option object (or spelling) that now owns it."""
    names = ", ".join(f"{k}=" for k in old) if not isinstance(old, str) else old
    raise ValueError(f"{who}: {names} and {owner} both given; set it once, in {owner}")


def legacy_group(who: str, old: dict[str, Any], keyword: str, cls: type, given: Any, stacklevel: int) -> Any:
    """Takes ``cls``'s fields out of ``old`` (a loader's deprecated keywords) into a ``cls``, warning
    once per keyword; ``given`` is the object passed as ``keyword=`` (mixing both is refused)."""
    mine = {k: old.pop(k) for k in _names(cls) if k in old}
    for k in mine:
        deprecated(f"{who}({k}=...)", f"{keyword}=ringfeed.{cls.__name__}({k}=...)", stacklevel + 1)
    if given is not None and not isinstance(given, cls):
        raise ValueError(f"{keyword} must be a ringfeed.{cls.__name__}(...), got {given!r}")
    if not mine:
        return given if given is not None else cls()
    if given is not None:
        refuse_both(who, mine, f"{keyword}=ringfeed.{cls.__name__}(...)")
    return cls(**mine)


def legacy_order(who: str, old: dict[str, Any], order: Any, stacklevel: int) -> tuple[Any, ShardBlocks | None]:
    """``order`` and the deprecated ``order_block``/``order_shard`` in ``old``: with
    ``order="shard_blocks"`` they become ``ShardBlocks``; beside another name they are kept as
    ``blocks`` (``StreamConfig.check``), so what is sent does not change."""
    members = {k: old.pop(k) for k in ("order_block", "order_shard") if k in old}
    for k in members:
        deprecated(f"{who}({k}=...)", f"order=ringfeed.ShardBlocks({k[len('order_') :]}=...)", stacklevel + 1)
    if not members:
        return order, None
    if isinstance(order, ShardBlocks):
        refuse_both(who, members, "order=ringfeed.ShardBlocks(...)")
    blocks = ShardBlocks(block=members.get("order_block"), shard=members.get("order_shard"))
    return (blocks, None) if order == "shard_blocks" else (order, blocks)


def legacy_gpu_decode(who: str, old: dict[str, Any], gpu_decode: Any, stacklevel: int) -> GPUDecode:
    """``gpu_decode`` as a ``GPUDecode``, with the deprecated ``gpu_decode_bytes`` in ``old``."""
    if "gpu_decode_bytes" in old:
        n = old.pop("gpu_decode_bytes")
        deprecated(
            f"{who}(gpu_decode_bytes=...)", "gpu_decode=ringfeed.GPUDecode(bytes_per_sample=...)", stacklevel + 1
        )
        if isinstance(gpu_decode, GPUDecode):
            refuse_both(who, "gpu_decode_bytes=", "gpu_decode=ringfeed.GPUDecode(...)")
        return GPUDecode(share=gpu_decode, bytes_per_sample=n)
    return gpu_decode if isinstance(gpu_decode, GPUDecode) else GPUDecode(share=gpu_decode)


def no_other_keywords(who: str, old: Mapping[str, Any]) -> None:
    """What Python says of an unknown keyword, for the ones left after the deprecated ones."""
    if old:
        raise TypeError(f"{who}() got an unexpected keyword argument {next(iter(old))!r}")


@dataclass(frozen=True)
class StreamConfig:
    """The settings of one stream, whatever its sample kind (see ``Loader``'s arguments)."""

    #: What ``open.dataset`` carries (``dataset_path``).
    path: str
    batch_size: int
    shuffle: bool
    seed: int
    drop_last: bool
    rank: int
    world_size: int
    slots: int
    #: CPU batches that stay valid, ``1 ..= slots``.
    hold: int
    timeout: float | None
    socket_path: str
    #: Start a sidecar at ``socket_path`` when nothing listens there.
    spawn: bool
    spawn_timeout: float
    autotune: bool
    threads: int | None
    prefetch: int | None
    log_every: int | None
    reconnect: int
    reconnect_timeout: float
    on_opening: Callable[[int, float], None] | None
    #: ``"cpu"`` or a CUDA ``torch.device`` (``resolve_device``).
    device: Any
    #: The order asked for (``"auto"`` sends none) and its members; token streams keep the defaults.
    order: str = "auto"
    order_block: int | None = None
    order_shard: int | None = None

    @property
    def cuda(self) -> bool:
        """Whether batches are copied to a CUDA device."""
        return self.device != "cpu" and self.device.type == "cuda"

    @classmethod
    def check(
        cls,
        path: str,
        batch_size: Any,
        *,
        shuffle: Any,
        seed: Any,
        drop_last: Any,
        device: Any,
        rank: Any,
        world_size: Any,
        server: Server,
        tuning: Tuning,
        order: Any = "auto",
        blocks: ShardBlocks | None = None,
    ) -> StreamConfig:
        """Checks every setting the option objects have not (the device last: it may import
        torch), and returns them all validated. ``order`` is a name or a ``ShardBlocks``;
        ``blocks`` carries the deprecated ``order_block``/``order_shard`` beside an order name
        other than ``"shard_blocks"`` (sent as they were: ``"auto"`` may mean ``shard_blocks``)."""
        batch_size = int_in("batch_size", batch_size, 1, MAX_BATCH_SIZE)
        shuffle = boolean("shuffle", shuffle)
        seed = int_in("seed", seed, 0, MAX_SEED)
        drop_last = boolean("drop_last", drop_last)
        rank, world_size = resolve_rank(rank, world_size)
        if isinstance(order, ShardBlocks):
            order, blocks = "shard_blocks", order
        name = order
        if name not in ORDERS:
            raise ValueError(
                f"order must be one of {', '.join(map(repr, ORDERS))} or a ringfeed.ShardBlocks(...), got {order!r}"
            )
        s, t = server, tuning
        socket_path = os.fspath(s.socket) if s.socket is not None else default_socket_path()
        return cls(
            path, batch_size, shuffle, seed, drop_last, rank, world_size, t.slots, t.hold, s.timeout, socket_path,
            s.socket is None if s.spawn is None else s.spawn, s.spawn_timeout, t.autotune, t.threads, t.prefetch,
            t.log_every, s.reconnect, s.reconnect_timeout, s.on_opening, resolve_device(device), name,
            blocks.block if blocks else None, blocks.shard if blocks else None,
        )  # fmt: skip


def dataset_path(path: str | os.PathLike[str]) -> str:
    """What ``open.dataset`` carries: a local path made absolute, or a remote URL unchanged.

    Absolute without resolving symlinks: what the user named is sent. A remote dataset
    (``s3://bucket/prefix``, protocol 1.3 for images, 1.7 for tokens; 1.9: ``gs://bucket/prefix``,
    ``az://container/prefix``) is fetched by the server with its own credentials
    (docs/remote.md); its URL is checked here as the server checks it (a bucket, no ``.`` or
    ``..`` in the prefix), so a malformed one is a ``ValueError`` naming it rather than a path
    folded into the working directory.
    """
    p = os.fspath(path)
    scheme = next((s for s in REMOTE_SCHEMES if isinstance(p, str) and p.startswith(s[:3])), None)
    if scheme is not None and isinstance(p, str):
        bucket, _, prefix = p[len(scheme) :].partition("/")
        word = "container" if scheme == "az://" else "bucket"
        if not p.startswith(scheme):
            why = f"expected {scheme}{word}/prefix (a pathlib.Path collapses the //: pass the URL as a str)"
        elif not bucket:
            why = f"it names no {word} (expected {scheme}{word}/prefix)"
        elif any(c in (".", "..") for c in prefix.strip("/").split("/")):
            why = "`.` and `..` are not allowed in the prefix"
        else:
            return p
        raise ValueError(f"path {p!r} is not a usable dataset URL: {why}")
    return os.path.abspath(p)  # noqa: PTH100


def int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in {lo}..={hi}, got {value!r}")
    return int(value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"the environment variable {name}={raw!r} is not an integer") from None


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)`` from the arguments, else torchrun's ``RANK``/``WORLD_SIZE``, else ``(0, 1)``."""
    if rank is None:
        rank = env_int("RANK")
    if world_size is None:
        world_size = env_int("WORLD_SIZE")
    world_size = 1 if world_size is None else world_size
    rank = 0 if rank is None else rank
    world_size = int_in("world_size", world_size, 1, MAX_SEED)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in 0..{world_size} (world_size={world_size}), got {rank!r}")
    return rank, world_size


def resolve_device(device: Any) -> Any:
    """``"cpu"`` stays a string (no torch needed); anything else becomes a ``torch.device``.

    ``"cuda"`` without an index is ``cuda:$LOCAL_RANK`` under torchrun, else the current device.
    """
    if device == "cpu":
        return "cpu"
    try:
        import torch
    except ImportError:
        raise ValueError(f"device={device!r} needs torch, which is not installed") from None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or a torch.device, got {device!r}") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(f"device must be the CPU or a CUDA device, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but CUDA is not available (torch.cuda.is_available() is False)")
    if dev.index is None:
        local = env_int("LOCAL_RANK")
        dev = torch.device("cuda", local if local is not None else torch.cuda.current_device())
    if not 0 <= dev.index < torch.cuda.device_count():
        raise ValueError(f"device {dev} does not exist: this process sees {torch.cuda.device_count()} CUDA devices")
    return dev
