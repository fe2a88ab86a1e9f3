//! What a node agent does to its own process: its `oom_score_adj` (`--oom-score-adj`), and
//! exiting when the file it was started with changes (`--exit-on-change`), so that the
//! kubelet starts it again with the new file.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often `--exit-on-change` reads its file.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Sets the process's `oom_score_adj`; a failure is a warning (a container may not be
/// allowed to lower it).
pub fn set_oom_score_adj(value: Option<i32>) {
    let Some(value) = value else { return };
    match std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        Ok(()) => tracing::info!(oom_score_adj = value, "set the process's oom_score_adj"),
        Err(error) => {
            tracing::warn!(oom_score_adj = value, %error, "cannot set the process's oom_score_adj")
        }
    }
}

/// Watches `path` on a thread of its own: when its content differs from what it was at
/// start (a ConfigMap's update swaps its symlinks), the process exits with status 1. A file
/// that cannot be read for a moment is waited for.
pub fn exit_on_change(path: Option<PathBuf>) -> std::io::Result<()> {
    let Some(path) = path else { return Ok(()) };
    let first = std::fs::read(&path)?;
    std::thread::Builder::new().name("kpng-exit-on-change".into()).spawn(move || {
        loop {
            std::thread::sleep(CHECK_EVERY);
            if changed(&path, &first) {
                tracing::error!(path = %path.display(), "the configuration file changed: exiting, to be started again with it (the rules in force stay)");
                std::process::exit(1);
            }
        }
    })?;
    Ok(())
}

fn changed(path: &Path, first: &[u8]) -> bool {
    std::fs::read(path).is_ok_and(|now| now != first)
}
