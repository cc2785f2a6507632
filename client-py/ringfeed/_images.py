"""The image sample kind: what ``Loader`` asks the server for, and how a slot becomes a batch.

``ImageOptions`` checks ``Loader``'s image arguments (the pipeline, the layout, the fields, the
source options, the batch ops, hybrid decode); ``ImageBatches`` is the stream's batch maker for
them (``_stream.BatchMaker``): the ``open`` members (``pipeline``, or a 1.1 server's
``transform``), the ring fields (each view's images and erasing boxes, ``label``, the extras),
and the batch: the slot's views, then the batch ops (``_batch.BatchOps``: normalisation, erasing,
MixUp/CutMix), on the GPU after the copy in CUDA mode.

Hybrid decode (docs/hybrid-decode.md): the server leaves a share of each batch encoded, with a
``gpu_job`` record per sample; ``gpu.hybrid.Finisher`` decodes and finishes those samples into
the batch's image tensor before the batch ops. While one batch is handed out, the next ones the
server has ready are taken ahead and their GPU decodes started in the finisher's threads, so they
run during the training step (the hardware decoder's call blocks its thread for the whole decode).
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import ProtocolError, RingfeedError, ServerError
from ._options import LMDB, GPUDecode, Meta, Parquet, StreamConfig, Targets, Text, WebDataset, boolean
from ._stream import BatchMaker, Stream
from ._transforms import AspectBuckets, Views, as_views
from .wire.ring import Segment

__all__ = ["FIELDS", "ImageBatches", "ImageOptions"]

log = logging.getLogger("ringfeed")

#: Fields a stream carries besides its views' images and erasing boxes (ring.md, "Fields a stream
#: carries"): ``label`` always, the others on request; each one's dtype and per-sample shape.
FIELDS: dict[str, tuple[str, tuple[int, ...]]] = {
    "label": ("int64", ()),
    "index": ("int64", ()),
    "crop": ("int32", (5,)),
    # 1.10: an aspect-bucketed stream's conditioning (control.md, "Aspect-ratio buckets (1.10)").
    "crop_top_left": ("int32", (2,)),
    "original_size": ("int32", (2,)),
}
#: The fields every aspect-bucketed stream carries.
BUCKET_FIELDS = ("crop_top_left", "original_size")
#: The batch ops run on the client anyway. (The per-image ops hybrid decode finishes on the GPU
#: are ``gpu.ops.GEOMETRIC``.)
_BATCH_OPS = frozenset({"normalize", "random_erasing"})


@dataclass(frozen=True)
class ImageOptions:
    """``Loader``'s image arguments, checked (see ``Loader`` for each)."""

    transform: Any
    #: The pipeline's views; ``None`` for a protocol 1.1 ``transform`` dict (then ``legacy``).
    views: Views | None
    legacy: dict[str, Any] | None
    layout: str
    on_error: str
    #: Every field the ring must carry (``check_fields``).
    fields: tuple[str, ...]
    check_crc: bool
    lmdb: dict[str, Any] | None
    webdataset: dict[str, Any] | None
    #: The batch ops, or ``None`` when there are none.
    post: Any
    #: Hybrid decode: the pinned share (a float), ``None`` for the tuner's, or off (``False``),
    #: and why it is off.
    gpu_share: float | bool | None
    gpu_backend: str | None
    gpu_decode_reason: str | None
    gpu_bytes: int | None
    #: 1.9: the text and metadata fields (control.md, "Sample fields (1.9)").
    text: tuple[Text, ...] = ()
    meta: tuple[Meta, ...] = ()
    #: 1.9: ``open.parquet`` (control.md, "Parquet datasets (1.9)"), for a ``Parquet`` source.
    parquet: dict[str, Any] | None = None
    #: 1.10: detection and segmentation targets (control.md, "Detection and segmentation targets (1.10)").
    targets: Targets | None = None
    #: 1.11: ask the server for the samples it decodes as pixels, finished here (control.md,
    #: "Decoded pixels (1.11)").
    gpu_pixels: bool = False

    @classmethod
    def check(cls, cfg: StreamConfig, transform: Any, **kw: Any) -> ImageOptions:
        """Checks the image arguments (``kw``: ``Loader``'s keywords of them, the source as an
        ``LMDB``, a ``WebDataset``, a ``Parquet`` or ``None``, hybrid decode as a ``GPUDecode``) against ``cfg``."""
        views, legacy = _check_transform(transform)
        layout, on_error = kw["layout"], kw["on_error"]
        if layout not in ("NHWC", "NCHW"):
            raise ValueError(f"layout must be 'NHWC' or 'NCHW', got {layout!r}")
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        fields = check_fields(kw["fields"], views)
        text = _as_tuple("text", kw.get("text"), Text)
        meta = _as_tuple("meta", kw.get("meta"), Meta)
        fields = _sample_fields(fields, views, text, meta)
        targets = kw.get("targets")
        fields = _target_fields(fields, views, targets)
        check_crc = boolean("check_crc", kw["check_crc"])
        source = kw["source"]
        lmdb = source.options() if isinstance(source, LMDB) else None
        webdataset = source.options() if isinstance(source, WebDataset) else None
        parquet = source.options() if isinstance(source, Parquet) else None
        post = _batch_ops(cfg, views, legacy, layout, kw["normalize"], kw["dtype"], kw["batch_transform"])
        gpu: GPUDecode = kw["gpu_decode"]
        share, backend, why = _gpu_plan(gpu.share, kw["_gpu_backend"], cfg.device, views, cfg.autotune)
        return cls(
            transform, views, legacy, layout, on_error, fields, check_crc, lmdb, webdataset, post,
            share, backend, why, gpu.bytes_per_sample, text, meta, parquet, targets,
            share is not False and gpu.use_pixels(),
        )  # fmt: skip


