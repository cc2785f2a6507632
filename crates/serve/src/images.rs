//! Opening an image stream: its pipeline and layout, its dataset (a packed dataset, an LMDB, an
//! image folder or manifest, WebDataset tars, or any of them on object storage) and its ring
//! fields. Folders, manifests and tars are listed by [`crate::opening`], with
//! `opening` progress to a client that waits.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::unix::OwnedWriteHalf;

use ringfeed_format::control::message::GpuDecodeRequest;
use ringfeed_format::control::{ErrorCode, OpenRequest, ServerMessage, TransformRequest};
use ringfeed_ops::{Layout, Pipeline, Transform};
use ringfeed_order::blocks;
use ringfeed_source::listing::InputKind;

use crate::fields::SampleFields;
use crate::pool::ViewFields;
use crate::segment::Segment;
use crate::shared::{KindParts, OpenError, Prepared, Shared, admit};
use crate::targets::StreamTargets;
use crate::wire::send;
use ringfeed_format::ring::{DType, FieldSpec};
use ringfeed_source::files::ServedKind;
use ringfeed_source::lmdb::{LabelSource, LmdbOptions};
use ringfeed_source::{PackedSource, Source};

/// The image kind: the pipeline, the layout, the dataset (`open_source`) and the image fields.
pub(crate) async fn prepare_images(
    open: &OpenRequest,
    shared: &Arc<Shared>,
    path: &Path,
    minor: u16,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Prepared, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let mut progress = progress;
    let layout = match open.layout() {
        "NHWC" => Layout::Nhwc,
        "NCHW" => Layout::Nchw,
        other => return Err(bad(format!("open.layout {other:?} must be \"NHWC\" or \"NCHW\""))),
    };
    let skip_errors = match open.on_error() {
        "raise" => false,
        "skip" => true,
        other => return Err(bad(format!("open.on_error {other:?} must be \"raise\" or \"skip\""))),
    };
    let pipeline = pipeline_from(open)?;
    let fields = open.fields.clone().unwrap_or_default();
    for f in &fields {
        if !["image", "label", "index", "crop"].contains(&f.as_str()) && !pipeline.views.iter().any(|v| v.name == *f) {
            return Err(bad(format!(
                "open.fields: unknown field {f:?} (known: the views, label, index, crop)"
            )));
        }
    }
    let source = if ringfeed_format::control::names_object_storage(&open.dataset) {
        open_remote(shared, open, progress.as_deref_mut()).await?
    } else {
        open_source(shared, path, open, progress.as_deref_mut()).await?
    };
    if let Some(p) = source.listing_problems().first().filter(|_| !skip_errors) {
        return Err((
            ErrorCode::Dataset,
            format!(
                "{}: {}: {}; pass on_error=\"skip\" to serve it without them (what `ringfeed pack --on-error skip` would pack)",
                source.describe(),
                String::from_utf8_lossy(&p.key),
                p.reason
            ),
        ));
    }
    // 1.3: the shard-aware order, when asked for (or chosen automatically for this source).
    let mut order = shard_order(open, source.as_ref())?;
    // 1.10: every sample's bucket, from its image header.
    let buckets = match pipeline.views.iter().find_map(|v| v.buckets.clone()) {
        None => None,
        Some(_) if minor < 10 => {
            return Err(bad(
                "open.pipeline: aspect_buckets needs protocol 1.10 (its batches change shape); upgrade the ringfeed Python package".to_owned(),
            ));
        }
        Some(_) if pipeline.views.len() > 1 => {
            return Err(bad(
                "open.pipeline.views: aspect_buckets serves one view; drop the other views".to_owned(),
            ));
        }
        Some(_) if order.is_some() && open.order.as_deref() == Some("shard_blocks") => {
            return Err(bad(
                "open.order: aspect_buckets has its own order (every batch one bucket); pass order=\"global\" or \"auto\""
                    .to_owned(),
            ));
        }
        Some(b) => {
            // `auto` becomes the bucket order, whatever the source prefers.
            order = None;
            Some(Arc::new(
                assign_buckets(shared, &source, b, &open.dataset, skip_errors, progress).await?,
            ))
        }
    };
    let mut specs = image_fields(&pipeline, layout, &fields);
    // 1.11: the client finishes the samples the server decodes too (from their pixels).
    let pixels = minor >= 11 && open.gpu_decode.as_ref().is_some_and(|g| g.pixels);
    let gpu = match &open.gpu_decode {
        None => None,
        // 1.10: an aspect-bucketed stream's GPU samples are finished at their batch's bucket
        // (each job carries the bucket's covering resize and crop).
        Some(g) => {
            specs.extend(gpu_fields(open, g, &pipeline, minor)?);
            // A 1.10 session's `pixels` is not asked for (the member is 1.11's).
            Some(GpuDecodeRequest { pixels, ..g.clone() })
        }
    };
    // 1.9: text and metadata fields, from the source's members or columns.
    let mut taken: Vec<String> = specs.iter().map(|s| s.name.to_string()).collect();
    taken.extend(["label", "index", "crop"].map(String::from));
    taken.extend(pipeline.views.iter().map(|v| v.name.clone()));
    let sample_fields = if columns(open) {
        // A tokenizer.json is read and parsed here (megabytes for CLIP's): off the runtime.
        let (req, kind, desc, within) = (open.clone(), source.field_kind(), source.describe(), Arc::clone(shared));
        tokio::task::spawn_blocking(move || {
            let admit_tokenizer = |p: &Path| admit(&within, p).map_err(|(_, m)| m);
            SampleFields::parse(&req, kind, &desc, &taken, &admit_tokenizer)
        })
        .await
        .map_err(|e| (ErrorCode::Internal, e.to_string()))?
        .map_err(bad)?
    } else {
        None
    };
    if let Some(f) = &sample_fields {
        specs.extend(f.specs());
        if specs.len() > ringfeed_format::ring::layout::MAX_FIELDS {
            return Err(bad(format!(
                "open.text and open.meta: the stream would carry {} ring fields, more than the ring's {} (ring.md); ask for fewer fields",
                specs.len(),
                ringfeed_format::ring::layout::MAX_FIELDS
            )));
        }
    }
    // 1.10: detection and segmentation targets, from the packed dataset's targets.rft or the
    // samples' members.
    let mut taken: Vec<String> = specs.iter().map(|s| s.name.to_string()).collect();
    taken.extend(["label", "index", "crop"].map(String::from));
    taken.extend(pipeline.views.iter().map(|v| v.name.clone()));
    let targets = StreamTargets::parse(
        open.targets.as_ref(),
        source.as_ref(),
        &pipeline,
        &taken,
        open.check_crc(),
        shared.limits.max_pixels,
    )
    .map_err(bad)?;
    if targets.is_some() && buckets.is_some() {
        // A bucketed batch's size is its bucket's, and the mask field has one shape.
        return Err(bad(
            "open.targets: targets do not go with aspect_buckets yet (its batches change shape); drop one of them"
                .to_owned(),
        ));
    }
    if pipeline.needs_boxes() && !targets.as_ref().is_some_and(StreamTargets::has_boxes) {
        return Err(bad(
            "pipeline: random_iou_crop draws against the sample's boxes; give open.targets.boxes".to_owned(),
        ));
    }
    if let Some(t) = &targets {
        specs.extend(t.specs());
        if specs.len() > ringfeed_format::ring::layout::MAX_FIELDS {
            return Err(bad(format!(
                "open.targets: the stream would carry {} ring fields, more than the ring's {} (ring.md); ask for fewer fields",
                specs.len(),
                ringfeed_format::ring::layout::MAX_FIELDS
            )));
        }
    }
    let per_sample = format!("samples of {} images", pipeline.outputs());
    Ok(Prepared {
        source,
        specs,
        skip_errors,
        own_order: false,
        gpu,
        order,
        reports_order: true,
        start_threads: None,
        per_sample,
        finish: Box::new(move |segment: &Segment| finish_kind(segment, pipeline, layout, sample_fields, targets)),
        buckets,
    })
}

