//! [`KnownGeneration`]: when a verification may skip reading the kernel back. A kernel that
//! counts its commits (the nf_tables ruleset generation) tells kpng whether anyone else
//! has committed since kpng's objects were last known right; while no one has, nothing can
//! have changed them. One verification in [`FULL_READ_EVERY`] reads back regardless, as
//! long as that takes at most one part in [`SAFETY_NET_SHARE`] of the time.

use std::time::Instant;

/// A verification reads the kernel back at least once in this many, even when its
/// generation says nothing changed: a safety net, not the means.
pub const FULL_READ_EVERY: u32 = 60;

/// ... and no more than one part in this many of the time: after a whole read-back that
/// took `t`, the safety net waits at least `(SAFETY_NET_SHARE - 1) * t` (0.5 %; a whole
/// read-back of 100,000 services takes the kernel tens of seconds).
pub const SAFETY_NET_SHARE: u32 = 200;

/// The generation at which kpng's objects were last known right, and the verifications
/// skipped since the last read-back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownGeneration {
    known: Option<u64>,
    skipped: u32,
    /// Not before then may the safety net read everything back (see [`SAFETY_NET_SHARE`]).
    net_at: Option<Instant>,
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
    pub fn may_skip(&mut self, now: Option<u64>, at: Instant) -> bool {
        let net_waits = self.net_at.is_some_and(|net_at| at < net_at);
        if now.is_some() && now == self.known && (self.skipped + 1 < FULL_READ_EVERY || net_waits) {
            self.skipped += 1;
            return true;
        }
        self.skipped = 0;
        false
    }

    /// A whole read-back ran from `started` to `ended`: the safety net's next one waits
    /// for its share of the time.
    pub fn read_whole(&mut self, started: Instant, ended: Instant) {
        let took = ended.saturating_duration_since(started);
        self.net_at = Some(ended + took * (SAFETY_NET_SHARE - 1));
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
    use std::time::Duration;

    #[test]
    fn only_kpngs_own_commit_or_a_clean_read_makes_the_generation_known() {
        let mut known = KnownGeneration::default();
        let t = Instant::now();
        assert!(!known.may_skip(Some(5), t), "nothing known yet");
        known.committed(Some(5), Some(7), 1);
        assert!(!known.may_skip(Some(7), t), "another commit came between");
        known.committed(Some(7), Some(8), 1);
        assert!(known.may_skip(Some(8), t));
        known.committed(Some(8), Some(10), 2);
        assert!(known.may_skip(Some(10), t), "kpng's own two transactions");
        assert!(!known.may_skip(Some(9), t), "another process committed since");
        known.read_back(Some(9), Some(10));
        assert!(!known.may_skip(Some(10), t), "a commit came during the read");
        known.read_back(Some(10), Some(10));
        assert!(known.may_skip(Some(10), t));
        known.forget();
        assert!(!known.may_skip(Some(10), t));
        assert!(!known.may_skip(None, t), "a kernel without generations is always read");
    }

    #[test]
    fn one_verification_in_sixty_reads_back_anyway() {
        let mut known = KnownGeneration::default();
        let t = Instant::now();
        known.committed(Some(1), Some(2), 1);
        let skipped = (0..FULL_READ_EVERY).filter(|_| known.may_skip(Some(2), t)).count();
        assert_eq!(skipped, FULL_READ_EVERY as usize - 1);
        assert!(known.may_skip(Some(2), t), "counting starts again after a read-back");
    }

    #[test]
    fn the_safety_net_takes_at_most_its_share_of_the_time() {
        let mut known = KnownGeneration::default();
        let t = Instant::now();
        known.committed(Some(1), Some(2), 1);
        // A whole read-back that took 10 s: the next waits 1990 s, however many
        // verifications come meanwhile.
        known.read_whole(t, t + Duration::from_secs(10));
        let soon = t + Duration::from_secs(1999);
        let skipped = (0..3 * FULL_READ_EVERY).filter(|_| known.may_skip(Some(2), soon)).count();
        assert_eq!(skipped, 3 * FULL_READ_EVERY as usize);
        let later = t + Duration::from_secs(2000);
        assert!(!known.may_skip(Some(2), later), "its count was reached long ago");
        assert!(!known.may_skip(Some(3), soon), "another commit is read back at once");
    }
}