class ImageBatches(BatchMaker):
    """The image kind's batch maker: ``open``'s image members, the fields, the batch ops, and
    hybrid decode's finishing and look-ahead."""

    def __init__(self, opts: ImageOptions, path: str) -> None:
        self.opts = opts
        self.path = path
        #: Hybrid decode's share and why it is off: the options', until a server too old for it
        #: turns it off (``open_members``).
        self.gpu_share = opts.gpu_share
        self.gpu_decode_reason = opts.gpu_decode_reason
        #: Hybrid decode's ``gpu.hybrid.Finisher`` (set once the ring is mapped), else ``None``.
        self.finisher: Any = None
        #: Batches taken from the server while the last one was handed out, whose GPU decode
        #: already runs in the finisher's threads: ``(slot, header, pending decode)``.
        self.ahead: collections.deque[tuple[int, Any, Any]] = collections.deque()

    # -- open, fields ---------------------------------------------------------------------------

    def open_members(self, cfg: StreamConfig, server_protocol: tuple[int, int]) -> dict[str, Any]:
        """The image stream's members of ``open`` (control.md, "open")."""
        o = self.opts
        msg: dict[str, Any] = {
            **self._pipeline_member(server_protocol),
            "layout": o.layout,
            "on_error": o.on_error,
            "fields": [f for f in o.fields if f in ("image", "label", "index", "crop")],
            "check_crc": o.check_crc,
        }
        if o.lmdb is not None:
            msg["lmdb"] = o.lmdb
        if self.buckets is not None and server_protocol < (1, 10):
            # control.md, 1.10: an older server would refuse the op; say what to upgrade.
            major, minor = server_protocol
            raise RingfeedError(
                f"the server speaks protocol {major}.{minor}; AspectBuckets needs a ringfeed server with protocol "
                f"1.10 (upgrade the server, or set RINGFEED_BIN to a newer binary)"
            )
        if self.gpu_share is not False:
            self._gpu_for_server(server_protocol)
        if self.gpu_share is not False:
            gpu: dict[str, Any] = {"share": self.gpu_share}
            if o.gpu_bytes is not None:
                gpu["bytes_per_sample"] = o.gpu_bytes
            if o.gpu_pixels and server_protocol >= (1, 11):
                # control.md, 1.11: an older server would ignore it; then it finishes its samples.
                gpu["pixels"] = True
            msg["gpu_decode"] = gpu
        msg.update(_order_members(cfg, o.webdataset, server_protocol))
        if o.parquet is not None:
            # control.md, 1.9: a 1.8 server serves no Parquet and ignores `parquet`.
            _need(server_protocol, (1, 9), "Parquet datasets need a")
            msg["parquet"] = o.parquet
        if o.text or o.meta:
            # control.md, 1.9: a 1.8 server would ignore `text` and `meta`.
            _need(server_protocol, (1, 9), "text and metadata fields need a")
            if o.text:
                msg["text"] = [t.request() for t in o.text]
            if o.meta:
                msg["meta"] = [r for m in o.meta for r in m.requests()]
        if o.targets is not None:
            # control.md, 1.10: a 1.9 server ignores `targets`; the batch would have none.
            _need(server_protocol, (1, 10), "detection and segmentation targets need a")
            (view,) = o.views.views.values()  # type: ignore[union-attr]
            msg["targets"] = o.targets.request(view.transform.sanitize)
        return msg

    def _pipeline_member(self, server_protocol: tuple[int, int]) -> dict[str, Any]:
        """``pipeline`` for a 1.2 server; ``transform`` for a 1.1 one, when the pipeline is one of its three."""
        o = self.opts
        if o.views is None:
            return {"transform": dict(o.legacy)}  # type: ignore[arg-type]
        if server_protocol >= (1, 2):
            return {"pipeline": o.views.to_json()}
        legacy = o.views.legacy()
        if legacy is None:
            raise RingfeedError(
                f"the server speaks protocol {server_protocol[0]}.{server_protocol[1]}, which runs only "
                f"RandomResizedCrop [+ RandomHorizontalFlip], Resize((h, w)) or Resize(s) + CenterCrop; this pipeline "
                f"needs a ringfeed server with protocol 1.2 (upgrade the server, or set RINGFEED_BIN to a newer binary)"
            )
        return {"transform": legacy}

    def ring_fields(self) -> tuple[str, ...]:
        return self.opts.fields + (BUCKET_FIELDS if self.buckets is not None else ())

    @property
    def buckets(self) -> AspectBuckets | None:
        """1.10: the pipeline's ``AspectBuckets`` op, or ``None``."""
        return _buckets_of(self.opts.views)

    def field_spec(self, name: str) -> tuple[str, tuple[int | None, ...]]:
        o = self.opts
        if name in FIELDS:
            return FIELDS[name]
        if o.targets is not None and o.views is not None:
            (view,) = o.views.views.values()
            spec = o.targets.ring_fields(view.size).get(name)
            if spec is not None:
                return spec
        for f in (*o.text, *o.meta):
            spec = f.ring_fields().get(name)
            if spec is not None:
                return spec
        if o.views is None:
            size = tuple(o.legacy.get("size", ()))  # type: ignore[union-attr]
            h, w = size if len(size) == 2 else (None, None)
            return "uint8", ((h, w, 3) if o.layout == "NHWC" else (3, h, w))
        base, erase = (name[: -len("_erase")], True) if name.endswith("_erase") else (name, False)
        v = o.views.views[base]
        lead: tuple[int, ...] = (v.count,) if v.count > 1 else ()
        if erase:
            return "int32", (*lead, len(v.transform.erasing), 4)
        h, w = v.size
        return "uint8", (*lead, *((h, w, 3) if o.layout == "NHWC" else (3, h, w)))

    def _gpu_for_server(self, server_protocol: tuple[int, int]) -> None:
        """Leaves hybrid decode off (saying why, naming the server's version) where the server is
        older than what the pipeline's GPU path needs."""
        from .gpu.ops import multi_output, needs_steps

        o = self.opts
        doc = o.views.to_json() if o.views is not None else None
        needs = [
            # control.md, 1.3: a 1.2 server does not know `gpu_decode`; decode on the CPU.
            ((1, 3), True, "hybrid decode needs 1.3"),
            # 1.8: an older server finishes only the geometry on the GPU.
            ((1, 8), doc is not None and needs_steps(doc), "GPU decode of per-image ops needs 1.8"),
            # 1.10: an older server finishes one view of one image on the GPU.
            (
                (1, 10),
                doc is not None and multi_output(doc),
                "GPU decode of several views or images per sample needs 1.10",
            ),
        ]
        for version, needed, why in needs:
            if needed and server_protocol < version:
                major, minor = server_protocol
                self.gpu_share = False
                self.gpu_decode_reason = f"the server speaks protocol {major}.{minor}; {why}"
                log.warning("ringfeed: GPU decode is off: %s", self.gpu_decode_reason)
                return

    def attach(self, segment: Segment, cfg: StreamConfig) -> Any:
        """Starts hybrid decode's finisher for this ring, when the stream asked for hybrid decode."""
        o = self.opts
        if self.gpu_share is False:
            return None
        from .gpu.hybrid import Finisher

        for name in ("gpu_job", "gpu_bytes"):
            if name not in segment.fields:
                raise ProtocolError(f"the ring has no field {name!r}, which hybrid decode needs")
        assert o.views is not None
        assert o.gpu_backend is not None
        views = list(o.views.views.values())
        device = cfg.device if cfg.cuda else _cpu()
        # 1.10: every view's images are finished from each GPU sample's one decode (a bucketed
        # batch's at its bucket's size, read from the batch tensor).
        self.finisher = Finisher(
            device, o.gpu_backend, o.layout, views[0].size, segment.slot_count, counts=[v.count for v in views]
        )
        return self.finisher

    # -- batches --------------------------------------------------------------------------------

    def make(self, st: Stream, slot: int, header: Any, pending: Any = None) -> Any:
        views = st.ring_views(slot, header.count)
        if self.buckets is not None:
            # 1.10: the batch's images are packed at its bucket's size (ring.md, "SlotHeader").
            segment = st.res.segment
            assert segment is not None
            assert self.opts.views is not None
            (name,) = self.opts.views.views
            h, w = header.height, header.width
            if not (h and w):
                st.res.release(slot)
                raise ProtocolError(
                    f"batch {header.batch} of an aspect-bucketed stream has no image size in its header"
                )
            shape = (h, w, 3) if self.opts.layout == "NHWC" else (3, h, w)
            views[name] = segment.packed_view(slot, name, header.count, shape)
        texts = self._sample_fields(views)
        post = self.opts.post
        if post is not None:
            try:
                post.check(views)
            except ValueError:
                st.res.release(slot)
                raise
        finish = self._finish(st, slot, header, pending) if self.finisher is not None else None
        if finish is not None and st.res.cuda is None:
            # CPU mode (the tests' host backend): the GPU samples are finished into the held slot
            # itself (ring.md rule 7), then the batch goes on as any other.
            try:
                views = finish(dict(views))
            except _SampleDecodeError:
                st.res.release(slot)
                raise
            st.meter.totals["skipped"] += finish.skipped
        if st.res.cuda is not None:
            out = self._to_device(st, views, slot, header, finish)
        elif post is not None:
            # The batch ops make new tensors; copy whatever they left in the ring (a field they did
            # not touch, or a view a user's batch_transform cut), and hand the slot back now.
            out = post(dict(views), header.epoch, header.batch)
            segment = st.res.segment
            assert segment is not None
            out = {k: (v.clone() if segment.holds(v) else v) for k, v in out.items()}
            st.res.release(slot)
        else:
            out = st.hand_out(slot, views)
        st.count_delivered(header)
        if texts and finish is not None and finish.keep is not None:
            # Hybrid decode left samples out (on_error="skip"): so do their texts.
            texts = {k: [v[p] for p in finish.keep] for k, v in texts.items()}
        out.update(texts)
        return self.shape(out)

    def _sample_fields(self, views: dict[str, Any]) -> dict[str, list[str]]:
        """1.9: takes the raw text fields out of ``views`` as lists of ``str`` (they stay on the
        host), and views the boolean fields (masks, ``bool`` metadata: 0/1 bytes) as ``torch.bool``
        without copying."""
        o = self.opts
        texts: dict[str, list[str]] = {}
        if not (o.text or o.meta):
            return texts
        for t in o.text:
            if t.tokenizer is None:
                data = _host(views.pop(t.name))
                lens = _host(views.pop(f"{t.name}_len"))
                texts[t.name] = [bytes(data[i, : int(n)]).decode("utf-8") for i, n in enumerate(lens)]
            else:
                views[f"{t.name}_mask"] = _as_bool(views[f"{t.name}_mask"])
        for m in o.meta:
            for name, (dtype, _) in m.ring_fields().items():
                if dtype == "uint8":  # a bool field
                    views[name] = _as_bool(views[name])
        return texts

    def _to_device(self, st: Stream, views: dict[str, Any], slot: int, header: Any, finish: _Finish | None) -> Any:
        """CUDA mode: the copy, then the GPU samples' finishing, then the batch ops, on the side stream."""
        post = self.opts.post
        hook = None if post is None else (lambda o: post(o, header.epoch, header.batch))
        try:
            out = st.to_device(views, slot, hook, finish)
            if finish is not None and self.finisher is not None:
                # Finishing the GPU samples is making the batch (the wait for data), not
                # back-pressure from the GPU: the tuner must not read it as the model's step.
                st.meter.gpu_s = max(st.meter.gpu_s - self.finisher.last_call_ns / 1e9, 0.0)
        except _SampleDecodeError:
            st.res.cuda.stream.synchronize()
            st.res.release(slot)
            raise
        if finish is not None:
            st.meter.totals["skipped"] += finish.skipped
        return out

    def shape(self, out: dict[str, Any]) -> Any:
        """What the iterator yields for a batch's fields: ``(images, labels)``, or a dict."""
        for k in [k for k in out if k.endswith("_erase")]:
            del out[k]
        views = self.opts.views
        if self.opts.text or self.opts.meta or self.opts.targets is not None:
            return out
        if views is None or (list(views.views) == ["image"] and set(out) == {"image", "label"}):
            return out["image"], out["label"]
        return out

    # -- hybrid decode --------------------------------------------------------------------------

    def _gpu_inputs(self, st: Stream, slot: int, header: Any) -> tuple[Any, Any]:
        """The slot's ``gpu_job`` records and ``gpu_bytes`` arena, as numpy views of the ring."""
        segment = st.res.segment
        assert segment is not None
        jobs = segment.view(slot, "gpu_job")[: header.count]
        arena = segment.view(slot, "gpu_bytes")
        jobs_np = jobs.numpy() if hasattr(jobs, "numpy") else jobs
        arena_np = arena.numpy() if hasattr(arena, "numpy") else arena
        return jobs_np, arena_np.reshape(-1)

    def _finish(self, st: Stream, slot: int, header: Any, pending: Any = None) -> _Finish:
        """What finishes this batch's GPU samples, run where its tensors are (ring.md, ``gpu_job``)."""
        segment = st.res.segment
        assert segment is not None
        jobs, arena = self._gpu_inputs(st, slot, header)
        index = segment.view(slot, "index")[: header.count] if "index" in segment.fields else None
        ops = None
        if "gpu_ops" in segment.fields:
            # 1.8: the steps after the geometry (ring.md, "gpu_ops"), read on the host.
            v = segment.view(slot, "gpu_ops")[: header.count]
            ops = v.numpy() if hasattr(v, "numpy") else v
        return _Finish(self, jobs, arena, header, index, pending, ops)

    def take_ahead(self) -> tuple[int, Any, Any] | None:
        return self.ahead.popleft() if self.ahead else None

    def look_ahead(self, st: Stream) -> None:
        """Takes the next batches if the server has them ready, and starts their GPU decodes in the
        finisher's threads, so that they run while the training step runs. Never waits."""
        f = self.finisher
        if f is None or not f.background or st.looking_ahead_failed:
            return
        segment = st.res.segment
        assert segment is not None
        # As many ahead as the finisher has decode threads, two at least (decoding one while the
        # other is finished), leaving the server two slots.
        most = max(0, min(max(2, f.decode_threads), segment.slot_count - 2))
        copy_stream = None if st.res.cuda is None else st.res.cuda.stream
        while len(self.ahead) < most:
            taken = st.poll_ready()
            if taken is None:
                return
            slot, header = taken
            try:
                jobs, arena = self._gpu_inputs(st, slot, header)
                self.ahead.append((slot, header, f.submit(jobs, arena, copy_stream)))
            except RingfeedError as e:
                # Raised where the loop would have met it: at the next batch, after this one.
                st.defer_error(e)
                return

    def drop_ahead(self, st: Stream) -> None:
        """Releases the batches taken ahead (once their decodes have stopped reading their slots)."""
        while self.ahead:
            slot, _, pending = self.ahead.popleft()
            with contextlib.suppress(Exception):
                pending.result()
            if slot in st.res.held:
                with contextlib.suppress(RingfeedError, OSError):
                    st.res.release(slot)

    def forget_ahead(self) -> None:
        self.ahead.clear()

    def gpu_counts(self) -> tuple[int, int, int, int] | None:
        return self.finisher.take_counts() if self.finisher is not None else None

    def add_stats(self, out: dict[str, Any]) -> None:
        if self.finisher is not None:
            samples, ns, fallbacks, waited = self.finisher.totals
            out["gpu_samples"], out["gpu_decode_s"], out["gpu_fallbacks"] = samples, ns / 1e9, fallbacks
            out["gpu_decode_wait_s"] = waited / 1e9
            out["gpu_steps_path"] = self.finisher.steps_path
            out["gpu_pixel_samples"] = self.finisher.pixel_samples


