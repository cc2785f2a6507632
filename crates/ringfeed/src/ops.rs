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
    for index in a.index..a.index + a.count {
        let rng = SampleRng::new(a.seed, a.epoch, index);
        let crop = p
            .run(&data, &pipeline, rng, ringfeed_ops::Layout::Nhwc, &mut sink, &mut trace)
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
        // 1.8: a view with per-image ops after its geometry: the `gpu_ops` records (ring.md) a
        // GPU sample would carry, from the same draws.
        if let [view] = pipeline.views.as_slice()
            && ringfeed_ops::gpu::finishable(&pipeline, true).is_ok_and(|s| s > 0)
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
    Ok(ExitCode::SUCCESS)
}