/// The ring's image fields: one per view (and its erase boxes), the label, and `index` and
/// `crop` where `fields` asks for them.
fn image_fields(pipeline: &Pipeline, layout: Layout, fields: &[String]) -> Vec<FieldSpec> {
    let mut specs = Vec::new();
    for v in &pipeline.views {
        let (h, w) = v.size;
        let mut shape = match layout {
            Layout::Nhwc => vec![h, w, 3],
            Layout::Nchw => vec![3, h, w],
        };
        if v.count > 1 {
            shape.insert(0, v.count);
        }
        specs.push(FieldSpec {
            name: v.name.clone().into(),
            dtype: DType::U8,
            shape,
        });
        if !v.erasing.is_empty() {
            let mut shape = vec![v.erasing.len() as u32, 4];
            if v.count > 1 {
                shape.insert(0, v.count);
            }
            specs.push(FieldSpec {
                name: format!("{}_erase", v.name).into(),
                dtype: DType::I32,
                shape,
            });
        }
    }
    specs.push(FieldSpec {
        name: "label".into(),
        dtype: DType::I64,
        shape: vec![],
    });
    if fields.iter().any(|f| f == "index") {
        specs.push(FieldSpec {
            name: "index".into(),
            dtype: DType::I64,
            shape: vec![],
        });
    }
    if fields.iter().any(|f| f == "crop") {
        specs.push(FieldSpec {
            name: "crop".into(),
            dtype: DType::I32,
            shape: vec![5],
        });
    }
    if pipeline.views.iter().any(|v| v.buckets.is_some()) {
        // 1.10: SDXL's conditioning, per sample.
        for name in ["crop_top_left", "original_size"] {
            specs.push(FieldSpec {
                name: name.into(),
                dtype: DType::I32,
                shape: vec![2],
            });
        }
    }
    specs
}

