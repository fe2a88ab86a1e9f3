//! [`Problems`]: what a backend found wrong with its dataplane and has not repaired yet (a
//! hook detached behind its back, say), or the runner found missing (the node's own
//! object), for `/readyz` to name. `/healthz`, which load
//! balancers probe, does not follow these: it keeps following whether the node state is
//! applied.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Open problems, each under a key of the backend's choosing; cheap to clone and shared
/// between the backend (which reports and clears) and the admin server (which lists).
#[derive(Debug, Clone, Default)]
pub struct Problems(Arc<Mutex<BTreeMap<String, String>>>);

impl Problems {
    /// Reports (or restates) the problem under `key`.
    pub fn report(&self, key: &str, text: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), text);
    }

    /// The problem under `key` is repaired.
    pub fn clear(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// Every open problem's text, in key order.
    pub fn list(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_listed_until_cleared() {
        let problems = Problems::default();
        let seen_by_the_server = problems.clone();
        problems.report("to-ebpf", "to-ebpf: kpng_connect4 not attached".into());
        problems.report("to-ebpf", "to-ebpf: kpng_connect6 not attached".into());
        assert_eq!(seen_by_the_server.list(), ["to-ebpf: kpng_connect6 not attached"]);
        problems.clear("to-ebpf");
        assert!(seen_by_the_server.list().is_empty());
    }
}
