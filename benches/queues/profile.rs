//! Latency profile (`--profile`): a tracing layer that times the spans of the kube client, the
//! AWS SDK and reconcile, so both time-to-Ready arms can be broken down per API call kind.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Subscriber, span};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

static STATS: Mutex<BTreeMap<String, (u64, Duration)>> = Mutex::new(BTreeMap::new());

struct Timing {
    label: String,
    start: Instant,
}

#[derive(Default)]
struct HttpFields {
    method: String,
    url: String,
}

impl Visit for HttpFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "http.method" => self.method = format!("{value:?}"),
            "http.url" => self.url = format!("{value:?}"),
            _ => {}
        }
    }
}

/// `PATCH queues/status`, `POST events`, ...; `None` for watches (they last for ever).
fn classify(method: &str, url: &str) -> Option<String> {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    if query.split('&').any(|p| p == "watch=true" || p == "watch=1") {
        return None;
    }
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest: Vec<&str> = match segs.iter().position(|s| *s == "namespaces") {
        Some(i) if segs.len() > i + 2 => segs[i + 2..].to_vec(),
        _ => vec![segs.last().copied().unwrap_or("?")],
    };
    let what = match rest.as_slice() {
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => resource.to_string(),
        [] => "?".into(),
    };
    Some(format!("kube {method} {what}"))
}

struct Profiler;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Profiler {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        let label = if name == "HTTP" {
            let mut f = HttpFields::default();
            attrs.record(&mut f);
            match classify(&f.method, &f.url) {
                Some(l) => l,
                None => return,
            }
        } else if let Some(op) = name.strip_prefix("SQS.") {
            format!("sqs  {op}")
        } else {
            "reconcile (whole, incl. governor waits)".into()
        };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Timing { label, start: Instant::now() });
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(t) = span.extensions().get::<Timing>()
        {
            let mut stats = STATS.lock().unwrap_or_else(|p| p.into_inner());
            let e = stats.entry(t.label.clone()).or_default();
            e.0 += 1;
            e.1 += t.start.elapsed();
        }
    }
}

/// Times every kube request, SQS operation and reconcile from now on.
pub(crate) fn install() {
    let filter =
        filter_fn(|m| m.is_span() && (m.name() == "HTTP" || m.name().starts_with("SQS.") || m.name() == "reconcile"));
    tracing_subscriber::registry().with(Profiler.with_filter(filter)).init();
}

/// The figures since the last call: label → (count, total time).
pub(crate) fn take() -> BTreeMap<String, (u64, Duration)> {
    std::mem::take(&mut *STATS.lock().unwrap_or_else(|p| p.into_inner()))
}

pub(crate) fn print(arm: &str, n: usize, stats: &BTreeMap<String, (u64, Duration)>) {
    println!("    profile of {arm} (per queue: calls and time spent in them; mean latency per call):");
    for (label, (count, total)) in stats {
        println!(
            "      {label:<46} {:>5.2} calls/queue {:>7.1} ms/queue {:>7.1} ms/call",
            *count as f64 / n as f64,
            total.as_secs_f64() * 1000.0 / n as f64,
            total.as_secs_f64() * 1000.0 / *count as f64
        );
    }
}
