//! [`Latch`]: a start-up milestone that, once reached, stays reached.
//!
//! Readiness is made of milestones (the initial lists are complete, every backend has
//! applied a state once) that never go back: a later failure is a matter for health, not
//! readiness. A latch says so in its type, instead of a boolean that any code could reset.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A one-way flag shared between whoever reaches a milestone and whoever reports it.
#[derive(Debug, Clone, Default)]
pub struct Latch(Arc<AtomicBool>);

impl Latch {
    /// A latch not yet released.
    pub fn new() -> Latch {
        Latch::default()
    }

    /// Marks the milestone reached, for good.
    pub fn release(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether the milestone was reached.
    pub fn is_released(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_latch_stays_released_for_every_holder() {
        let latch = Latch::new();
        let other = latch.clone();
        assert!(!other.is_released());
        latch.release();
        latch.release();
        assert!(other.is_released() && latch.is_released());
    }
}