/// Hybrid decode's fields (`gpu_job`, `gpu_bytes`, and 1.8's `gpu_ops` for a view with per-image
/// ops after its geometry), once `open.gpu_decode` is checked against the pipeline (in the
/// session's protocol `1.minor`) and the ring's offsets.
fn gpu_fields(
    open: &OpenRequest,
    g: &GpuDecodeRequest,
    pipeline: &Pipeline,
    minor: u16,
) -> Result<Vec<FieldSpec>, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let steps = ringfeed_ops::gpu::finishable(pipeline, minor)
        .map_err(|e| bad(format!("open.gpu_decode: {e}; leave gpu_decode off for this pipeline")))?;
    if let Some(s) = g.share.filter(|s| !(0.0..=1.0).contains(s)) {
        return Err(bad(format!("open.gpu_decode.share {s} is outside 0..=1")));
    }
    // The encoded bytes are the source's, whatever the outputs; the default follows the largest
    // view (1.10: several views share one sample's bytes).
    let area = pipeline
        .views
        .iter()
        .map(|v| u64::from(v.size.0) * u64::from(v.size.1))
        .max()
        .unwrap_or(0);
    // 1.11: decoded pixels take more room than encoded bytes (a crop's rectangle, RGB).
    let default = if minor >= 11 && g.pixels { 9 * area } else { 3 * area };
    let per = g.bytes_per_sample.unwrap_or(default.max(65536));
    if !(4096..=64 << 20).contains(&per) {
        return Err(bad(format!(
            "open.gpu_decode.bytes_per_sample {per} is outside 4096..=67108864"
        )));
    }
    if per * u64::from(open.batch_size) > i32::MAX as u64 {
        return Err(bad(format!(
            "open.gpu_decode: {} bytes of encoded samples per batch ({per} per sample) do not fit the ring's 31-bit offsets; lower bytes_per_sample or batch_size",
            per * u64::from(open.batch_size)
        )));
    }
    // 1.10: a record (and a step table) per output where a sample has several (ring.md); one
    // output keeps the 1.3 (1.8) shapes.
    let outputs = pipeline.outputs();
    let lead = |mut shape: Vec<u32>| {
        if outputs > 1 {
            shape.insert(0, outputs);
        }
        shape
    };
    let mut fields = vec![
        FieldSpec {
            name: "gpu_job".into(),
            dtype: DType::I32,
            shape: lead(vec![ringfeed_ops::gpu::RECORD_LEN as u32]),
        },
        FieldSpec {
            name: "gpu_bytes".into(),
            dtype: DType::U8,
            shape: vec![per as u32],
        },
    ];
    if steps > 0 {
        fields.push(FieldSpec {
            name: "gpu_ops".into(),
            dtype: DType::I32,
            shape: lead(vec![steps, ringfeed_format::ring::gpu_ops::RECORD_INTS as u32]),
        });
    }
    Ok(fields)
}

/// The image kind's parts once the ring is made: each field's place in a slot.
fn finish_kind(
    segment: &Segment,
    pipeline: Pipeline,
    layout: Layout,
    fields: Option<SampleFields>,
    targets: Option<StreamTargets>,
) -> KindParts {
    let field = |n: &str| segment.layout().field(n).cloned();
    let fields = fields.map(|mut f| {
        f.bind(&field);
        Arc::new(f)
    });
    let targets = targets.map(|mut t| {
        t.bind(&field);
        Arc::new(t)
    });
    let views = pipeline
        .views
        .iter()
        .map(|v| ViewFields {
            image: field(&v.name).expect("every view has its field"),
            erase: field(&format!("{}_erase", v.name)),
        })
        .collect();
    KindParts {
        views,
        label: field("label").expect("the label field is always present"),
        index: field("index"),
        crop: field("crop"),
        gpu: field("gpu_job")
            .zip(field("gpu_bytes"))
            .map(|(job, bytes)| crate::pool::GpuFields {
                job,
                bytes,
                ops: field("gpu_ops"),
            }),
        fields,
        bucket_fields: field("crop_top_left")
            .zip(field("original_size"))
            .map(|(crop_top_left, original_size)| crate::pool::BucketFields {
                crop_top_left,
                original_size,
            }),
        targets,
        pipeline,
        layout,
        kind: crate::pool::SampleKind::Image,
    }
}

