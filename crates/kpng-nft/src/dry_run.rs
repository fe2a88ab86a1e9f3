//! [`DryRunKernel`]: prints what would be installed, touches nothing.

use std::io::Write;

use crate::error::NftError;
use crate::kernel::{Kernel, KernelContents};
use crate::plan::Plan;

/// A kernel that writes each transaction in nft syntax instead of applying it. It starts
/// from nothing, so the first transaction is the whole table, which `nft -f` accepts.
pub struct DryRunKernel<W: Write + Send> {
    out: W,
}

impl<W: Write + Send> DryRunKernel<W> {
    /// Prints to `out`.
    pub fn new(out: W) -> Self {
        DryRunKernel { out }
    }
}

impl<W: Write + Send> Kernel for DryRunKernel<W> {
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        self.out
            .write_all(plan.text().as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(NftError::Output)
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        Ok(None)
    }
}
