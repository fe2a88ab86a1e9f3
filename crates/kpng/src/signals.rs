//! Signals. SIGTERM and SIGINT end the process: the runner applies nothing more (a kernel
//! transaction in flight completes or not at all, atomically), and the process exits at
//! once, its rules left in force; a second signal while it winds down ends it
//! immediately. SIGHUP is logged and ignored: kpng reads its configuration once, at
//! start, and the default action (death without clean-up, leaving the `to-api` socket
//! behind) helps nobody.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// Resolves on SIGINT or SIGTERM, listening from the moment it is called: a signal that
/// arrives before the future is first polled still counts. From then on a second one ends
/// the process at once, whatever is still winding down.
pub fn shutdown() -> impl std::future::Future<Output = ()> + use<> {
    let signals = Signals::listen();
    async move {
        signals.first().await;
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async { Signals::listen().first().await });
                eprintln!("kpng: second signal; exiting now");
                std::process::exit(130);
            }
        });
    }
}

/// SIGTERM and SIGINT handlers, installed when created (inside a runtime).
struct Signals {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
}

impl Signals {
    fn listen() -> Signals {
        Signals {
            terminate: signal(SignalKind::terminate()).ok(),
            interrupt: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// The first of the two signals.
    async fn first(mut self) {
        async fn next(signal: &mut Option<Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.terminate) => {}
            () = next(&mut self.interrupt) => {}
        }
    }
}

/// Logs and ignores every SIGHUP from now on, until the returned task is dropped (the
/// signal then stays ignored: tokio keeps its handler installed).
pub fn ignore_hangups() -> Option<crate::process::AbortOnDrop> {
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
    Some(crate::process::AbortOnDrop(task))
}
