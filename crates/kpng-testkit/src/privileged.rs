//! Gatekeeping for tests that need root and kernel tools.
//!
//! Such tests call [`require`] first. Where the capability is missing, the test is skipped
//! with a message, except under `CI=true`, where a missing capability fails the test: CI
//! runs as root with the tools installed, so a skip there would hide a broken set-up.

use std::process::Command;

/// Whether the process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Whether `tool` can be run.
pub fn has_tool(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
        || Command::new(tool).arg("-V").output().is_ok()
}

/// Returns true when the test may run: root and every tool present. Otherwise skips
/// (returns false) or, under `CI=true`, panics naming what is missing.
pub fn require(test: &str, tools: &[&str]) -> bool {
    let mut missing: Vec<String> = Vec::new();
    if !is_root() {
        missing.push("root".into());
    }
    missing.extend(tools.iter().filter(|t| !has_tool(t)).map(|t| format!("the `{t}` command")));
    if missing.is_empty() {
        return true;
    }
    skip(&format!("{test} needs {}", missing.join(", ")))
}

/// Skips a test that cannot run for the reason `message` gives: prints it and returns
/// false, or under `CI=true` panics with it.
pub fn skip(message: &str) -> bool {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{message} (CI=true: privileged tests must run)");
    }
    eprintln!("SKIPPED: {message}");
    false
}