class _SampleDecodeError(ServerError):
    """Samples of a batch that neither the GPU nor the host could decode, under ``on_error="raise"``."""


class _Finish:
    """Finishes one batch's GPU samples (hybrid decode) into its image tensor, then applies ``on_error``."""

    def __init__(
        self, kind: ImageBatches, jobs: Any, arena: Any, header: Any, index: Any, pending: Any = None, ops: Any = None
    ) -> None:
        self.kind, self.jobs, self.arena, self.header, self.index = kind, jobs, arena, header, index
        self.pending, self.ops = pending, ops
        self.skipped = 0
        #: The positions kept when samples were left out (``on_error="skip"``), else ``None``.
        self.keep: list[int] | None = None

    def __call__(self, out: dict[str, Any], stream: Any = None) -> dict[str, Any]:
        from .gpu.hybrid import DecodeError

        kind = self.kind
        assert kind.opts.views is not None
        images = [out[name] for name in kind.opts.views.views]
        try:
            kind.finisher(self.jobs, self.arena, images, stream, self.pending, self.ops)
            return out
        except DecodeError as e:
            failed = e.failed
        where = f"batch {self.header.batch} of epoch {self.header.epoch} of {kind.path}"
        named = [
            f"sample #{int(self.index[p])}" if self.index is not None else f"position {p} of {where}" for p, _ in failed
        ]
        if kind.opts.on_error == "raise":
            detail = "; ".join(f"{n}: {r}" for n, (_, r) in zip(named, failed, strict=True))
            raise _SampleDecodeError(
                "sample",
                f"{len(failed)} sample(s) of {where} do not decode (hybrid decode): {detail}; "
                f"pass on_error='skip' to leave such samples out",
                sample=int(self.index[failed[0][0]]) if self.index is not None else None,
                fatal=False,
            )
        import torch

        keep = [p for p in range(next(iter(out.values())).shape[0]) if p not in {p for p, _ in failed}]
        self.skipped = len(failed)
        self.keep = keep
        rows = torch.as_tensor(keep, dtype=torch.long)
        return {k: v.index_select(0, rows.to(v.device)) for k, v in out.items()}


