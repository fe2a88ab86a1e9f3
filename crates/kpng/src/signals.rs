//! Signals. SIGTERM and SIGINT end the process: the runner applies nothing more (a kernel
//! transaction in flight completes or not at all, atomically), and the process exits at
//! once, its rules left in force; a second signal while it winds down ends it
//! immediately. SIGHUP is logged and ignored: kpng reads its configuration once, at
//! start, and the default action (death without clean-up, leaving the `to-api` socket
//! behind) helps nobody.

use tokio::signal::unix::{SignalKind, signal};

/// Resolves on SIGINT or SIGTERM. From then on a second one ends the process at once,
/// whatever is still winding down.
pub async fn shutdown() {
    first_shutdown_signal().await;
    std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        if let Ok(runtime) = runtime {
            runtime.block_on(first_shutdown_signal());
            eprintln!("kpng: second signal; exiting now");
            std::process::exit(130);
        }
    });
}

async fn first_shutdown_signal() {
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Logs and ignores every SIGHUP from now on, until the returned task is dropped (the
/// signal then stays ignored: tokio keeps its handler installed).
pub fn ignore_hangups() -> Option<crate::servers::AbortOnDrop> {
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(hangups) => hangups,
        Err(error) => {
            tracing::warn!(%error, "cannot handle SIGHUP; it would end the process");
            return None;
        }
    };
    let task = tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            tracing::warn!(
                "SIGHUP received and ignored: kpng reads its configuration at start only; \
                 restart it to apply a change"
            );
        }
    });
    Some(crate::servers::AbortOnDrop(task))
}
