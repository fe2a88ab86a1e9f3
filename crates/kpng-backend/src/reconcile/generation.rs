//! [`KnownGeneration`]: when a verification may skip reading the kernel back. A kernel that
//! counts its commits (the nf_tables ruleset generation) tells kpng whether anyone else
//! has committed since kpng's objects were last known right; while no one has, nothing can
//! have changed them. One verification in [`FULL_READ_EVERY`] reads back regardless.

/// A verification reads the kernel back at least once in this many, even when its
/// generation says nothing changed: a safety net, not the means.
pub const FULL_READ_EVERY: u32 = 60;

/// The generation at which kpng's objects were last known right, and the verifications
/// skipped since the last read-back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownGeneration {
    known: Option<u64>,
    skipped: u32,
}

impl KnownGeneration {
    /// Nothing is known any more (a commit is under way, one failed, or drift was found).
    pub fn forget(&mut self) {
        self.known = None;
    }

    /// The generation kpng's objects are known right at, if any.
    pub fn at(&self) -> Option<u64> {
        self.known
    }

    /// The kernel says every commit from the known generation up to `now` left kpng's
    /// objects alone: they are known right at `now`.
    pub fn advance(&mut self, now: u64) {
        if self.known.is_some() {
            self.known = Some(now);
        }
    }

    /// kpng's own commit, of `transactions` kernel transactions, ended between generations
    /// `before` and `after`: exactly that many more means no other commit came between, and
    /// the objects are known right at `after`, provided they were known right at `before`
    /// (the caller's to check: a reset knows them from its read).
    pub fn committed(&mut self, before: Option<u64>, after: Option<u64>, transactions: u64) {
        let expected = before.map(|b| b.wrapping_add(transactions));
        self.known = after.filter(|a| expected == Some(*a));
    }

    /// Whether a verification at generation `now` may skip reading back; counts the skip,
    /// or starts counting again when it may not.
    pub fn may_skip(&mut self, now: Option<u64>) -> bool {
        if now.is_some() && now == self.known && self.skipped + 1 < FULL_READ_EVERY {
            self.skipped += 1;
            return true;
        }
        self.skipped = 0;
        false
    }

    /// A read-back started at generation `before` and ended at `after` found the objects
    /// right: known from `before` on, when no commit came during the read.
    pub fn read_back(&mut self, before: Option<u64>, after: Option<u64>) {
        self.known = before.filter(|_| after == before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kpngs_own_commit_or_a_clean_read_makes_the_generation_known() {
        let mut known = KnownGeneration::default();
        assert!(!known.may_skip(Some(5)), "nothing known yet");
        known.committed(Some(5), Some(7), 1);
        assert!(!known.may_skip(Some(7)), "another commit came between");
        known.committed(Some(7), Some(8), 1);
        assert!(known.may_skip(Some(8)));
        known.committed(Some(8), Some(10), 2);
        assert!(known.may_skip(Some(10)), "kpng's own two transactions");
        assert!(!known.may_skip(Some(9)), "another process committed since");
        known.read_back(Some(9), Some(10));
        assert!(!known.may_skip(Some(10)), "a commit came during the read");
        known.read_back(Some(10), Some(10));
        assert!(known.may_skip(Some(10)));
        known.forget();
        assert!(!known.may_skip(Some(10)));
        assert!(!known.may_skip(None), "a kernel without generations is always read");
    }

    #[test]
    fn one_verification_in_sixty_reads_back_anyway() {
        let mut known = KnownGeneration::default();
        known.committed(Some(1), Some(2), 1);
        let skipped = (0..FULL_READ_EVERY).filter(|_| known.may_skip(Some(2))).count();
        assert_eq!(skipped, FULL_READ_EVERY as usize - 1);
        assert!(known.may_skip(Some(2)), "counting starts again after a read-back");
    }
}