# -- checking the arguments ---------------------------------------------------------------------


def _check_transform(transform: Any) -> tuple[Views | None, dict[str, Any] | None]:
    """The loader's views, or (for a protocol 1.1 ``transform`` object given as a dict) that dict."""
    if isinstance(transform, Mapping) and isinstance(transform.get("kind"), str):
        return None, dict(transform)
    return as_views(transform), None


def _legacy_ops(legacy: dict[str, Any] | None) -> Any:
    """Stand-in ops for a 1.1 ``transform`` dict (only its output size matters client-side)."""
    from ._transforms import CenterCrop

    assert legacy is not None
    size = legacy.get("size", [1, 1])
    return CenterCrop(tuple(size) if isinstance(size, list) and len(size) == 2 else 1)


def check_fields(fields: Sequence[str] | None, views: Views | None) -> tuple[str, ...]:
    """Every field the ring must carry: each view's images (and erasing boxes), ``label``, the extras."""
    if views is None:
        out = ["image", "label"]
    else:
        out = []
        for name, v in views.views.items():
            out.append(name)
            if v.transform.erasing:
                out.append(f"{name}_erase")
        out.append("label")
    if fields is None:
        return tuple(out)
    if isinstance(fields, str):
        fields = [fields]
    for name in fields:
        if name in out:
            continue
        if name not in FIELDS:
            known = ", ".join([*(views.views if views else ["image"]), *FIELDS])
            raise ValueError(f"fields: unknown field {name!r}; the server delivers {known}")
        out.append(name)
    return tuple(out)


