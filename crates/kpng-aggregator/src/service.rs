//! The gRPC service `/aggregatorv1.Aggregator/Publish`: one stream per producer, its
//! publications to the daemon and its acknowledgements back.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use prost::Message;
use tokio::sync::Notify;
use tokio_stream::wrappers::ReceiverStream;

use kpng_api::aggregatorv1 as pb;
use kpng_api::peer::{PeerIdentity, StreamWatch};
use pb::aggregator_server::{Aggregator as AggregatorService, AggregatorServer};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::daemon::{Connection, Handle, Outcome};
use crate::engine::{Refusal, Rejection};
use crate::wire::{committed_to_wire, publication_from_wire, rejection_to_wire};

/// The largest publication accepted, in bytes of its encoding.
pub const MAX_PUBLICATION: usize = 256 << 20;

/// The default bound on a producer's unacknowledged bytes: two whole-state publications of
/// `to-nft` at 100,000 services with 4 endpoints each (61 MiB each, measured with
/// `kpng-bench --publication-services`), so that kpng's own whole states always fit.
pub const MAX_UNACKNOWLEDGED: usize = 128 << 20;

/// The service, over a daemon's [`Handle`].
#[derive(Debug, Clone)]
pub struct PublishService {
    handle: Handle,
    max_unacknowledged: usize,
}

impl PublishService {
    /// The tonic server for this service, holding at most `max_unacknowledged` bytes of a
    /// producer's publications that the daemon has not answered yet: past that, the
    /// producer's stream is not read until answers come (flow control holds the producer
    /// back). A publication may carry a producer's whole state (kpng's own tables hold an
    /// element per service port and endpoint): messages up to [`MAX_PUBLICATION`] bytes are
    /// read, and one larger than `max_unacknowledged` is refused.
    pub fn server(handle: Handle, max_unacknowledged: usize) -> AggregatorServer<PublishService> {
        AggregatorServer::new(PublishService { handle, max_unacknowledged })
            .max_decoding_message_size(MAX_PUBLICATION)
    }

    /// The service as routes, for a server that serves several.
    pub fn routes(handle: Handle, max_unacknowledged: usize) -> tonic::service::Routes {
        tonic::service::Routes::new(PublishService::server(handle, max_unacknowledged))
    }
}

type Acks = Pin<Box<dyn Stream<Item = Result<pb::Ack, Status>> + Send>>;

/// The publications of one producer that the daemon has not answered yet: their revisions
/// and sizes. An answer about revision R settles every publication up to R (a commit
/// acknowledges every revision before it; a refusal of a batch, the revisions it held).
#[derive(Debug, Default)]
struct Unanswered {
    pending: Mutex<(VecDeque<(u64, usize)>, usize)>,
    answered: Notify,
}

impl Unanswered {
    fn bytes(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    fn add(&self, revision: u64, size: usize) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.0.push_back((revision, size));
        pending.1 += size;
    }

    fn settle(&self, revision: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while pending.0.front().is_some_and(|(r, _)| *r <= revision) {
            if let Some((_, size)) = pending.0.pop_front() {
                pending.1 -= size;
            }
        }
        drop(pending);
        self.answered.notify_one();
    }

    /// Waits until `size` more bytes fit under `limit` (at once when nothing is pending).
    async fn room_for(&self, size: usize, limit: usize) {
        loop {
            let answered = self.answered.notified();
            let held = self.bytes();
            if held == 0 || held + size <= limit {
                return;
            }
            answered.await;
        }
    }
}

#[tonic::async_trait]
impl AggregatorService for PublishService {
    type PublishStream = Acks;

