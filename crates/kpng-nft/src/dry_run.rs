//! [`DryRunKernel`]: prints what would be installed, touches nothing.

use std::io::Write;

use kpng_backend::BackendError;
use kpng_model::Family;

use crate::backend::Kernel;
use crate::skeleton::{SkeletonOptions, skeleton};
use crate::state::TableDiff;
use crate::text::transaction_text;

/// A kernel that writes nft commands instead of applying them: the skeleton once, then each
/// transaction. The first transaction after the skeleton completes a ruleset that
/// `nft -f` accepts.
pub struct DryRunKernel<W: Write + Send> {
    out: W,
    skeleton_printed: bool,
}

impl<W: Write + Send> DryRunKernel<W> {
    /// Prints to `out`.
    pub fn new(out: W) -> Self {
        DryRunKernel { out, skeleton_printed: false }
    }

    fn write(&mut self, text: &str) -> Result<(), BackendError> {
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|e| BackendError::new("to-nft", "writing the dry run").with_source(e))
    }
}

impl<W: Write + Send> Kernel for DryRunKernel<W> {
    fn load_skeleton(&mut self, options: &SkeletonOptions) -> Result<(), BackendError> {
        if self.skeleton_printed {
            return Ok(());
        }
        self.skeleton_printed = true;
        let text: String = Family::ALL.iter().map(|f| skeleton(*f, options)).collect();
        self.write(&text)
    }

    fn commit(&mut self, diff: &TableDiff) -> Result<(), BackendError> {
        self.write(&transaction_text(diff))
    }
}