def _host(a: Any) -> Any:
    """A ring view as a numpy array (a torch tensor's numpy view; numpy arrays as they are)."""
    return a.numpy() if hasattr(a, "numpy") else a


def _as_bool(a: Any) -> Any:
    """A 0/1 uint8 ring view as booleans, without a copy (torch.bool, or numpy's bool without torch)."""
    if hasattr(a, "numpy"):
        import torch

        return a.view(torch.bool)
    return a.view(bool)


def _as_tuple(name: str, value: Any, cls: type) -> tuple[Any, ...]:
    """``Loader(text=...)``/``meta=``: one object, a list of them, or ``None``."""
    if value is None:
        return ()
    items = [value] if isinstance(value, cls) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, cls) for i in items):
        raise ValueError(f"{name} must be a ringfeed.{cls.__name__} or a list of them, got {value!r}")
    return tuple(items)


def _sample_fields(
    fields: tuple[str, ...], views: Views | None, text: tuple[Text, ...], meta: tuple[Meta, ...]
) -> tuple[str, ...]:
    """``fields`` and the ring fields of the text and metadata fields (1.9), whose names must not
    collide with a view, ``label``, ``index``, ``crop`` or each other."""
    if not text and not meta:
        return fields
    reserved = {*(views.views if views else ["image"]), *FIELDS}
    out = list(fields)
    names: set[str] = set()
    for f in (*text, *meta):
        own = [f.name] if isinstance(f, Text) else list(f.ring_fields())
        for name in own:
            if name in reserved or name in names:
                raise ValueError(
                    f"{type(f).__name__}: the field name {name!r} is taken (by a view, label, index, crop or a field)"
                )
            names.add(name)
        for ring in f.ring_fields():
            if ring in out or ring in reserved:
                raise ValueError(f"{type(f).__name__}: its ring field {ring!r} is taken by another field")
            out.append(ring)
    return tuple(out)


