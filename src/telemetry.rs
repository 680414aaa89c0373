//! Structured logging: human-readable by default, JSON for log pipelines.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, fmt as tfmt, prelude::*};

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Targets whose debug output carries credentials, capped at `info`.
const NEVER_VERBOSE: &[&str] = &["aws_smithy_runtime::client::orchestrator=info", "aws_sigv4=info"];

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` filter.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube_runtime=warn"));
    // Credentials never reach the log, whatever RUST_LOG says: at debug and trace the AWS SDK
    // prints the resolved identity, access key ID included, with each request's endpoint
    // parameters, auth choice and signing parameters (tests/secrets.rs found them).
    let filter = NEVER_VERBOSE.iter().fold(filter, |f, d| f.add_directive(d.parse().expect("valid directive")));
    let registry = tracing_subscriber::registry().with(filter);
    // try_init: tests may call this more than once in one process.
    let _ = match format {
        LogFormat::Text => registry.with(tfmt::layer().compact()).try_init(),
        LogFormat::Json => registry.with(tfmt::layer().fmt_fields(JsonFields::new()).event_format(FlatJson)).try_init(),
    };
}

/// One JSON object per line: `timestamp`, `level`, `target`, the fields of every enclosing span
/// (outermost first, inner ones win), `span` (the innermost span's name), then the event's
/// fields with `message`. So a line logged during a reconcile carries `kind`, `namespace` and
/// `name` at the top level, where log queries find them.
///
/// tracing-subscriber's own JSON format nests span fields next to the span's name under the
/// key `name`, which collides with the reconcile span's `name` field (parsers keep the last
/// duplicate, and the object's name is lost).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), k8s_openapi::jiff::Timestamp::now().to_string().into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            let mut innermost = None;
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields)
                {
                    line.extend(fields);
                }
                innermost = Some(span.name());
            }
            if let Some(name) = innermost {
                line.insert("span".into(), name.into());
            }
        }
        event.record(&mut JsonVisitor(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_reconcile_span_fields_at_the_top_level() {
        let buffer = Buffer::default();
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tfmt::layer().fmt_fields(JsonFields::new()).event_format(FlatJson).with_writer(move || sink.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let outer = tracing::info_span!("run", namespace = "outer");
            let _outer = outer.enter();
            let span = tracing::info_span!("reconcile", kind = "Queue", namespace = "shop", name = "orders");
            let _entered = span.enter();
            let url = "http://sqs/q";
            tracing::info!(url, attempts = 2_u64, created = true, "created SQS queue");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(line["kind"], "Queue");
        assert_eq!(line["namespace"], "shop", "the inner span wins");
        assert_eq!(line["name"], "orders");
        assert_eq!(line["span"], "reconcile");
        assert_eq!(line["message"], "created SQS queue");
        assert_eq!(line["url"], "http://sqs/q");
        assert_eq!(line["attempts"], 2);
        assert_eq!(line["created"], true);
        assert_eq!(line["level"], "INFO");
        assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{line}");
        assert_eq!(text.matches("\"name\"").count(), 1, "no duplicate keys: {text}");
    }
}
