//! Requests the HTTP/2 layer refuses before any of kpng's services sees them (a client's
//! malformed `:authority`, say) are reset with `PROTOCOL_ERROR` and, by default, said
//! nowhere: the library says why at debug level only. This layer listens to that one
//! message and logs it as a warning, at most once every 10 s with the count since, so an
//! operator whose client is refused learns why and a client that keeps trying cannot fill
//! the log.

use std::fmt::Write;

use kpng_server::throttle::Throttle;
use tracing::field::{Field, Visit};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::Context;

/// The module whose debug events say why a request was refused.
const SOURCE: &str = "h2::server";

/// Refusals, logged at most once every 10 s.
static REFUSALS: Throttle = Throttle::new(10_000);

/// The filter of this layer: the HTTP/2 server's debug events only.
pub fn filter() -> Targets {
    Targets::new().with_target(SOURCE, tracing::Level::DEBUG)
}

/// The layer (give it [`filter`]).
pub struct RefusedRequests;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for RefusedRequests {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut message = Message::default();
        event.record(&mut message);
        if !message.0.starts_with("malformed headers") {
            return;
        }
        let Some(count) = REFUSALS.occur() else { return };
        tracing::warn!(
            refused = count,
            "a gRPC client's request was refused before reaching kpng (reset with \
             PROTOCOL_ERROR): {}; clients must send a valid :authority (on a unix socket, \
             `localhost`)",
            message.0
        );
    }
}

/// An event's message.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        }
    }
}