def _need(server_protocol: tuple[int, int], version: tuple[int, int], what: str) -> None:
    """Refuses a server older than ``version`` for ``what`` (``"... need a"``), naming both versions."""
    if server_protocol < version:
        major, minor = server_protocol
        raise RingfeedError(
            f"the server speaks protocol {major}.{minor}; {what} ringfeed server with protocol "
            f"{version[0]}.{version[1]} (upgrade the server, or set RINGFEED_BIN to a newer binary)"
        )


def _target_fields(fields: tuple[str, ...], views: Views | None, targets: Any) -> tuple[str, ...]:
    """``fields`` and the ring fields of ``targets`` (1.10), which go with a pipeline of one view of
    one image, and whose names must not collide with the stream's other fields."""
    if targets is None:
        return fields
    if not isinstance(targets, Targets):
        raise TypeError(f"targets must be a ringfeed.Targets, got {type(targets).__name__}")
    if views is None or len(views.views) != 1 or next(iter(views.views.values())).count != 1:
        raise ValueError(
            "targets go with a pipeline of one view of one image (a list of ops or one View); "
            "multi-view and count > 1 pipelines carry no targets"
        )
    (view,) = views.views.values()
    targets.request(view.transform.sanitize)  # a min_size/min_area that contradicts the pipeline's
    out = list(fields)
    for name in targets.ring_fields(view.size):
        if name in out or name in views.views:
            raise ValueError(f"Targets: its ring field {name!r} is taken by a view or another field")
        out.append(name)
    return tuple(out)