/// The stream's pipeline: the 1.2 `pipeline` member, or the 1.1 `transform` as the pipeline it
/// means (validated by `ops::Transform::validate`, which holds the bounds of control.md,
/// "Transforms").
fn pipeline_from(open: &OpenRequest) -> Result<Pipeline, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    match (&open.pipeline, &open.transform) {
        (Some(_), Some(_)) => Err(bad(
            "open: give either pipeline (1.2) or transform (1.1), not both".to_owned()
        )),
        (Some(p), None) => Pipeline::parse(p).map_err(|e| bad(e.to_string())),
        (None, Some(t)) => {
            let transform = match *t {
                TransformRequest::RandomResizedCrop {
                    size,
                    scale,
                    ratio,
                    flip,
                } => Transform::RandomResizedCrop {
                    size: (size[0], size[1]),
                    scale: (scale[0], scale[1]),
                    ratio: (ratio[0], ratio[1]),
                    flip,
                },
                TransformRequest::CenterCrop { size, resize } => Transform::CenterCrop {
                    size: (size[0], size[1]),
                    resize,
                },
                TransformRequest::Resize { size } => Transform::Resize {
                    size: (size[0], size[1]),
                },
            };
            transform.validate().map_err(|e| bad(e.to_string()))?;
            Ok(transform.to_pipeline())
        }
        (None, None) => Err(bad("open: a pipeline (1.2) or a transform (1.1) is required".to_owned())),
    }
}

/// Opens (or reuses) the dataset at `path`: a packed dataset, an LMDB, an image folder or a
/// manifest (`ServedKind::detect`). Folders and manifests are listed by `crate::opening`; while
/// that runs, `progress` (a 1.2 client's socket) gets an `opening` message every second.
async fn open_source(
    shared: &Arc<Shared>,
    path: &Path,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    if !path.exists() && ringfeed_source::wds::pattern::is_pattern(&open.dataset) {
        // 1.3: a brace/glob pattern of WebDataset tars names no single path.
        return open_webdataset(shared, open, progress).await;
    }
    let canonical = admit(shared, path)?;
    let kind = ServedKind::detect(&canonical).map_err(|e| dataset_err(e.to_string()))?;
    if open.parquet.is_some() && kind != ServedKind::Parquet {
        return Err((
            ErrorCode::BadRequest,
            format!(
                "open.parquet: {} is {}, not Parquet; leave out the Parquet options",
                open.dataset,
                kind.name()
            ),
        ));
    }
    let key = match kind {
        ServedKind::Packed | ServedKind::Lmdb => {
            format!(
                "{}|{}|{:?}|{}",
                canonical.display(),
                open.check_crc(),
                open.lmdb(),
                kind.name()
            )
        }
        // Listed files: no CRC, no LMDB options; a manifest's other columns kept only for a stream
        // that asks for sample fields (1.9).
        ServedKind::Folder | ServedKind::Manifest => {
            format!("{}|{}|{}", canonical.display(), kind.name(), columns(open))
        }
        ServedKind::WebDataset => return open_webdataset(shared, open, progress).await,
        ServedKind::Parquet => return open_parquet(shared, canonical, open, progress).await,
    };
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let opened = match kind {
        ServedKind::Folder | ServedKind::Manifest => {
            let input = if kind == ServedKind::Folder {
                InputKind::Folder
            } else {
                InputKind::Manifest
            };
            let publisher = Arc::clone(shared);
            let cache_key = key.clone();
            let waiter = shared.openings.join(&key, canonical, input, columns(open), move |s| {
                publisher.cache_source(cache_key, s);
            });
            return wait_for_listing(shared, waiter, open, progress).await;
        }
        ServedKind::WebDataset | ServedKind::Parquet => unreachable!("opened above"),
        ServedKind::Packed | ServedKind::Lmdb => {
            let lmdb = &open.lmdb();
            let lmdb_opts = LmdbOptions {
                layout: match &lmdb.layout {
                    Some(l) => l
                        .parse()
                        .map_err(|e| (ErrorCode::BadRequest, format!("open.lmdb.layout: {e}")))?,
                    None => Default::default(),
                },
                labels: match (&lmdb.labels, &lmdb.labels_key) {
                    (Some(f), _) => LabelSource::File(PathBuf::from(f)),
                    (None, Some(k)) => LabelSource::Key(k.as_bytes().to_vec()),
                    (None, None) => LabelSource::None,
                },
            };
            let check_crc = open.check_crc();
            tokio::task::spawn_blocking(move || -> Result<Arc<dyn Source>, OpenError> {
                if kind == ServedKind::Lmdb {
                    ringfeed_source::lmdb::LmdbSource::open(&canonical, &lmdb_opts)
                        .map(|s| Arc::new(s) as Arc<dyn Source>)
                        .map_err(|e| dataset_err(e.to_string()))
                } else {
                    PackedSource::open(&canonical, check_crc)
                        .map(|s| Arc::new(s) as Arc<dyn Source>)
                        .map_err(|e| dataset_err(e.to_string()))
                }
            })
            .await
            .map_err(|e| (ErrorCode::Internal, e.to_string()))??
        }
    };
    shared.cache_source(key, &opened);
    Ok(opened)
}

/// Whether a stream asks for sample fields (1.9), so that a manifest keeps its other columns.
fn columns(open: &OpenRequest) -> bool {
    open.text.as_ref().is_some_and(|t| !t.is_empty()) || open.meta.as_ref().is_some_and(|m| !m.is_empty())
}

