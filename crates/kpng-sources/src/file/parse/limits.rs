//! Limits on what a YAML document may cost to parse, sized from the document itself.
//!
//! Without aliases, a YAML node costs at least one byte of text, so a document of N bytes
//! has fewer than N nodes and N parser events per byte... at most a few. kpng therefore
//! allows each document as many nodes as it has bytes (never fewer than the parser's
//! defaults), twice that in events, and as many scalar bytes as the document holds: any
//! real listing fits, whatever its size, while aliases (the "billion laughs" bomb) cannot
//! make a document cost more than a small multiple of its size. Nesting stays limited to
//! 64 levels (Kubernetes objects nest about 10 deep), and aliases to the parser's defaults.
//! A document that exceeds a limit is refused with the limit named.

use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::{Budget, Options};

/// The nesting depth allowed in a YAML document (JSON: serde_json's own limit, 128).
pub const MAX_DEPTH: usize = 64;

/// The parser's limits for one YAML document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YamlLimits {
    /// The document's size in bytes, which the limits are sized from.
    pub bytes: usize,
    /// Nodes (scalars, sequences, mappings), aliases expanded.
    pub nodes: usize,
    /// Parser events, aliases expanded.
    pub events: usize,
    /// Bytes of scalar text, aliases expanded.
    pub scalar_bytes: usize,
    /// Nesting depth.
    pub depth: usize,
}

impl YamlLimits {
    /// The limits for a document of `bytes` bytes.
    pub fn for_document(bytes: usize) -> YamlLimits {
        let defaults = Budget::default();
        YamlLimits {
            bytes,
            nodes: defaults.max_nodes.max(bytes),
            events: defaults.max_events.max(bytes.saturating_mul(2)),
            scalar_bytes: defaults.max_total_scalar_bytes.max(bytes),
            depth: MAX_DEPTH,
        }
    }

    /// Parser options with these limits.
    pub fn options(&self) -> Options {
        let mut budget = Budget::default();
        budget.max_nodes = self.nodes;
        budget.max_events = self.events;
        budget.max_total_scalar_bytes = self.scalar_bytes;
        budget.max_depth = self.depth;
        budget.flow_nesting_limit = self.depth;
        budget.max_documents = 1;
        let mut options = Options::default();
        options.budget = Some(budget);
        options
    }

    /// A parse error, with the limit named when it is one.
    pub fn explain(&self, error: &serde_saphyr::Error) -> String {
        let mut inner = error.without_snippet();
        while let serde_saphyr::Error::AliasError { error, .. } = inner {
            inner = error.without_snippet();
        }
        let serde_saphyr::Error::Budget { breach, .. } = inner else {
            let text = error.to_string();
            return match text.contains("recursion limit exceeded") {
                true => {
                    format!("nested more than {} levels deep (kpng's limit): {text}", self.depth)
                }
                false => text,
            };
        };
        let at = error
            .location()
            .map(|l| format!(" (at line {} column {})", l.line(), l.column()))
            .unwrap_or_default();
        format!("{}{at}", self.breach(breach))
    }

    /// What a budget breach means, with the limit named.
    fn breach(&self, breach: &BudgetBreach) -> String {
        let sized = format!("kpng's limit for a document of {} bytes", self.bytes);
        let defaults = Budget::default();
        match breach {
            BudgetBreach::Nodes { nodes } => {
                format!("{nodes} YAML nodes, more than {} ({sized}; a YAML bomb?)", self.nodes)
            }
            BudgetBreach::Events { events } => {
                format!("{events} parser events, more than {} ({sized}; a YAML bomb?)", self.events)
            }
            BudgetBreach::ScalarBytes { total_scalar_bytes } => format!(
                "{total_scalar_bytes} bytes of values, more than {} ({sized})",
                self.scalar_bytes
            ),
            BudgetBreach::Depth { depth } => {
                format!("nested {depth} levels deep, more than kpng's limit of {}", self.depth)
            }
            BudgetBreach::Aliases { aliases } => format!(
                "{aliases} aliases, more than kpng's limit of {} (a YAML bomb?)",
                defaults.max_aliases
            ),
            BudgetBreach::Anchors { anchors } => {
                format!("{anchors} anchors, more than kpng's limit of {}", defaults.max_anchors)
            }
            BudgetBreach::AliasAnchorRatio { aliases, anchors } => format!(
                "{aliases} aliases for {anchors} anchors, more than kpng's limit of {} per \
                 anchor (a YAML bomb?)",
                defaults.alias_anchor_ratio_multiplier
            ),
            BudgetBreach::RecordedAnchorEvents { recorded_anchor_events } => format!(
                "aliases expand to {recorded_anchor_events} copied events, more than kpng's \
                 limit of {} (a YAML bomb?)",
                defaults.max_recorded_anchor_events
            ),
            other => format!("a YAML limit was exceeded ({other:?}; a YAML bomb?)"),
        }
    }
}

/// A JSON parse error, with serde_json's nesting limit named when that is what failed.
pub fn explain_json(error: &serde_json::Error) -> String {
    let text = error.to_string();
    match text.starts_with("recursion limit exceeded") {
        true => format!("nested more than 128 levels deep (the JSON parser's limit): {text}"),
        false => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_grow_with_the_document_and_never_fall_below_the_defaults() {
        let small = YamlLimits::for_document(100);
        assert_eq!((small.nodes, small.depth), (250_000, 64));
        let large = YamlLimits::for_document(50_000_000);
        assert_eq!(large.nodes, 50_000_000);
        assert_eq!(large.events, 100_000_000);
    }
}
