//! [`RawWatch`]: a node-stream client that does what every client must (frame the
//! messages, find each change set's `Sync`, ask for the next one) and nothing more: it
//! counts the items instead of decoding them.
//!
//! In a cluster each node's client runs on its node; here a thousand of them share the
//! server's two cores, and clients that decoded every item would measure themselves, not
//! the server. What decoding costs one client is measured on its own (`decoded(ms)`).

use bytes::{Buf, Bytes};
use kpng_api::localv1::WatchReq;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// `OpItem { Sync {} }`, encoded.
const SYNC: &[u8] = &[0x0a, 0x00];

/// One node stream whose items are kept as bytes.
pub struct RawWatch {
    requests: mpsc::Sender<WatchReq>,
    request: WatchReq,
    responses: tonic::Streaming<Bytes>,
    pending: bool,
}

impl RawWatch {
    /// Opens node `node`'s stream (with the node's own item) and asks for its state.
    pub async fn start(channel: Channel, node: &str) -> anyhow::Result<Self> {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await?;
        let (requests, asked) = mpsc::channel(2);
        let request = WatchReq { node_name: node.to_string(), with_node: true };
        requests.send(request.clone()).await?;
        let path = PathAndQuery::from_static("/localv1.Sets/Watch");
        let request_stream = tonic::Request::new(ReceiverStream::new(asked));
        let responses = grpc.streaming(request_stream, path, RawCodec).await?.into_inner();
        Ok(RawWatch { requests, request, responses, pending: true })
    }

    /// The number of items in the next change set (without `Sync`); `None` when the
    /// server ended the stream.
    pub async fn next(&mut self) -> anyhow::Result<Option<usize>> {
        if !self.pending && self.requests.send(self.request.clone()).await.is_err() {
            return Ok(None);
        }
        self.pending = true;
        let mut items = 0;
        while let Some(item) = self.responses.message().await? {
            if item.as_ref() == SYNC {
                self.pending = false;
                return Ok(Some(items));
            }
            items += 1;
        }
        Ok(None)
    }
}

/// Encodes requests; hands each answer over as its bytes.
struct RawCodec;

impl Codec for RawCodec {
    type Encode = WatchReq;
    type Decode = Bytes;
    type Encoder = RequestEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RequestEncoder {
        RequestEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

struct RequestEncoder;

impl Encoder for RequestEncoder {
    type Item = WatchReq;
    type Error = Status;

    fn encode(&mut self, item: WatchReq, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(e.to_string()))
    }
}

struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
