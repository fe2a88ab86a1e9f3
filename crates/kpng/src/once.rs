//! `--once` has an end: a source that cannot connect or list within `--once-timeout`
//! makes the process exit non-zero with the last warning it logged (sources retry
//! failures with backoff and log them, so the last warning is the reason), instead of
//! retrying forever.

use std::fmt::Write;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// The last warning or error logged: its message and fields, one line.
static LAST_WARNING: Mutex<Option<String>> = Mutex::new(None);

/// The last warning or error logged, if any.
pub fn last_warning() -> Option<String> {
    LAST_WARNING.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A tracing layer that keeps the last warning or error ([`last_warning`]), whatever the
/// log filter lets through.
pub struct LastWarning;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LastWarning {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() > tracing::Level::WARN {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let mut text = line.message;
        if !line.fields.is_empty() {
            text.push_str(" (");
            text.push_str(&line.fields);
            text.push(')');
        }
        *LAST_WARNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
    }
}

/// An event's message and its other fields as `name=value`.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
            return;
        }
        if !self.fields.is_empty() {
            self.fields.push_str(", ");
        }
        let _ = write!(self.fields, "{}={value:?}", field.name());
    }
}

/// Resolves (never, if `ready` does first) with an error when `ready` has not resolved
/// within `limit`: `what` did not happen, and the last warning says why. A zero limit
/// waits forever.
pub async fn deadline(
    limit: Duration,
    what: &str,
    ready: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if limit.is_zero() || tokio::time::timeout(limit, ready).await.is_ok() {
        return std::future::pending().await;
    }
    let last = last_warning().unwrap_or_else(|| "nothing was logged".to_string());
    anyhow::bail!("{what} within {limit:?} (--once-timeout); the last error: {last}")
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn the_last_warning_is_kept_with_its_fields() {
        let subscriber = tracing_subscriber::registry().with(LastWarning);
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not kept");
            tracing::warn!(server = "unix:///missing.sock", "node stream failed");
            tracing::debug!("not kept either");
        });
        let kept = last_warning().unwrap();
        assert_eq!(kept, "node stream failed (server=unix:///missing.sock)");
    }

    #[tokio::test]
    async fn the_deadline_names_what_did_not_happen() {
        let limit = Duration::from_millis(20);
        let error =
            deadline(limit, "no list", std::future::pending()).await.unwrap_err().to_string();
        assert!(
            error.starts_with("no list within 20ms (--once-timeout); the last error:"),
            "{error}"
        );
        // What happened in time, and a zero limit, never end the run.
        let done = deadline(limit, "no list", async {});
        assert!(tokio::time::timeout(limit * 5, done).await.is_err(), "pends");
        let zero = deadline(Duration::ZERO, "no list", std::future::pending());
        assert!(tokio::time::timeout(limit * 5, zero).await.is_err(), "pends");
    }
}
