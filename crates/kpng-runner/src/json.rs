//! [`JsonBackend`]: every op as one line of JSON.

use std::io::Write;

use kpng_backend::{Backend, BackendError, ChangeSet};

/// Bytes of encoded ops written at a time.
const CHUNK: usize = 64 * 1024;

/// Writes each op of each change set as one JSON object per line, then flushes:
/// `{"op":"reset"}`, `{"op":"set","service":{...}}`,
/// `{"op":"delete","endpoint":{"service":"ns/name","ip":"10.0.0.1"}}`, `{"op":"sync"}`.
/// An output whose reader is gone (a broken pipe) is a permanent failure.
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
        // A reader that went away does not come back: stop rather than retry forever.
        let fail = |e: std::io::Error| {
            let gone = e.kind() == std::io::ErrorKind::BrokenPipe;
            let error = BackendError::new("to-json", "writing ops").with_source(e);
            if gone { error.permanent() } else { error }
        };
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

#[cfg(test)]
mod tests {
    use kpng_model::LocalState;

    use super::*;

    /// An output whose reader has gone.
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_output_is_a_permanent_failure() {
        let state = LocalState::default();
        let error = JsonBackend::new(Closed).apply(&ChangeSet::full(&state)).unwrap_err();
        assert!(error.is_permanent());
        let text = kpng_backend::error_chain(&error);
        assert!(text.contains("writing ops"), "{text}");
    }
}
