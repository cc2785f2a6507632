//! `ringfeed ops`: a pipeline run on one image, as the server would.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use ringfeed_decode::Limits;

#[derive(clap::Args, Debug)]
pub(crate) struct OpsArgs {
    /// The encoded image.
    pub(crate) image: PathBuf,
    /// The pipeline as JSON (`{"views": [...]}`), or `@FILE`.
    #[arg(long)]
    pub(crate) pipeline: String,
    /// The stream's seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// The epoch.
    #[arg(long, default_value_t = 0)]
    pub(crate) epoch: u64,
    /// The first sample index.
    #[arg(long, default_value_t = 0)]
    pub(crate) index: u64,
    /// How many indices, from `--index`.
    #[arg(long, default_value_t = 1)]
    pub(crate) count: u64,
    /// Where the images go: every output of every sample, in order, raw bytes.
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Decode every image whole (the reference path) instead of by region.
    #[arg(long)]
    pub(crate) no_region_decode: bool,
    /// Detection targets (control 1.10): the image's boxes as JSON `[[x0, y0, x1, y1], ...]`
    /// (xyxy, pixels of the stored image), moved with the image; each line then carries the
    /// output's `boxes` and `labels`.
    #[arg(long)]
    pub(crate) boxes: Option<String>,
    /// The boxes' labels as JSON `[l, ...]` (default: 0, 1, 2, ...).
    #[arg(long, requires = "boxes")]
    pub(crate) labels: Option<String>,
    /// The boxes' keypoints as JSON `[[[x, y, v], ...], ...]`: the same number `K` for each box
    /// (pixels of the stored image), moved with the image as `tv_tensors.KeyPoints` and removed
    /// with their box; each line then carries the output's `keypoints` (`[M, K, 3]`).
    #[arg(long, requires = "boxes")]
    pub(crate) keypoints: Option<String>,
    /// The boxes' instance masks: a raw file of `M * height * width` bytes (0 or 1; box by box,
    /// row by row, the stored image's size), moved with the image as a `tv_tensors.Mask` (nearest,
    /// uncovered pixels 0) and removed with their box; each sample's kept masks are appended to
    /// `--instance-masks-out`.
    #[arg(long, requires_all = ["boxes", "instance_masks_out"])]
    pub(crate) instance_masks: Option<PathBuf>,
    /// Where the output instance masks go (raw 0/1 bytes, `box_count * h * w` per sample).
    #[arg(long)]
    pub(crate) instance_masks_out: Option<PathBuf>,
    /// A label map for the image: a raw file of `width * height` label bytes, row by row, the
    /// stored image's size (before EXIF orientation), moved with the image; each sample's
    /// output map is appended to `--mask-out`.
    #[arg(long, requires = "mask_out")]
    pub(crate) mask: Option<PathBuf>,
    /// Where the output label maps go (raw bytes, `h * w` per sample).
    #[arg(long)]
    pub(crate) mask_out: Option<PathBuf>,
    /// Boxes narrower, lower (pixels) or smaller (square pixels) than these are removed at the
    /// end (`SanitizeBoundingBoxes(min_size, min_area)`).
    #[arg(long, default_value_t = 1.0)]
    pub(crate) min_size: f64,
    /// See `--min-size`.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) min_area: f64,
    /// The label of mask pixels no source pixel covers.
    #[arg(long, default_value_t = 0)]
    pub(crate) mask_fill: u8,
}

/// The `--boxes`, `--labels`, `--keypoints`, `--instance-masks` and `--mask` of `a`, or `None` when there are none.
fn targets_of(a: &OpsArgs, data: &[u8]) -> Result<Option<ringfeed_ops::Targets>> {
    if a.boxes.is_none() && a.mask.is_none() {
        return Ok(None);
    }
    let boxes: Vec<[f32; 4]> = match &a.boxes {
        Some(b) => serde_json::from_str(b).context("--boxes: expected JSON [[x0, y0, x1, y1], ...]")?,
        None => Vec::new(),
    };
    let labels: Vec<i64> = match &a.labels {
        Some(l) => serde_json::from_str(l).context("--labels: expected JSON [label, ...]")?,
        None => (0..boxes.len() as i64).collect(),
    };
    anyhow::ensure!(
        labels.len() == boxes.len(),
        "--labels: {} labels for {} boxes",
        labels.len(),
        boxes.len()
    );
    let mut keypoints = Vec::new();
    if let Some(k) = &a.keypoints {
        let per_box: Vec<Vec<[f32; 3]>> =
            serde_json::from_str(k).context("--keypoints: expected JSON [[[x, y, v], ...], ...], K points per box")?;
        anyhow::ensure!(
            per_box.len() == boxes.len(),
            "--keypoints: {} boxes' keypoints for {} boxes",
            per_box.len(),
            boxes.len()
        );
        let k = per_box.first().map_or(0, Vec::len);
        anyhow::ensure!(
            per_box.iter().all(|p| p.len() == k),
            "--keypoints: every box has the same number of keypoints (the first has {k})"
        );
        keypoints = per_box.concat();
    }
    let mut instances = Vec::new();
    if let Some(p) = &a.instance_masks {
        let info = ringfeed_decode::Decoder::new(Limits::default())?.probe(data)?;
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let plane = info.width as usize * info.height as usize;
        anyhow::ensure!(
            bytes.len() == boxes.len() * plane,
            "--instance-masks {}: {} bytes; {} boxes on the {}x{} image need {} (one 0/1 byte per pixel per box)",
            p.display(),
            bytes.len(),
            boxes.len(),
            info.width,
            info.height,
            boxes.len() * plane
        );
        // Box `k` is bit `k % 8` of plane `k / 8` (ringfeed_format::targets::Targets::instances).
        for (k, mask) in bytes.chunks_exact(plane).enumerate() {
            if k % 8 == 0 {
                instances.push(ringfeed_ops::LabelMap::filled(info.width, info.height, 0));
            }
            let bits = &mut instances.last_mut().expect("a plane per eight boxes").data;
            for (b, &m) in bits.iter_mut().zip(mask) {
                *b |= u8::from(m != 0) << (k % 8);
            }
        }
    }
    let mask = match &a.mask {
        Some(p) => {
            let info = ringfeed_decode::Decoder::new(Limits::default())?.probe(data)?;
            let labels = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            anyhow::ensure!(
                labels.len() == info.width as usize * info.height as usize,
                "--mask {}: {} bytes; the {}x{} image needs one label per pixel",
                p.display(),
                labels.len(),
                info.width,
                info.height
            );
            Some(ringfeed_ops::LabelMap {
                width: info.width,
                height: info.height,
                data: labels,
            })
        }
        None => None,
    };
    Ok(Some(ringfeed_ops::Targets {
        boxes,
        labels,
        mask,
        instances,
        keypoints,
    }))
}