/// Opens (or reuses) the remote dataset at `url` (1.3, `ringfeed_remote`): a packed dataset, its
/// index fetched on a blocking thread, or WebDataset tars (a pattern, a `.tar` key, a prefix of
/// tars without `index.rfi`, or any URL opened with `webdataset` options), indexed as a
/// listing; their shards come through the server's cache.
#[cfg(feature = "remote")]
async fn open_remote(
    shared: &Arc<Shared>,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let dataset_err = |m: String| (ErrorCode::Dataset, m);
    let url = ringfeed_remote::RemoteUrl::parse(&open.dataset)
        .expect("names_object_storage checked the scheme")
        .map_err(|e| dataset_err(e.to_string()))?;
    if !shared.data_roots.is_empty() {
        return Err(dataset_err(format!(
            "dataset {url}: this server confines datasets to its --data-root directories, so it serves no remote dataset; ask its operator"
        )));
    }
    if open.parquet.is_some() || remote_names_parquet(&url) {
        return open_remote_parquet(shared, url, open, progress).await;
    }
    if ringfeed_remote::wds::names_tars(&url) || open.webdataset.is_some() {
        return open_remote_webdataset(shared, url, open, progress).await;
    }
    let key = format!("{url}|{}|remote", open.check_crc());
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let hub = Arc::clone(&shared.remote);
    let check_crc = open.check_crc();
    let for_open = url.clone();
    let opened = tokio::task::spawn_blocking(move || {
        match ringfeed_remote::RemoteSource::open(&hub, &for_open, check_crc) {
            Ok(s) => Ok(Ok(Arc::new(s) as Arc<dyn Source>)),
            // No packed dataset: the prefix may hold Parquet files (1.10), else tars.
            Err(ringfeed_remote::source::OpenError::NoIndex(_)) => Ok(Err(
                remote_holds_parquet(&hub, &for_open).map_err(|e| dataset_err(e.to_string()))?
            )),
            Err(e) => Err(dataset_err(e.to_string())),
        }
    })
    .await
    .map_err(|e| (ErrorCode::Internal, e.to_string()))??;
    let opened = match opened {
        Ok(opened) => opened,
        Err(true) => return open_remote_parquet(shared, url, open, progress).await,
        Err(false) => return open_remote_webdataset(shared, url, open, progress).await,
    };
    shared.cache_source(key, &opened);
    Ok(opened)
}

/// A server built without object storage refuses a remote dataset, naming the feature.
#[cfg(not(feature = "remote"))]
async fn open_remote(
    _shared: &Arc<Shared>,
    open: &OpenRequest,
    _progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    Err((
        ErrorCode::Dataset,
        crate::remote_not_built(&format!("dataset {}", open.dataset)),
    ))
}

/// 1.3: opens (or reuses) WebDataset tars on object storage (`ringfeed_remote::wds`), indexed
/// like a local WebDataset's tars, with `opening` progress (members indexed).
#[cfg(feature = "remote")]
async fn open_remote_webdataset(
    shared: &Arc<Shared>,
    url: ringfeed_remote::RemoteUrl,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    use ringfeed_source::wds::WdsOptions;
    let opts = WdsOptions::from_request(&open.webdataset.clone().unwrap_or_default())
        .map_err(|m| (ErrorCode::BadRequest, m.to_string()))?;
    let key = format!("webdataset|{opts:?}|{url}|remote");
    join_remote_listing(shared, key, open, progress, move |hub, threads, cancel, listed, started| {
        let s = ringfeed_remote::RemoteWdsSource::open(hub, &url, &opts, threads, cancel, listed)?;
        tracing::info!(
            "indexed {url} in {:.1} s: {} tars ({} from cached index files, {} from the store's, {} downloaded and scanned), {} samples",
            started.elapsed().as_secs_f64(),
            s.tar_count(),
            s.from_cache,
            s.from_store,
            s.scanned,
            s.len()
        );
        Ok(s)
    })
    .await
}

/// Joins (or starts, on a blocking thread, with `open_it` given the hub and the threads to list
/// with) the listing of a remote dataset under `key`: [`join_listing`] for the remote kinds.
#[cfg(feature = "remote")]
async fn join_remote_listing<S: Source + 'static>(
    shared: &Arc<Shared>,
    key: String,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
    open_it: impl FnOnce(
        &ringfeed_remote::Hub,
        usize,
        &std::sync::atomic::AtomicBool,
        &std::sync::atomic::AtomicU64,
        std::time::Instant,
    ) -> Result<S, ringfeed_remote::source::OpenError>
    + Send
    + 'static,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let hub = Arc::clone(&shared.remote);
    let threads = (hub.config.concurrency * 2).clamp(1, 16);
    let index = move |cancel: &std::sync::atomic::AtomicBool,
                      listed: &std::sync::atomic::AtomicU64,
                      started: std::time::Instant| {
        open_it(&hub, threads, cancel, listed, started)
            .map(|s| Arc::new(s) as Arc<dyn Source>)
            .map_err(crate::opening::ListingError::failed)
    };
    join_listing(shared, key, index, open, progress).await
}

