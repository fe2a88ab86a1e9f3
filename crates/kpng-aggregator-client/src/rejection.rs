//! [`Rejection`]: why the aggregator refused a producer's revision, cut to a short excerpt.

/// A publication (or a batch's part of it) refused: returned to its producer, whose
/// committed state stays as it was.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("producer {producer} revision {revision}: {object}: {message}")]
pub struct Rejection {
    /// The producer.
    pub producer: String,
    /// The revision refused (the latest pending one).
    pub revision: u64,
    /// The object, in nft syntax (`table ip t`, or the nft command that failed).
    pub object: String,
    /// What is wrong (for nft, its error text).
    pub message: String,
}

/// Bytes of an object or a message a rejection carries: a publication's element may be a
/// megabyte long, and neither the log nor the acknowledgement needs more than its start.
pub const EXCERPT: usize = 200;

impl Rejection {
    /// A rejection whose object and message are cut to [`EXCERPT`] bytes, saying how long
    /// they were.
    pub fn new(producer: &str, revision: u64, object: String, message: String) -> Rejection {
        Rejection {
            producer: producer.to_string(),
            revision,
            object: excerpt(object),
            message: excerpt(message),
        }
    }
}

/// `text` cut to [`EXCERPT`] bytes (at a character boundary), with its length when cut.
pub fn excerpt(mut text: String) -> String {
    if text.len() <= EXCERPT {
        return text;
    }
    let length = text.len();
    let cut = (0..=EXCERPT).rev().find(|at| text.is_char_boundary(*at)).unwrap_or(0);
    text.truncate(cut);
    text.push_str(&format!("... ({length} bytes)"));
    text
}
