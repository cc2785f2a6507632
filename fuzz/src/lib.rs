//! The bodies of the fuzz targets, shared by the libFuzzer binaries (`fuzz_targets/`, nightly)
//! and the stable smoke test (`tests/smoke.rs`, run by `scripts/test`), so CI runs exactly the
//! code the fuzzer runs. Each body must return normally for every input: a panic is a bug.

use ringfeed_decode::{Decoder, Limits};
use ringfeed_format::control::ClientMessage;
use ringfeed_format::control::frame::{check_length, decode_frame};
use ringfeed_ops::{Layout, Processor, Transform};
use ringfeed_order::rng::SampleRng;
use ringfeed_format::shard::{Dataset, VerifyOptions, verify_dataset};
use ringfeed_source::wds::{index, tar};

/// Separates the files inside one `shard_reader` input.
pub const SEPARATOR: &[u8] = b"\n--ringfeed-fuzz-file--\n";

fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(SEPARATOR.len()).position(|w| w == SEPARATOR) {
        parts.push(&rest[..at]);
        rest = &rest[at + SEPARATOR.len()..];
    }
    parts.push(rest);
    parts
}

/// The packed dataset reader and verifier. The input is split into an index file and shard
/// files; opening, reading every sample and verifying must return `Ok` or `Err`.
pub fn shard_reader(data: &[u8]) {
    let parts = split(data);
    let index = parts[0].to_vec();
    let shards: Vec<Vec<u8>> = parts[1..].iter().map(|p| p.to_vec()).collect();
    let lookup = |name: &str| -> Option<Vec<u8>> {
        let n: usize = name.strip_prefix("shard-")?.strip_suffix(".rfs")?.parse().ok()?;
        shards.get(n).cloned()
    };
    let Ok(ds) = Dataset::from_memory(index, &lookup) else {
        return;
    };
    // Bound the work per input: a header may claim billions of samples.
    for i in 0..ds.len().min(4096) {
        if let Ok(s) = ds.sample(i) {
            std::hint::black_box(s.data.len());
        }
        let _ = ds.sample_checked(i);
    }
    if ds.len() <= 4096 {
        let _ = verify_dataset(&ds, &VerifyOptions::default());
    }
}

/// The control-frame decoder as the server runs it on bytes off the socket
/// (`stream.rs`, `read_messages`): the length prefix, the JSON object with its `type`, then
/// the typed message.
pub fn control_frame(data: &[u8]) {
    // As a frame: a length prefix, then the payload it announces (or what there is of it).
    if let Some(prefix) = data.first_chunk::<4>()
        && let Ok(n) = check_length(*prefix)
    {
        assert!((1..=65536).contains(&n), "check_length accepted {n}");
        let payload = &data[4..data.len().min(4 + n)];
        decode_message(payload);
    }
    // And as a bare payload, so mutations of the JSON are not wasted on the prefix.
    decode_message(data);
}

fn decode_message(payload: &[u8]) {
    if let Ok((kind, value)) = decode_frame(payload) {
        assert_eq!(value["type"].as_str(), Some(kind.as_str()));
        if let Ok(msg) = serde_json::from_value::<ClientMessage>(value) {
            std::hint::black_box(&msg);
        }
    }
}

/// Largest image the `image_decode` target accepts: small, so that every input is fast and the
/// limit is actually reached by mutated headers.
pub const FUZZ_MAX_PIXELS: u64 = 1 << 16;

thread_local! {
    static CODEC: std::cell::RefCell<Option<(Decoder, Processor)>> = const { std::cell::RefCell::new(None) };
}

