//! What a watched file's new content may do to the state in force: the rules that keep a
//! half-written file from being applied.
//!
//! - A file that cannot be read, holds no document (empty, or comments only), or does not
//!   parse is taken for a write in progress: the state in force stays, with a warning.
//! - A file that would remove more than half of the objects in force, or whose last line
//!   is not ended (a write stopped in the middle of a line), is held for [`DROP_HOLD`]:
//!   applied only if it is still the same when the time is up (a writer that finishes
//!   meanwhile replaces it). This also covers a file cut short between two documents.
//! - Removing everything at once takes a `List` with `items: []` (applied at once); a file
//!   whose documents hold nothing kpng proxies counts as a drop (held, then applied).
//! - Anything else is applied at once.

use std::time::Duration;

use super::parse::{DocumentError, Manifests};

/// How long a content that drops most objects must stay before it is applied.
pub const DROP_HOLD: Duration = Duration::from_secs(10);

/// What a read of the file found.
#[derive(Debug)]
pub enum Content {
    /// No document at all (empty, whitespace or comments).
    Empty,
    /// Documents that do not parse or convert.
    Invalid(Vec<DocumentError>),
    /// The objects of the file, and whether its last line is ended by a newline.
    Parsed(Manifests, Ending),
}

/// How a file's text ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// With a newline, as every editor and `kubectl` write files.
    Newline,
    /// In the middle of a line.
    Unterminated,
}

impl Ending {
    /// How `text` ends.
    pub fn of(text: &[u8]) -> Ending {
        match text.last() {
            Some(b'\n') => Ending::Newline,
            _ => Ending::Unterminated,
        }
    }
}

/// What to do with a content.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Apply it now.
    Apply,
    /// Keep the state in force: the content looks like a write in progress.
    Keep(&'static str),
    /// Apply it only if it is still there after [`DROP_HOLD`].
    Hold(Held),
}

/// Why a content is held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// It would remove most objects.
    Drop {
        /// Objects in force.
        before: usize,
        /// Objects the content holds.
        after: usize,
    },
    /// Its last line is not ended.
    Unterminated,
}

/// The verdict on `content`, with `in_force` objects applied now.
pub fn judge(in_force: usize, content: &Content) -> Verdict {
    match content {
        Content::Empty => Verdict::Keep("the file holds no document (a write in progress?)"),
        Content::Invalid(_) => Verdict::Keep("the file has invalid documents"),
        Content::Parsed(_, Ending::Unterminated) => Verdict::Hold(Held::Unterminated),
        Content::Parsed(m, _) if m.objects.is_empty() && m.empty_list => Verdict::Apply,
        Content::Parsed(m, _) if m.objects.len() * 2 < in_force => {
            Verdict::Hold(Held::Drop { before: in_force, after: m.objects.len() })
        }
        Content::Parsed(..) => Verdict::Apply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(objects: usize, empty_list: bool) -> Content {
        let node = |i: usize| {
            kpng_model::Object::Node(kpng_testkit::builders::node(&format!("n{i}"), None, &[]))
        };
        let manifests = Manifests {
            objects: (0..objects).map(node).collect(),
            documents: objects,
            empty_list,
            warnings: Vec::new(),
        };
        Content::Parsed(manifests, Ending::Newline)
    }

    #[test]
    fn empty_and_invalid_files_keep_the_state_and_drops_wait() {
        assert!(matches!(judge(10, &Content::Empty), Verdict::Keep(_)));
        assert!(matches!(judge(10, &Content::Invalid(Vec::new())), Verdict::Keep(_)));
        assert_eq!(judge(10, &parsed(5, false)), Verdict::Apply, "half is not most");
        assert_eq!(
            judge(10, &parsed(4, false)),
            Verdict::Hold(Held::Drop { before: 10, after: 4 })
        );
        assert_eq!(
            judge(10, &parsed(0, false)),
            Verdict::Hold(Held::Drop { before: 10, after: 0 })
        );
        let Content::Parsed(m, _) = parsed(10, false) else { panic!("parsed") };
        let cut = Content::Parsed(m, Ending::of(b"kind: Service\nmetadata: {na"));
        assert_eq!(judge(10, &cut), Verdict::Hold(Held::Unterminated));
        assert_eq!(judge(10, &parsed(0, true)), Verdict::Apply, "an explicit empty List");
        assert_eq!(judge(0, &parsed(0, false)), Verdict::Apply);
        assert_eq!(judge(3, &parsed(30, false)), Verdict::Apply);
    }
}
