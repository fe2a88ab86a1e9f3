//! [`JsonBackend`]: every op as one line of JSON.

use std::io::Write;

use crate::backend::{Backend, BackendError, ChangeSet};

/// Bytes of encoded ops written at a time.
const CHUNK: usize = 64 * 1024;

/// Writes each op of each change set as one JSON object per line, then flushes:
/// `{"op":"reset"}`, `{"op":"set","service":{...}}`,
/// `{"op":"delete","endpoint":{"service":"ns/name","ip":"10.0.0.1"}}`, `{"op":"sync"}`.
pub struct JsonBackend<W: Write + Send> {
    out: W,
}

impl<W: Write + Send> JsonBackend<W> {
    /// A backend writing to `out`.
    pub fn new(out: W) -> Self {
        JsonBackend { out }
    }
}

impl<W: Write + Send> Backend for JsonBackend<W> {
    fn name(&self) -> &'static str {
        "to-json"
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let fail = |e: std::io::Error| BackendError::new("to-json", "writing ops").with_source(e);
        // Written in chunks: a full state must not be held twice (ops and their text).
        let mut buffer = Vec::with_capacity(CHUNK);
        for op in changes.ops() {
            serde_json::to_writer(&mut buffer, &*op).map_err(|e| {
                BackendError::new("to-json", format!("encoding {op:?}")).with_source(e)
            })?;
            buffer.push(b'\n');
            if buffer.len() >= CHUNK {
                self.out.write_all(&buffer).map_err(fail)?;
                buffer.clear();
            }
        }
        self.out.write_all(&buffer).map_err(fail)?;
        self.out.flush().map_err(fail)
    }
}