def _batch_ops(
    cfg: StreamConfig,
    views: Views | None,
    legacy: dict[str, Any] | None,
    layout: str,
    normalize: Any,
    dtype: Any,
    batch_transform: Any,
) -> Any:
    """The batch ops (``_batch.BatchOps``) the pipeline and these arguments ask for, or ``None``."""
    if normalize is not None:
        try:
            mean, std = normalize
        except (TypeError, ValueError):
            raise ValueError(f"normalize must be a (mean, std) pair, got {normalize!r}") from None
        normalize = (mean, std)
    all_views = views if views is not None else as_views(_legacy_ops(legacy))
    needs_post = (
        normalize is not None
        or dtype is not None
        or batch_transform is not None
        or any(v.transform.normalize or v.transform.erasing for v in all_views.views.values())
    )
    if not needs_post:
        return None
    from ._batch import BatchOps

    post = BatchOps(all_views, layout, normalize, dtype, batch_transform, cfg.seed)
    return post if post.active else None


def _order_members(
    cfg: StreamConfig, webdataset: dict[str, Any] | None, server_protocol: tuple[int, int]
) -> dict[str, Any]:
    """The 1.3 members (order, WebDataset options), sent only when set: a 1.2 server would ignore them."""
    members: dict[str, Any] = {}
    if cfg.order != "auto":
        members["order"] = cfg.order
    if cfg.order_block is not None:
        members["order_block"] = cfg.order_block
    if cfg.order_shard is not None:
        members["order_shard"] = cfg.order_shard
    if webdataset is not None:
        members["webdataset"] = webdataset
    if members and server_protocol < (1, 3):
        raise RingfeedError(
            f"the server speaks protocol {server_protocol[0]}.{server_protocol[1]}; "
            f"{', '.join(sorted(members))} need a ringfeed server with protocol 1.3 "
            f"(upgrade the server, or set RINGFEED_BIN to a newer binary)"
        )
    return members