    async fn publish(
        &self,
        request: Request<Streaming<pb::Publication>>,
    ) -> Result<Response<Acks>, Status> {
        // Who is publishing, as the server's transport proved it; plaintext when the
        // service runs under a server that does not say (in-process tests).
        let identity =
            request.extensions().get::<PeerIdentity>().cloned().unwrap_or(PeerIdentity::Plaintext);
        let watch = request.extensions().get::<StreamWatch>().cloned();
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before naming a producer"))?;
        let producer = first.producer.clone();
        if producer.is_empty() {
            return Err(Status::invalid_argument("the first publication must name the producer"));
        }
        let (connection, outcomes) =
            self.handle.connect(&producer, identity).await.map_err(|refusal| match refusal {
                Refusal::Connected(_) => Status::already_exists(refusal.to_string()),
                Refusal::Name(_) => Status::invalid_argument(refusal.to_string()),
                Refusal::Bound { .. } => Status::permission_denied(refusal.to_string()),
                Refusal::NotConnected(_) => Status::unavailable("the aggregator is stopping"),
            })?;
        // A producer is quiet between its publications, for as long as nothing changes:
        // its stream is in use until it ends, and the server must not cut it for idle.
        let in_use = watch.map(|watch| watch.open());
        let unanswered = Arc::new(Unanswered::default());
        let cut = connection.cut_slot();
        let limit = self.max_unacknowledged;
        let reading = read_publications(connection, first, inbound, unanswered.clone(), limit);
        tokio::spawn(async move {
            reading.await;
            drop(in_use);
        });
        let settled = unanswered.clone();
        let acks = ReceiverStream::new(outcomes).map(move |outcome| {
            Ok(match outcome {
                Outcome::Committed(revision) => {
                    settled.settle(revision);
                    committed_to_wire(revision)
                }
                Outcome::Rejected(rejection) => {
                    settled.settle(rejection.revision);
                    rejection_to_wire(&rejection)
                }
            })
        });
        // A producer cut off hears why as the stream's end.
        let ending = made_when_polled(move || {
            let reason = cut.lock().unwrap_or_else(|e| e.into_inner()).clone();
            reason.map(|reason| Err(Status::resource_exhausted(format!("cut off: {reason}"))))
        });
        Ok(Response::new(Box::pin(acks.chain(ending))))
    }
}

/// A stream of at most one item, made when the stream is first polled.
fn made_when_polled<T>(make: impl FnOnce() -> Option<T> + Send + 'static) -> impl Stream<Item = T> {
    let mut make = Some(make);
    tokio_stream::iter(std::iter::from_fn(move || make.take().and_then(|f| f())))
}

/// Reads one producer's publications and hands them to the daemon, holding at most `limit`
/// unanswered bytes; a publication that cannot be read as the model is refused through the
/// daemon (which counts refusals in a row). Dropping the connection at the end starts the
/// producer's lease.
async fn read_publications(
    connection: Connection,
    first: pb::Publication,
    mut inbound: Streaming<pb::Publication>,
    unanswered: Arc<Unanswered>,
    limit: usize,
) {
    let mut next = Some(first);
    loop {
        let message = match next.take() {
            Some(message) => message,
            None => match inbound.message().await {
                Ok(Some(message)) => message,
                Ok(None) | Err(_) => break,
            },
        };
        if connection.cut_reason().is_some() {
            break;
        }
        let (revision, size) = (message.revision, message.encoded_len());
        if size > limit {
            let message = format!(
                "a publication of {size} bytes is larger than --max-unacknowledged-bytes \
                 ({limit})"
            );
            let rejection = Rejection::new(&connection.producer, revision, String::new(), message);
            connection.reject(rejection).await;
            continue;
        }
        unanswered.room_for(size, limit).await;
        match publication_from_wire(message) {
            Ok(publication) => {
                unanswered.add(revision, size);
                connection.publish(publication).await;
            }
            Err(error) => {
                let producer = &connection.producer;
                let rejection =
                    Rejection::new(producer, revision, String::new(), error.to_string());
                connection.reject(rejection).await;
            }
        }
    }
    drop(connection);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn unanswered_bytes_hold_a_producer_back_until_answers_come() {
        let unanswered = Arc::new(Unanswered::default());
        let mib = 1 << 20;
        unanswered.room_for(3 * mib, 4 * mib).await;
        unanswered.add(1, 3 * mib);
        // Nothing pending: even a publication at the limit goes through; now it must wait.
        let waiting = {
            let unanswered = unanswered.clone();
            tokio::spawn(async move { unanswered.room_for(2 * mib, 4 * mib).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "5 MiB would be held against a 4 MiB limit");
        unanswered.add(2, mib);
        unanswered.settle(1);
        assert_eq!(unanswered.bytes(), mib, "revision 1 answered, 2 still held");
        tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        // An answer about a later revision settles every earlier one.
        unanswered.add(3, mib);
        unanswered.settle(3);
        assert_eq!(unanswered.bytes(), 0);
    }
}
