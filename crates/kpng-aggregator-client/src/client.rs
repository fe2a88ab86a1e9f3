//! The producer's end: a stream of publications to an aggregator, and its acknowledgements.

use kpng_api::aggregatorv1 as pb;
use kpng_api::client::{ClientError, connect};
use kpng_api::{Address, Security};
use pb::aggregator_client::AggregatorClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::model::Publication;
use crate::rejection::Rejection;
use crate::wire::publication_to_wire;

/// What the aggregator answered about a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// Committed (with every earlier revision).
    Committed(u64),
    /// Refused; the producer's committed state is unchanged.
    Rejected(Rejection),
}

/// Sends publications on a [`Publisher`]'s stream.
#[derive(Debug, Clone)]
pub struct PublicationSender {
    producer: String,
    sender: mpsc::Sender<pb::Publication>,
}

impl PublicationSender {
    /// Sends a publication (moved onto the wire, not copied).
    pub async fn publish(&self, publication: Publication) -> Result<(), ClientError> {
        let message = publication_to_wire(&self.producer, publication);
        self.sender
            .send(message)
            .await
            .map_err(|_| ClientError::Status(tonic::Status::unavailable("the stream ended")))
    }
}

/// One producer's open stream.
#[derive(Debug)]
pub struct Publisher {
    producer: String,
    sender: mpsc::Sender<pb::Publication>,
    acks: tonic::Streaming<pb::Ack>,
}

impl Publisher {
    /// Connects to the aggregator at `address` as `producer` and sends `first` (normally
    /// the whole state, moved onto the wire, not copied).
    pub async fn connect(
        address: &Address,
        security: &Security,
        producer: &str,
        first: Publication,
    ) -> Result<Publisher, ClientError> {
        let channel = connect(address, security).await?;
        let (sender, receiver) = mpsc::channel(16);
        // The first message is queued before the call: the server reads it to learn who
        // is publishing before it answers.
        let _ = sender.send(publication_to_wire(producer, first)).await;
        let mut client = AggregatorClient::new(channel);
        let acks = client.publish(ReceiverStream::new(receiver)).await?.into_inner();
        Ok(Publisher { producer: producer.to_string(), sender, acks })
    }

    /// Sends a publication; its outcome comes from [`next_ack`](Self::next_ack).
    pub async fn publish(&self, publication: Publication) -> Result<(), ClientError> {
        self.sender().publish(publication).await
    }

    /// A sender of publications on this stream, usable while acknowledgements are awaited.
    pub fn sender(&self) -> PublicationSender {
        PublicationSender { producer: self.producer.clone(), sender: self.sender.clone() }
    }

    /// The next acknowledgement; `None` when the aggregator ended the stream.
    pub async fn next_ack(&mut self) -> Result<Option<Ack>, ClientError> {
        let Some(ack) = self.acks.message().await? else { return Ok(None) };
        Ok(match ack.result {
            Some(pb::ack::Result::Committed(revision)) => Some(Ack::Committed(revision)),
            Some(pb::ack::Result::Rejected(rejected)) => Some(Ack::Rejected(Rejection {
                producer: self.producer.clone(),
                revision: rejected.revision,
                object: rejected.object,
                message: rejected.message,
            })),
            None => Some(Ack::Rejected(Rejection {
                producer: self.producer.clone(),
                revision: 0,
                object: String::new(),
                message: "the aggregator sent an empty acknowledgement".into(),
            })),
        })
    }

    /// Waits until `revision` is committed (or a later one is), or refused.
    pub async fn wait_for(&mut self, revision: u64) -> Result<Result<u64, Rejection>, ClientError> {
        loop {
            match self.next_ack().await? {
                Some(Ack::Committed(committed)) if committed >= revision => {
                    return Ok(Ok(committed));
                }
                Some(Ack::Rejected(rejection)) if rejection.revision >= revision => {
                    return Ok(Err(rejection));
                }
                Some(_) => {}
                None => {
                    let status = tonic::Status::unavailable("the aggregator ended the stream");
                    return Err(ClientError::Status(status));
                }
            }
        }
    }
}
