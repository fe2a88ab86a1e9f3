//! The api source: another kpng's global stream (`globalv1`, served by its `to-api`),
//! mirrored into this process's store.
//!
//! Each (re)connection starts with the server's whole model, applied as a relist, so
//! objects that vanished while disconnected are deleted; then each change set of the
//! stream is applied as it arrives. The wire format and its conversions live in
//! `kpng-api`; this module is the source that writes the store.
//!
//! # Layout
//! - [`mirror`]: [`Mirror`], a client's copy of the stream turned back into store events,
//!   with the service-proxy-name rule of the receiving proxy.
//! - [`follow_global`]: the loop that connects, mirrors and reconnects with backoff.

pub mod mirror;

#[cfg(test)]
mod tests;

pub use mirror::Mirror;

use kpng_api::addr::{Address, Security};
use kpng_api::client::{Backoff, ClientError, FailureLog, GlobalWatch, Retry, chain, connect};
use kpng_store::StoreWriter;

/// Follows the global stream of the server at `address` into `writer`: each (re)connection
/// starts with a relist, so objects that vanished meanwhile are deleted. An invalid item is
/// reported (naming the object and field) and the stream restarted. Services and slices are
/// kept only if the proxy named `proxy` (`None`: the default proxy) handles them, by their
/// service-proxy-name label. Failures are retried with backoff, except a permanent one
/// under [`Retry::UntilPermanent`], which is returned.
#[tracing::instrument(name = "source", skip_all, fields(source = "api", server = %address))]
pub async fn follow_global(
    address: Address,
    security: Security,
    proxy: Option<String>,
    mut writer: StoreWriter,
    retry: Retry,
) -> Result<(), ClientError> {
    let mut backoff = Backoff::default();
    let mut failures = FailureLog::default();
    loop {
        let stream = async {
            let channel = connect(&address, &security).await?;
            let mut watch = GlobalWatch::start(channel).await?;
            let mut mirror = Mirror::for_proxy(proxy.clone());
            while let Some(items) = watch.next_items().await? {
                writer.apply(mirror.apply(&items)?);
                backoff.reset();
                failures.recovered();
            }
            Ok::<_, ClientError>(())
        };
        match stream.await {
            Ok(()) => {
                tracing::warn!(server = %address, retry_in = ?backoff.delay(), "the server ended the stream")
            }
            Err(error) if retry == Retry::UntilPermanent && error.is_permanent() => {
                return Err(error);
            }
            Err(error) => {
                let error = chain(&error);
                if failures.is_new(&error) {
                    tracing::warn!(server = %address, %error, retry_in = ?backoff.delay(), "global stream failed (said once while it repeats)")
                } else {
                    tracing::debug!(server = %address, %error, retry_in = ?backoff.delay(), "global stream failed again")
                }
            }
        }
        backoff.wait().await;
    }
}