pub(crate) fn run_ops(a: OpsArgs) -> Result<ExitCode> {
    use ringfeed_ops::{BufferSink, Options, Pipeline, Processor, Trace};
    use ringfeed_order::rng::SampleRng;
    use std::io::Write;
    let text = match a.pipeline.strip_prefix('@') {
        Some(f) => std::fs::read_to_string(f).with_context(|| format!("reading {f}"))?,
        None => a.pipeline.clone(),
    };
    let value: serde_json::Value = serde_json::from_str(&text).context("--pipeline is not JSON")?;
    let pipeline = Pipeline::parse(&value).map_err(|e| anyhow::anyhow!("--pipeline: {e}"))?;
    if pipeline.views.iter().any(|v| v.buckets.is_some()) {
        // Its output size is the image's bucket, chosen per dataset: a stream's op, not a preview's.
        anyhow::bail!(
            "--pipeline: aspect_buckets sizes each batch by its bucket, which `ringfeed ops` does not choose; run it through a Loader, or preview the ops after it alone"
        );
    }
    let data = std::fs::read(&a.image).with_context(|| format!("reading {}", a.image.display()))?;
    let options = Options {
        region_decode: !a.no_region_decode,
        ..Options::default()
    };
    let mut p = Processor::with_options(Limits::default(), options)?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?,
    );
    let stdout = std::io::stdout();
    let mut lines = stdout.lock();
    let mut sink = BufferSink::for_pipeline(&pipeline);
    let mut trace = Trace::on();
    let targets = targets_of(&a, &data)?;
    let options = ringfeed_ops::TargetOptions {
        min_size: a.min_size,
        min_area: a.min_area,
        mask_fill: a.mask_fill,
    };
    let create = |p: &Option<PathBuf>| -> Result<Option<std::io::BufWriter<std::fs::File>>> {
        match p {
            Some(p) => Ok(Some(std::io::BufWriter::new(
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
            ))),
            None => Ok(None),
        }
    };
    let mut masks = create(&a.mask_out)?;
    let mut instance_out = if a.instance_masks.is_some() {
        create(&a.instance_masks_out)?
    } else {
        None
    };
    for index in a.index..a.index + a.count {
        let rng = SampleRng::new(a.seed, a.epoch, index);
        let layout = ringfeed_ops::Layout::Nhwc;
        let mut moved = targets.clone();
        let crop = match &mut moved {
            Some(t) => p.run_targets(&data, None, &pipeline, rng, layout, &mut sink, &mut trace, t, &options),
            None => p.run(&data, &pipeline, rng, layout, &mut sink, &mut trace),
        }
        .with_context(|| format!("{}: sample {index}", a.image.display()))?;
        for o in &sink.outs {
            out.write_all(o)?;
        }
        let mut line = serde_json::json!({
            "index": index,
            "trace": trace.take(),
            "erase": sink.erase,
            "crop": crop.to_i32s(),
        });
        if let Some(t) = &moved {
            line["boxes"] = serde_json::json!(t.boxes);
            line["labels"] = serde_json::json!(t.labels);
            if a.keypoints.is_some() {
                let per = t.keypoints.len().checked_div(t.boxes.len()).unwrap_or(0).max(1);
                line["keypoints"] = serde_json::json!(t.keypoints.chunks(per).collect::<Vec<_>>());
            }
            if let (Some(m), Some(w)) = (&t.mask, &mut masks) {
                w.write_all(&m.data)?;
            }
            if let Some(w) = &mut instance_out {
                for k in 0..t.boxes.len() {
                    let plane = &t.instances[k / 8].data;
                    let bytes: Vec<u8> = plane.iter().map(|b| (b >> (k % 8)) & 1).collect();
                    w.write_all(&bytes)?;
                }
            }
        }
        // 1.8: a view with per-image ops after its geometry: the `gpu_ops` records (ring.md) a
        // GPU sample would carry, from the same draws.
        if let [view] = pipeline.views.as_slice()
            && ringfeed_ops::gpu::finishable(&pipeline, 9).is_ok_and(|s| s > 0)
        {
            let rng = SampleRng::new(a.seed, a.epoch, index);
            let size = (view.size.1, view.size.0);
            let steps = p.tail_steps(&data, &pipeline, rng)?.map(|steps| {
                steps
                    .iter()
                    .map(|s| s.record(size).to_ints().to_vec())
                    .collect::<Vec<_>>()
            });
            line["gpu_ops"] = serde_json::json!(steps);
        }
        writeln!(lines, "{line}")?;
    }
    out.flush()?;
    for w in [&mut masks, &mut instance_out].into_iter().flatten() {
        w.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}