/// The image decode entry points the server and `pack` use: probe, the plain decode, the pool's
/// `Processor::process` with a RandomResizedCrop, and `pack`'s rewrite with restart markers
/// followed by the same crop through restart cuts. None may panic, and none may go past
/// [`FUZZ_MAX_PIXELS`].
pub fn image_decode(data: &[u8]) {
    let limits = Limits {
        max_pixels: FUZZ_MAX_PIXELS,
    };
    CODEC.with_borrow_mut(|codec| {
        let (decoder, processor) = codec.get_or_insert_with(|| {
            (
                Decoder::new(limits).expect("a decoder starts"),
                Processor::new(limits).expect("a processor starts"),
            )
        });
        let probed = decoder.probe(data).ok();
        let mut out = Vec::new();
        // Refusals (bad data, over the limit) are fine; what decodes must be within the limit.
        if let Ok(d) = decoder.decode_rgb8(data, &mut out) {
            let pixels = u64::from(d.width) * u64::from(d.height);
            assert!(
                pixels <= FUZZ_MAX_PIXELS,
                "decoded {}x{} past the limit",
                d.width,
                d.height
            );
            assert_eq!(out.len() as u64, pixels * 3, "decode_rgb8 output length");
            let info = probed.expect("what decodes also probes");
            assert_eq!(info, d.info, "probe and decode disagree");
        }
        let t = Transform::random_resized_crop((24, 16));
        let mut buf = vec![0u8; t.output_len()];
        let seed = data.iter().take(8).fold(0u64, |a, &b| a << 8 | u64::from(b));
        let mut rng = SampleRng::new(seed, 0, data.len() as u64);
        if let Ok(crop) = processor.process(data, &t, &mut rng, Layout::Nhwc, &mut buf) {
            let info = probed.expect("what is processed also probes");
            assert!(u64::from(info.width) * u64::from(info.height) <= FUZZ_MAX_PIXELS);
            std::hint::black_box(crop);
        }
        // `pack`'s lossless rewrite with restart markers, and the restart cuts of a region
        // decode on what it wrote: a rewrite is only kept when it decodes to the same pixels,
        // so the crop must then come out the same too.
        let mut rewritten = Vec::new();
        if let Ok(Some(_)) = decoder.add_restarts(data, 1, &mut rewritten) {
            let mut again = vec![0u8; t.output_len()];
            let mut rng = SampleRng::new(seed, 0, data.len() as u64);
            let a = processor.process(
                data,
                &t,
                &mut SampleRng::new(seed, 0, data.len() as u64),
                Layout::Nhwc,
                &mut buf,
            );
            let b = processor.process(&rewritten, &t, &mut rng, Layout::Nhwc, &mut again);
            assert_eq!(
                a.is_ok(),
                b.is_ok(),
                "the rewrite decodes where the original does not, or not where it does"
            );
            if a.is_ok() {
                assert!(buf == again, "a restart cut changed the crop's pixels");
            }
        }
    });
}

/// The WebDataset tar scanner and index files (`crates/source/src/wds`): a scan of any bytes
/// returns members inside the input (but a cut last one), its index file decodes back to the same
/// scan, and the input read as an index file is refused or accepted without a panic.
pub fn tar_scan(data: &[u8]) {
    let scan = tar::scan(data, &mut |_| {});
    let len = data.len() as u64;
    for (i, m) in scan.members.iter().enumerate() {
        let cut = i + 1 == scan.members.len() && matches!(scan.end, tar::End::Truncated { member: Some(_), .. });
        assert!(cut || m.offset + m.size <= len, "member {i} past the end");
    }
    let stamp = index::Stamp { len, mtime_ns: 7 };
    let bytes = index::encode(&scan, stamp);
    assert_eq!(
        index::decode(&bytes, stamp, data).as_ref(),
        Ok(&scan),
        "an index round-trips"
    );
    let _ = index::decode(data, stamp, data);
    let _ = index::decode(
        data,
        index::Stamp {
            len: 1 << 40,
            mtime_ns: 0,
        },
        &data[..data.len() / 2],
    );
    // 1.1: an index with the ETag of a tar in a store reads back with it; any bytes parse or
    // are refused without a panic.
    let etag = b"\"0123abcd\"";
    let parsed = index::parse(&index::encode_with(&scan, stamp, Some(etag))).expect("an index with an etag parses");
    assert_eq!((&parsed.scan, parsed.etag.as_deref()), (&scan, Some(&etag[..])));
    let _ = index::parse(data);
}
