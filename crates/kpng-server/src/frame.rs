//! [`Frame`]: one `localv1.OpItem`, encoded once and written as is into the stream of every
//! client that needs it; [`FrameCodec`], the gRPC codec that writes frames without encoding
//! them again.
//!
//! Each frame is still one gRPC message holding one `OpItem`, exactly what the original
//! kpng sends, so every client keeps working; what changes is the cost per item on the
//! server: a copy of bytes shared by all clients instead of an encoding per client.

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use kpng_api::localv1;
use kpng_model::Op;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// `OpItem { Sync {} }`: field 1, an empty message.
const SYNC: &[u8] = &[0x0a, 0x00];
/// `OpItem { Reset {} }`: field 4, an empty message.
const RESET: &[u8] = &[0x22, 0x00];

/// One encoded `localv1.OpItem`. Cloning shares the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    bytes: Bytes,
    /// The item is the node's own (`NodeSet`): only clients that asked for it get it.
    node: bool,
}

impl Frame {
    /// `op`, encoded.
    pub fn of_op(op: &Op) -> Frame {
        Frame {
            bytes: kpng_api::local::encode_op(op).encode_to_vec().into(),
            node: kpng_api::local::is_node_op(op),
        }
    }

    /// `item`, encoded (not a node item).
    pub fn of_item(item: &localv1::OpItem) -> Frame {
        Frame { bytes: item.encode_to_vec().into(), node: false }
    }

    /// The `Sync` that closes every change set.
    pub fn sync() -> Frame {
        Frame { bytes: Bytes::from_static(SYNC), node: false }
    }

    /// The `Reset` that opens a whole state.
    pub fn reset() -> Frame {
        Frame { bytes: Bytes::from_static(RESET), node: false }
    }

    /// Whether this is the node's own item, sent only to clients that asked for it.
    pub fn is_node(&self) -> bool {
        self.node
    }

    /// The encoded `OpItem`.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }
}

/// Bytes gathered before they are handed to the connection: large enough that a whole
/// state leaves in few writes, small enough to bound what a slow client holds.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// The codec of kpng's watch services: requests of type `R` are decoded as usual, answers
/// are [`Frame`]s written as they are.
#[derive(Debug)]
pub struct FrameCodec<R>(PhantomData<fn() -> R>);

impl<R> Default for FrameCodec<R> {
    fn default() -> Self {
        FrameCodec(PhantomData)
    }
}

impl<R: Message + Default + Send + 'static> Codec for FrameCodec<R> {
    type Encode = Frame;
    type Decode = R;
    type Encoder = FrameEncoder;
    type Decoder = RequestDecoder<R>;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> RequestDecoder<R> {
        RequestDecoder(PhantomData)
    }
}

/// Writes a [`Frame`]'s bytes.
#[derive(Debug)]
pub struct FrameEncoder;

impl Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn encode(&mut self, item: Frame, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item.bytes);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(8 * 1024, YIELD_THRESHOLD)
    }
}

/// Decodes a request message.
#[derive(Debug)]
pub struct RequestDecoder<R>(PhantomData<fn() -> R>);

impl<R: Message + Default> Decoder for RequestDecoder<R> {
    type Item = R;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<R>, Status> {
        R::decode(src).map(Some).map_err(|e| Status::invalid_argument(format!("request: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_frames_are_the_protobuf_encodings() {
        use localv1::op_item::Op as Wire;
        let sync = localv1::OpItem { op: Some(Wire::Sync(localv1::EmptyOp {})) };
        let reset = localv1::OpItem { op: Some(Wire::Reset(localv1::EmptyOp {})) };
        assert_eq!(Frame::sync().bytes().as_ref(), sync.encode_to_vec().as_slice());
        assert_eq!(Frame::reset().bytes().as_ref(), reset.encode_to_vec().as_slice());
        assert_eq!(Frame::sync(), Frame::of_op(&Op::Sync));
        assert_eq!(Frame::reset(), Frame::of_op(&Op::Reset));
    }
}
