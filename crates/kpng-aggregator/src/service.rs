//! The gRPC service `/aggregatorv1.Aggregator/Publish`: one stream per producer, its
//! publications to the daemon and its acknowledgements back.

use std::pin::Pin;

use kpng_api::aggregatorv1 as pb;
use kpng_api::peer::PeerIdentity;
use pb::aggregator_server::{Aggregator as AggregatorService, AggregatorServer};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::daemon::{Handle, Outcome};
use crate::engine::{Refusal, Rejection};
use crate::wire::{committed_to_wire, publication_from_wire, rejection_to_wire};

/// The largest publication accepted, in bytes of its encoding.
pub const MAX_PUBLICATION: usize = 256 << 20;

/// The service, over a daemon's [`Handle`].
#[derive(Debug, Clone)]
pub struct PublishService {
    handle: Handle,
}

impl PublishService {
    /// The tonic server for this service. A publication may carry a producer's whole
    /// state (kpng's own tables hold an element per service port and endpoint): messages
    /// up to [`MAX_PUBLICATION`] bytes are accepted.
    pub fn server(handle: Handle) -> AggregatorServer<PublishService> {
        AggregatorServer::new(PublishService { handle }).max_decoding_message_size(MAX_PUBLICATION)
    }

    /// The service as routes, for a server that serves several.
    pub fn routes(handle: Handle) -> tonic::service::Routes {
        tonic::service::Routes::new(PublishService::server(handle))
    }
}

type Acks = Pin<Box<dyn Stream<Item = Result<pb::Ack, Status>> + Send>>;

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
        let (refusals, refused) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut next = Some(first);
            loop {
                let message = match next.take() {
                    Some(message) => message,
                    None => match inbound.message().await {
                        Ok(Some(message)) => message,
                        Ok(None) | Err(_) => break,
                    },
                };
                let revision = message.revision;
                match publication_from_wire(message) {
                    Ok(publication) => connection.publish(publication).await,
                    Err(error) => {
                        let rejection = Rejection {
                            producer: connection.producer.clone(),
                            revision,
                            object: String::new(),
                            message: error.to_string(),
                        };
                        let _ = refusals.send(Outcome::Rejected(rejection));
                    }
                }
            }
            // Dropping the connection starts the producer's lease.
            drop(connection);
        });
        let outcomes = tokio_stream::wrappers::UnboundedReceiverStream::new(outcomes)
            .merge(tokio_stream::wrappers::UnboundedReceiverStream::new(refused));
        let acks = outcomes.map(|outcome| {
            Ok(match outcome {
                Outcome::Committed(revision) => committed_to_wire(revision),
                Outcome::Rejected(rejection) => rejection_to_wire(&rejection),
            })
        });
        Ok(Response::new(Box::pin(acks)))
    }
}