/// 1.10: whether `url` names Parquet files itself (a `.parquet` key, or a pattern of them).
#[cfg(all(feature = "remote", feature = "parquet"))]
fn remote_names_parquet(url: &ringfeed_remote::RemoteUrl) -> bool {
    ringfeed_remote::pq::names_parquet(url)
}

/// Without Parquet, a `.parquet` URL still goes to [`open_remote_parquet`], which names the feature.
#[cfg(all(feature = "remote", not(feature = "parquet")))]
fn remote_names_parquet(url: &ringfeed_remote::RemoteUrl) -> bool {
    let last = url.prefix.rsplit('/').next().unwrap_or("");
    last.to_ascii_lowercase().ends_with(".parquet")
}

/// 1.10: whether a prefix without a packed dataset holds Parquet files (and no tars).
#[cfg(all(feature = "remote", feature = "parquet"))]
fn remote_holds_parquet(
    hub: &ringfeed_remote::Hub,
    url: &ringfeed_remote::RemoteUrl,
) -> Result<bool, ringfeed_remote::RemoteError> {
    ringfeed_remote::pq::holds_parquet(hub, url)
}

/// A server built without Parquet takes such a prefix for tars, as before 1.10.
#[cfg(all(feature = "remote", not(feature = "parquet")))]
fn remote_holds_parquet(
    _hub: &ringfeed_remote::Hub,
    _url: &ringfeed_remote::RemoteUrl,
) -> Result<bool, ringfeed_remote::RemoteError> {
    Ok(false)
}

/// 1.10: opens (or reuses) Parquet files on object storage (`ringfeed_remote::pq`), their
/// footers read by range like a listing, with `opening` progress (rows found); their row groups
/// come through the server's cache.
#[cfg(all(feature = "remote", feature = "parquet"))]
async fn open_remote_parquet(
    shared: &Arc<Shared>,
    url: ringfeed_remote::RemoteUrl,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let opts = parquet_options(open)?;
    let key = format!("parquet|{opts:?}|{url}|remote");
    join_remote_listing(
        shared,
        key,
        open,
        progress,
        move |hub, threads, cancel, listed, started| {
            let s = ringfeed_remote::RemoteParquetSource::open(hub, &url, &opts, threads, cancel, listed)?;
            tracing::info!(
                "read the footers of {url} in {:.1} s: {} files, {} row groups, {} rows",
                started.elapsed().as_secs_f64(),
                s.files,
                s.group_count(),
                s.len()
            );
            Ok(s)
        },
    )
    .await
}

/// A server built without Parquet refuses Parquet on object storage, naming the feature.
#[cfg(all(feature = "remote", not(feature = "parquet")))]
async fn open_remote_parquet(
    _shared: &Arc<Shared>,
    url: ringfeed_remote::RemoteUrl,
    _open: &OpenRequest,
    _progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    Err((ErrorCode::Dataset, crate::parquet_not_built(&format!("dataset {url}"))))
}

/// Joins the indexing of the tars under `key` (or starts it with `index`), publishes the source
/// to the open sources once it is done, and waits for it with `opening` progress.
async fn join_listing(
    shared: &Arc<Shared>,
    key: String,
    index: impl FnOnce(
        &std::sync::atomic::AtomicBool,
        &std::sync::atomic::AtomicU64,
        std::time::Instant,
    ) -> crate::opening::Listed
    + Send
    + 'static,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let publisher = Arc::clone(shared);
    let cache_key = key.clone();
    let waiter = shared
        .openings
        .join_with(&key, index, move |s| publisher.cache_source(cache_key, s));
    wait_for_listing(shared, waiter, open, progress).await
}

/// Waits for a listing the stream joined, sending `opening` to `progress` (a 1.2 client) every
/// `shared.open_progress` meanwhile.
async fn wait_for_listing(
    shared: &Arc<Shared>,
    waiter: crate::opening::Waiter<'_>,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    let opening = Arc::clone(&waiter.opening);
    let result = opening.result();
    tokio::pin!(result);
    let mut progress = progress;
    let every = shared.open_progress;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let opened = loop {
        tokio::select! {
            r = &mut result => break r,
            _ = tick.tick() => if let Some(w) = progress.as_deref_mut() {
                let msg = ServerMessage::Opening {
                    dataset: open.dataset.clone(),
                    listed: opening.listed(),
                    elapsed_ms: opening.elapsed().as_millis() as u64,
                };
                // The client has gone: stop waiting (the last waiter cancels the listing).
                send(w, &msg).await.map_err(|e| (ErrorCode::Internal, e.to_string()))?;
            },
        }
    };
    drop(waiter);
    opened.map_err(|e| (ErrorCode::Dataset, e.to_string()))
}