def _cpu() -> Any:
    import torch

    return torch.device("cpu")


def _gpu_plan(
    gpu_decode: Any, backend: str | None, device: Any, views: Views | None, autotune: bool
) -> tuple[float | bool | None, str | None, str | None]:
    """``(share, backend, why off)`` for ``Loader(gpu_decode=...)``: share a float (pinned), ``None``
    (the tuner's), or ``False`` (off, with the reason)."""
    if gpu_decode is False:
        return False, None, "gpu_decode=False"
    if gpu_decode == "auto" or gpu_decode is True:
        pinned: float | None = None
    elif isinstance(gpu_decode, (int, float)) and not isinstance(gpu_decode, bool) and 0.0 <= gpu_decode <= 1.0:
        pinned = float(gpu_decode)
    else:
        raise ValueError(f"gpu_decode must be 'auto', True, False or a share in 0..1, got {gpu_decode!r}")
    why = _gpu_pipeline_problem(views)
    if backend is None:
        from .gpu.hybrid import backend_for

        backend, reason = backend_for(device)
        if backend is None:
            why = why or reason
    if why is not None:
        if pinned is not None or gpu_decode is True:
            raise ValueError(f"gpu_decode={gpu_decode!r} cannot work: {why}")
        on_gpu = getattr(device, "type", "cpu") == "cuda"
        (log.warning if on_gpu else log.info)("ringfeed: GPU decode is off: %s", why)
        return False, None, why
    if pinned is None and not autotune:
        # Without the autotuner nobody would set the share: "auto" then means off.
        return False, None, "autotune=False and gpu_decode='auto' (pin a share, e.g. gpu_decode=0.5)"
    return pinned, backend, None


def _buckets_of(views: Views | None) -> AspectBuckets | None:
    """The pipeline's ``AspectBuckets`` (1.10: the first op of its one view), or ``None``."""
    if views is None:
        return None
    for v in views.views.values():
        ops = v.transform.ops
        if ops and isinstance(ops[0], AspectBuckets):
            return ops[0]
    return None


def _gpu_pipeline_problem(views: Views | None) -> str | None:
    """Why hybrid decode cannot finish this pipeline on the GPU, or ``None``."""
    if views is None:
        return "the 1.1 transform dict form is decoded on the CPU"
    return gpu_pipeline_doc_problem(views.to_json())


def gpu_pipeline_doc_problem(doc: dict[str, Any], per_image: bool = True, views: bool = True) -> str | None:
    """The same for a pipeline as the wire carries it (control.md, ``open.pipeline``): the
    server's rule (``ops::gpu::finishable``), whose verdicts ``proto/vectors/control/hybrid.json``
    pins for both sides; ``per_image``: a 1.8 server's (per-image ops after the geometry);
    ``views``: a 1.10 server's (several views, and images per view)."""
    from .gpu.ops import pipeline_problem  # numpy only: no torch here

    return pipeline_problem(doc, per_image, views)
