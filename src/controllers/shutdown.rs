//! Stopping a controller whose cache never synced.
//!
//! kube-runtime holds every reconcile until the controller's cache has listed everything once.
//! While it holds them it never ends, not even after graceful shutdown ended its watches
//! (kube-runtime 5.0.0, `Runner::poll_next`: a finished scheduler is `Poll::Pending` while the
//! store is not ready). A list that keeps failing (the CRD not installed: 404; RBAC: 403) would
//! keep `skyport run` alive after SIGTERM until the kubelet kills it. Such a controller never
//! started a reconcile, so it can stop at once; one whose cache synced stops after the
//! reconciles in flight.

use std::future::Future;
use std::pin::pin;

use tracing::info;

/// Runs `controller` to its end, or only until `shutdown` when `synced` then says that a cache its
/// reconciles wait for never synced: no reconcile got past that wait (for the controller's own
/// cache, none started), so there is nothing to finish. `synced` is asked once, after `shutdown`:
/// graceful shutdown ends the watches (sharing `shutdown`) before they yield anything more, so
/// the answer cannot change any more.
pub async fn run_until_stopped(
    name: &str,
    controller: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
    synced: impl FnOnce() -> bool,
) {
    let mut controller = pin!(controller);
    tokio::select! {
        () = &mut controller => return,
        () = shutdown => {}
    }
    if synced() {
        controller.await;
    } else {
        info!(controller = name, "stopped at once: a cache its reconciles wait for never synced");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use futures::FutureExt;
    use tokio::sync::oneshot;

    use super::*;

    /// A controller that, once `shutdown` fired, still needs `grace` to finish its work in flight,
    /// and then sets `finished`.
    async fn controller(shutdown: oneshot::Receiver<()>, grace: Duration, finished: Arc<AtomicBool>) {
        let _ = shutdown.await;
        tokio::time::sleep(grace).await;
        finished.store(true, Ordering::SeqCst);
    }

    /// Fires both the controller's and the helper's shutdown, as the shared signal does.
    fn signal() -> (impl FnOnce(), oneshot::Receiver<()>, oneshot::Receiver<()>) {
        let (to_controller, controller_rx) = oneshot::channel();
        let (to_helper, helper_rx) = oneshot::channel();
        let fire = move || {
            let _ = to_controller.send(());
            let _ = to_helper.send(());
        };
        (fire, controller_rx, helper_rx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_synced_controller_finishes_its_work_in_flight() {
        let (fire, controller_rx, helper_rx) = signal();
        let finished = Arc::new(AtomicBool::new(false));
        let run = controller(controller_rx, Duration::from_secs(30), finished.clone());
        let task = tokio::spawn(async move {
            run_until_stopped("test", run, helper_rx.map(drop), || true).await;
        });
        fire();
        task.await.unwrap();
        assert!(finished.load(Ordering::SeqCst), "stopped before the work in flight finished");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsynced_controller_stops_at_shutdown() {
        let (fire, controller_rx, helper_rx) = signal();
        let finished = Arc::new(AtomicBool::new(false));
        // Never ends on its own: what kube-runtime's controller does with a store never ready.
        let run = controller(controller_rx, Duration::MAX, finished.clone());
        let task = tokio::spawn(async move {
            run_until_stopped("test", run, helper_rx.map(drop), || false).await;
        });
        fire();
        tokio::time::timeout(Duration::from_secs(1), task).await.expect("stopped at once").unwrap();
        assert!(!finished.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_controller_that_ends_by_itself_ends_without_shutdown() {
        let asked = Arc::new(AtomicBool::new(false));
        let asked_by = asked.clone();
        let synced = move || {
            asked_by.store(true, Ordering::SeqCst);
            true
        };
        run_until_stopped("test", async {}, std::future::pending(), synced).await;
        assert!(!asked.load(Ordering::SeqCst), "synced is only asked after shutdown");
    }
}