/// 1.3: opens (or reuses) the WebDataset tars `open.dataset` names (a directory, a `.tar`, a
/// pattern), each inside `--data-root`; indexing them runs like a folder's listing, with
/// `opening` progress (members indexed).
async fn open_webdataset(
    shared: &Arc<Shared>,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    use ringfeed_source::wds::{WdsOptions, WdsSource, pattern};
    let opts = WdsOptions::from_request(&open.webdataset.clone().unwrap_or_default())
        .map_err(|m| (ErrorCode::BadRequest, m.to_string()))?;
    let tars = pattern::tars(&open.dataset).map_err(|m| (ErrorCode::Dataset, m.to_string()))?;
    let mut canonical = Vec::with_capacity(tars.len());
    for t in &tars {
        canonical.push(admit(shared, t)?);
    }
    let mut key = format!("webdataset|{opts:?}");
    for c in &canonical {
        key.push('|');
        key.push_str(&c.to_string_lossy());
    }
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let name = open.dataset.clone();
    let threads = shared.cores.clamp(1, 16) as usize;
    let index = move |cancel: &std::sync::atomic::AtomicBool,
                      listed: &std::sync::atomic::AtomicU64,
                      started: std::time::Instant| {
        WdsSource::open(&name, &canonical, &opts, threads, cancel, listed)
            .map(|s| {
                tracing::info!(
                    "indexed {} in {:.1} s: {} tars ({} from index files, {} scanned), {} samples",
                    name,
                    started.elapsed().as_secs_f64(),
                    s.tar_count(),
                    s.indexes_read,
                    s.scanned,
                    s.len()
                );
                Arc::new(s) as Arc<dyn Source>
            })
            .map_err(crate::opening::ListingError::failed)
    };
    join_listing(shared, key, index, open, progress).await
}

/// 1.9: opens (or reuses) the Parquet file or directory at `canonical` (inside `--data-root`),
/// its footers read like a folder's listing, with `opening` progress (rows found). The key holds
/// the columns read, so streams that read other field columns open their own source.
#[cfg(feature = "parquet")]
async fn open_parquet(
    shared: &Arc<Shared>,
    canonical: PathBuf,
    open: &OpenRequest,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    use ringfeed_source::pq::{ParquetSource, files};
    let opts = parquet_options(open)?;
    let key = format!("parquet|{opts:?}|{}", canonical.display());
    if let Some(s) = shared.cached_source(&key) {
        return Ok(s);
    }
    let name = open.dataset.clone();
    let index = move |cancel: &std::sync::atomic::AtomicBool,
                      listed: &std::sync::atomic::AtomicU64,
                      started: std::time::Instant| {
        let files = files(&canonical).map_err(crate::opening::ListingError::failed)?;
        ParquetSource::open(&name, &files, &opts, cancel, listed)
            .map(|s| {
                tracing::info!(
                    "read the footers of {name} in {:.1} s: {} files, {} row groups, {} rows",
                    started.elapsed().as_secs_f64(),
                    s.file_count(),
                    s.group_count(),
                    s.len()
                );
                Arc::new(s) as Arc<dyn Source>
            })
            .map_err(crate::opening::ListingError::failed)
    };
    join_listing(shared, key, index, open, progress).await
}

/// The Parquet options of an `open`: its `parquet` member and the columns its fields read.
#[cfg(feature = "parquet")]
fn parquet_options(open: &OpenRequest) -> Result<ringfeed_source::pq::ParquetOptions, (ErrorCode, String)> {
    let req = open.parquet.clone().unwrap_or_default();
    let sources: Vec<&str> = (open.text.iter().flatten().map(|t| t.source.as_str()))
        .chain(open.meta.iter().flatten().map(|m| m.source.as_str()))
        .collect();
    ringfeed_source::pq::ParquetOptions::new(req.image.as_deref(), req.label.as_deref(), &sources)
        .map_err(|m| (ErrorCode::BadRequest, m))
}

/// A server built without Parquet refuses a Parquet dataset, naming the feature.
#[cfg(not(feature = "parquet"))]
async fn open_parquet(
    _shared: &Arc<Shared>,
    _canonical: PathBuf,
    open: &OpenRequest,
    _progress: Option<&mut OwnedWriteHalf>,
) -> Result<Arc<dyn Source>, (ErrorCode, String)> {
    Err((
        ErrorCode::Dataset,
        crate::parquet_not_built(&format!("dataset {}", open.dataset)),
    ))
}

