//! `ringfeed inspect` for token data: counts, width, a document-length histogram, and one
//! document's tokens (decoded with `--tokenizer`).

use tokenizers::Tokenizer;

use ringfeed_format::shard::ShardError;
use ringfeed_format::tokens::TokenSource;

/// Tokens shown of the sample document.
const SHOWN: usize = 64;

/// A JSON description of `src` and its document `sample`.
pub fn inspect(src: &TokenSource, sample: u64, tok: Option<&Tokenizer>) -> Result<serde_json::Value, ShardError> {
    let docs = src.doc_count();
    // Powers of two: bucket b counts documents with 2^b <= len < 2^(b+1).
    let mut hist = [0u64; 48];
    let (mut min, mut max) = (u64::MAX, 0u64);
    for d in 0..docs {
        let r = src.doc(d)?;
        let len = r.end - r.start;
        hist[63 - len.leading_zeros() as usize] += 1;
        min = min.min(len);
        max = max.max(len);
    }
    let histogram: Vec<serde_json::Value> = hist
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(b, n)| serde_json::json!({"min_len": 1u64 << b, "max_len": (1u64 << (b + 1)) - 1, "documents": n}))
        .collect();
    let mut doc = serde_json::Value::Null;
    if sample < docs {
        let r = src.doc(sample)?;
        let mut ids = Vec::new();
        src.tokens_into(r.clone(), &mut ids);
        let text = tok.map(|t| {
            t.decode(&ids, false)
                .unwrap_or_else(|e| format!("<cannot decode: {e}>"))
        });
        doc = serde_json::json!({
            "index": sample,
            "tokens": r.end - r.start,
            "first_token": r.start,
            "prompt_tokens": src.prompt_len(sample),
            "ids": ids.iter().take(SHOWN).collect::<Vec<_>>(),
            "text": text,
        });
    }
    let info = match src {
        TokenSource::Packed(t) => serde_json::from_str(t.info()?).unwrap_or(serde_json::Value::Null),
        _ => serde_json::Value::Null,
    };
    // 1.1: the stored pack-mode windows, one packing file per seq_len (opened, so a stale one
    // is named here as the server would name it).
    let mut packings = Vec::new();
    if let TokenSource::Packed(t) = src {
        for s in ringfeed_format::tokens::packing::list(t.dir()).0 {
            let p = ringfeed_format::tokens::packing::Packing::open(t, s)?.expect("listed");
            let cap = u64::from(s) + 1;
            let kept = src.token_count() - p.header.cut_tokens;
            packings.push(serde_json::json!({
                "seq_len": s,
                "windows": p.len(),
                "cut_tokens": p.header.cut_tokens,
                "fill": kept as f64 / (p.len() * cap) as f64,
            }));
        }
    }
    Ok(serde_json::json!({
        "kind": src.kind(),
        "tokens": src.token_count(),
        "documents": docs,
        "token_width": src.width(),
        "eos_id": src.eos_id(),
        "min_doc_tokens": if docs > 0 { min } else { 0 },
        "max_doc_tokens": max,
        "mean_doc_tokens": if docs > 0 { src.token_count() as f64 / docs as f64 } else { 0.0 },
        "length_histogram": histogram,
        "sample": doc,
        "info": info,
        "packings": packings,
    }))
}

/// The human-readable form of [`inspect`]'s result.
pub fn to_text(v: &serde_json::Value) -> String {
    let mut s = format!(
        "{} token data: {} tokens in {} documents, uint{} tokens, EOS {}\n",
        v["kind"].as_str().unwrap_or("?"),
        v["tokens"],
        v["documents"],
        v["token_width"].as_u64().unwrap_or(0) * 8,
        v["eos_id"]
    );
    s += &format!(
        "document length: min {}, mean {:.1}, max {} tokens\n",
        v["min_doc_tokens"],
        v["mean_doc_tokens"].as_f64().unwrap_or(0.0),
        v["max_doc_tokens"]
    );
    s += "length histogram (tokens: documents):\n";
    for b in v["length_histogram"].as_array().into_iter().flatten() {
        s += &format!("  {:>8}..{:<8} {}\n", b["min_len"], b["max_len"], b["documents"]);
    }
    for p in v["packings"].as_array().into_iter().flatten() {
        s += &format!(
            "pack mode, seq_len {}: {} windows stored, {:.1} % of their tokens documents, {} tokens cut\n",
            p["seq_len"],
            p["windows"],
            p["fill"].as_f64().unwrap_or(0.0) * 100.0,
            p["cut_tokens"]
        );
    }
    let d = &v["sample"];
    if !d.is_null() {
        s += &format!(
            "document {}: {} tokens from token {}, {} prompt tokens\n  ids: {}\n",
            d["index"], d["tokens"], d["first_token"], d["prompt_tokens"], d["ids"]
        );
        if let Some(t) = d["text"].as_str() {
            s += &format!("  text: {t:?}\n");
        }
    }
    s
}
