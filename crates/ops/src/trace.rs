//! A record of the random parameters each op drew for one image, for `ringfeed ops` and the
//! tests that replay them through torchvision. Off (and free: nothing is allocated) when
//! serving.

use serde_json::{Map, Value};

use super::spec::Op;

/// Records `{op, member: value, ...}` objects when on.
#[derive(Debug, Default)]
pub struct Trace {
    entries: Option<Vec<Value>>,
}

impl Trace {
    /// A trace that records nothing.
    pub fn off() -> Self {
        Trace { entries: None }
    }

    /// A trace that records every draw.
    pub fn on() -> Self {
        Trace {
            entries: Some(Vec::new()),
        }
    }

    /// Whether draws are recorded.
    pub fn is_on(&self) -> bool {
        self.entries.is_some()
    }

    /// Records what `op` drew. `members` is called only when the trace is on, so an off trace
    /// costs no allocation.
    #[inline]
    pub fn record<I: IntoIterator<Item = (&'static str, Value)>>(&mut self, op: &Op, members: impl FnOnce() -> I) {
        self.record_named(op.name(), members);
    }

    /// Records a draw under `name`.
    #[inline]
    pub fn record_named<I: IntoIterator<Item = (&'static str, Value)>>(
        &mut self,
        name: &str,
        members: impl FnOnce() -> I,
    ) {
        if let Some(e) = &mut self.entries {
            let mut m = Map::new();
            m.insert("op".into(), Value::from(name));
            for (k, v) in members() {
                m.insert(k.to_owned(), v);
            }
            e.push(Value::Object(m));
        }
    }

    /// The entries recorded, leaving the trace empty (and on).
    pub fn take(&mut self) -> Vec<Value> {
        self.entries.as_mut().map(std::mem::take).unwrap_or_default()
    }
}