/// The order an image stream's `open` asks for over `source`: `None` for the global order,
/// else the shard-blocks order over the source's shards (its files, or ranges of
/// `order_shard`). `auto` is `shard_blocks` for sources that prefer it (remote ones) and
/// `global` otherwise, so local data keeps its batches. The error names the member.
fn shard_order(
    open: &OpenRequest,
    source: &dyn Source,
) -> Result<Option<std::sync::Arc<blocks::ShardBlocks>>, OpenError> {
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let kind: blocks::OrderKind = open
        .order
        .as_deref()
        .unwrap_or("auto")
        .parse::<blocks::OrderKind>()
        .map_err(|e| bad(e.to_string()))?;
    let block = open.order_block.unwrap_or(blocks::DEFAULT_BLOCK);
    if !(1..=blocks::MAX_BLOCK).contains(&block) {
        return Err(bad(format!(
            "open.order_block {block} is outside 1..={}",
            blocks::MAX_BLOCK
        )));
    }
    let shard = open.order_shard.unwrap_or(blocks::DEFAULT_SHARD_SAMPLES);
    if !(1..=blocks::MAX_SHARD_SAMPLES).contains(&shard) {
        return Err(bad(format!(
            "open.order_shard {shard} is outside 1..={}",
            blocks::MAX_SHARD_SAMPLES
        )));
    }
    let shard_blocks = match kind {
        blocks::OrderKind::Global => false,
        blocks::OrderKind::ShardBlocks => true,
        blocks::OrderKind::Auto => source.prefers_shard_order(),
    };
    if !shard_blocks {
        return Ok(None);
    }
    let order = match source.shard_sizes() {
        Some(sizes) => blocks::ShardBlocks::new(&sizes, block),
        None => blocks::ShardBlocks::ranges(source.len(), shard, block),
    };
    if order.len() != source.len() {
        return Err(bad(format!(
            "{}: its shards hold {} samples but it has {}; pass order=\"global\"",
            source.describe(),
            order.len(),
            source.len()
        )));
    }
    Ok(Some(std::sync::Arc::new(order)))
}

/// The buckets of `source`'s samples for `spec`: sizes from the cache, or probed now (with
/// `opening` progress to a waiting 1.2 client). Under `on_error = raise` a header that cannot be
/// read refuses the stream, naming the sample.
pub(crate) async fn assign_buckets(
    shared: &Arc<Shared>,
    source: &Arc<dyn Source>,
    spec: ringfeed_ops::spec::AspectBuckets,
    dataset: &str,
    skip_errors: bool,
    progress: Option<&mut OwnedWriteHalf>,
) -> Result<crate::buckets::Buckets, OpenError> {
    let cached = {
        let mut cache = shared.sizes.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(w, _)| w.strong_count() > 0);
        cache
            .iter()
            .find(|(w, _)| w.upgrade().is_some_and(|s| Arc::ptr_eq(&s, source)))
            .map(|(_, sizes)| Arc::clone(sizes))
    };
    let sizes = match cached {
        Some(s) => s,
        None => {
            let s = Arc::new(probe_all(shared, source, dataset, progress).await?);
            let mut cache = shared.sizes.lock().unwrap_or_else(|p| p.into_inner());
            cache.push((Arc::downgrade(source), Arc::clone(&s)));
            s
        }
    };
    if !skip_errors && let Some(i) = sizes.iter().position(|&(w, h)| w == 0 || h == 0) {
        return Err((
            ErrorCode::Dataset,
            format!(
                "{}: sample {i}: its image header cannot be read, so aspect_buckets cannot place it; pass on_error=\"skip\" to leave such samples out",
                source.describe()
            ),
        ));
    }
    let of = sizes
        .iter()
        .map(|&(w, h)| ringfeed_ops::buckets::nearest(&spec.sizes, w.max(1), h.max(1)))
        .collect();
    Ok(crate::buckets::Buckets {
        spec,
        sizes,
        of: Arc::new(of),
    })
}

/// Reads every sample's header on a few blocking threads, sending `opening` every
/// `shared.open_progress` meanwhile; stops early when the client goes.
async fn probe_all(
    shared: &Arc<Shared>,
    source: &Arc<dyn Source>,
    dataset: &str,
    mut progress: Option<&mut OwnedWriteHalf>,
) -> Result<Vec<(u32, u32)>, OpenError> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let done = Arc::new(AtomicU64::new(0));
    let cancel = Arc::new(AtomicBool::new(false));
    let threads = shared.cores.clamp(1, 16) as usize;
    let (src, limits, counter, stop) = (
        Arc::clone(source),
        shared.limits,
        Arc::clone(&done),
        Arc::clone(&cancel),
    );
    let work = tokio::task::spawn_blocking(move || crate::buckets::probe_on(&src, limits, threads, &counter, &stop));
    tokio::pin!(work);
    let started = std::time::Instant::now();
    let every = shared.open_progress;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            r = &mut work => return r.map_err(|e| (ErrorCode::Internal, e.to_string())),
            _ = tick.tick() => if let Some(w) = progress.as_deref_mut() {
                let msg = ServerMessage::Opening {
                    dataset: dataset.to_owned(),
                    listed: done.load(Ordering::Relaxed),
                    elapsed_ms: started.elapsed().as_millis() as u64,
                };
                if let Err(e) = send(w, &msg).await {
                    cancel.store(true, Ordering::Relaxed);
                    return Err((ErrorCode::Internal, e.to_string()));
                }
            },
        }
    }
}
