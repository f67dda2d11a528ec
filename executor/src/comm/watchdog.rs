//! [`Watchdog`]: a thread that bounds how long a rank waits on its peers.
//!
//! A rank enters the watchdog before a blocking wait (an MPI collective, or a phase of the
//! CUDA step whose device work includes NCCL collectives) and leaves it after. While a wait
//! is pending the thread wakes at least every [`Sentry::poll`]:
//!
//! * it asks the backend's [`Probe`] whether the library has seen a failure of its own (NCCL's
//!   asynchronous error, set when a peer's connection breaks), and reports it at once as
//!   [`CommError::Backend`];
//! * once the wait has lasted the timeout, it reports [`CommError::TimedOut`].
//!
//! Waits nest (a host collective inside a watched phase of the step): each has its own start,
//! and a report ends them all.
//!
//! A report goes to the [`Alarm`], on the watchdog's thread, and is kept for the waiting rank:
//! [`Watchdog::leave`] returns it, so whatever the wait returned, the rank sees why it ended.
//! The alarm makes the wait return: NCCL's is `ncclCommAbort`, which stops the collectives'
//! kernels; MPI cannot cancel a call in flight, so its alarm ends the process. A wait that has
//! still not returned [`GRACE`] after its report ends the process with the report, so a rank
//! never hangs.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::error::{CommError, Waiting};

/// What the watchdog does with a report (called on its thread).
pub type Alarm = Box<dyn Fn(&CommError) + Send + Sync>;

/// Asks the backend whether it has failed on its own: `Some(message)` when it has.
pub type Probe = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// How long a wait may go on after its report before the process is ended.
pub const GRACE: Duration = Duration::from_secs(20);

/// What a [`Watchdog`] watches for, and what it does.
pub struct Sentry {
    /// The rank whose waits are watched.
    pub rank: usize,
    /// The longest a wait may last.
    pub timeout: Duration,
    /// The backend's own failure check, with its name (`NCCL`), if it has one.
    pub probe: Option<(&'static str, Probe)>,
    /// How often the probe is asked while a wait is pending.
    pub poll: Duration,
    /// What a report sets off.
    pub alarm: Alarm,
}

/// One watched wait.
struct Pending {
    ticket: u64,
    what: Waiting,
    since: Instant,
    /// The watchdog's report, once made.
    report: Option<CommError>,
}

/// The waits being watched: nested, innermost last (a host collective inside a watched phase
/// of the step).
#[derive(Default)]
struct Watched {
    /// Increases with every wait, so a late wake-up never blames the next one.
    ticket: u64,
    pending: Vec<Pending>,
    /// When the last report was made.
    fired_at: Option<Instant>,
    closed: bool,
}

type Shared = Arc<(Mutex<Watched>, Condvar)>;

fn lock(state: &Shared) -> MutexGuard<'_, Watched> {
    state.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// A thread that reports a wait running past the timeout, or a backend that failed (see the
/// [module documentation](self)).
pub struct Watchdog {
    state: Shared,
}

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog").finish_non_exhaustive()
    }
}

impl Watchdog {
    /// Starts the thread.
    pub fn start(sentry: Sentry) -> Self {
        let state: Shared = Arc::new((Mutex::new(Watched::default()), Condvar::new()));
        let watched = Arc::clone(&state);
        thread::spawn(move || watch(&watched, &sentry));
        Watchdog { state }
    }

    /// Starts watching a wait for `what`; returns its ticket for [`Watchdog::leave`].
    pub fn enter(&self, what: Waiting) -> u64 {
        enter(&self.state, what)
    }

    /// Ends the wait `ticket`: its report, if the watchdog made one.
    pub fn leave(&self, ticket: u64) -> Result<(), CommError> {
        leave(&self.state, ticket)
    }

    /// A handle that enters and leaves this watchdog without borrowing it.
    pub fn handle(&self) -> WatchdogHandle {
        WatchdogHandle {
            state: Arc::clone(&self.state),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.state).closed = true;
        self.state.1.notify_one();
    }
}

/// A shared handle on a [`Watchdog`], for waits that hold other borrows of its owner.
#[derive(Clone)]
pub struct WatchdogHandle {
    state: Shared,
}

impl std::fmt::Debug for WatchdogHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchdogHandle").finish_non_exhaustive()
    }
}

impl WatchdogHandle {
    /// Starts watching a wait for `what`.
    pub fn watch(&self, what: Waiting) -> Watch {
        Watch {
            ticket: enter(&self.state, what),
            state: Some(Arc::clone(&self.state)),
        }
    }
}

/// One watched wait; [`Watch::finish`] ends it. A `Watch` of no watchdog ([`Watch::none`])
/// watches nothing.
#[must_use = "a watch must be finished to see the watchdog's report"]
pub struct Watch {
    state: Option<Shared>,
    ticket: u64,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// A watch that watches nothing (a backend without a watchdog).
    pub fn none() -> Self {
        Watch {
            state: None,
            ticket: 0,
        }
    }

    /// Ends the wait: the watchdog's report if it made one (it is why the wait ended, so it
    /// wins over `result`'s error), else `result`.
    pub fn finish<T, E: From<CommError>>(mut self, result: Result<T, E>) -> Result<T, E> {
        let Some(state) = self.state.take() else {
            return result;
        };
        leave(&state, self.ticket).map_err(E::from)?;
        result
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            // Dropped without `finish` (an early return): the report has nowhere to go.
            let _ = leave(&state, self.ticket);
        }
    }
}

fn enter(state: &Shared, what: Waiting) -> u64 {
    let mut guard = lock(state);
    guard.ticket += 1;
    let ticket = guard.ticket;
    guard.pending.push(Pending {
        ticket,
        what,
        since: Instant::now(),
        report: None,
    });
    state.1.notify_one();
    ticket
}

fn leave(state: &Shared, ticket: u64) -> Result<(), CommError> {
    let mut guard = lock(state);
    let Some(at) = guard.pending.iter().position(|p| p.ticket == ticket) else {
        return Ok(());
    };
    match guard.pending.remove(at).report {
        Some(report) => Err(report),
        None => Ok(()),
    }
}

/// The watchdog's thread.
fn watch(state: &Shared, sentry: &Sentry) {
    let wake = &state.1;
    let mut guard = lock(state);
    loop {
        if guard.closed {
            return;
        }
        let reported = guard.pending.iter().any(|p| p.report.is_some());
        if reported && guard.fired_at.is_some_and(|at| at.elapsed() >= GRACE) {
            let report = guard.pending.iter().find_map(|p| p.report.clone());
            if let Some(report) = report {
                eprintln!(
                    "error: {report}; the wait did not end within {} s of that report, so rank \
                     {} ends its process",
                    GRACE.as_secs(),
                    sentry.rank
                );
                std::process::exit(1);
            }
        }
        if guard.pending.is_empty() {
            guard = wake
                .wait_timeout(guard, GRACE)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        if !reported && let Some(report) = verdict(sentry, &guard.pending) {
            // Every pending wait ends with it: the alarm ends them all.
            for pending in &mut guard.pending {
                pending.report = Some(report.clone());
            }
            guard.fired_at = Some(Instant::now());
            drop(guard);
            (sentry.alarm)(&report);
            guard = lock(state);
            continue;
        }
        let oldest = guard.pending.iter().map(|p| p.since).min();
        let left = oldest.map_or(sentry.timeout, |at| {
            sentry.timeout.saturating_sub(at.elapsed())
        });
        let nap = if reported {
            GRACE / 4
        } else if sentry.probe.is_some() {
            left.min(sentry.poll)
        } else {
            left
        };
        guard = wake
            .wait_timeout(guard, nap.max(Duration::from_millis(1)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// The report on the pending waits, if one is due: the backend's failure (blamed on the
/// innermost wait, the one blocked in the library), else the first wait past the timeout.
fn verdict(sentry: &Sentry, pending: &[Pending]) -> Option<CommError> {
    let innermost = pending.last()?;
    if let Some((backend, probe)) = &sentry.probe
        && let Some(message) = probe()
    {
        return Some(CommError::Backend {
            op: innermost.what,
            rank: sentry.rank,
            backend,
            message,
        });
    }
    pending
        .iter()
        .find(|p| p.since.elapsed() >= sentry.timeout)
        .map(|p| CommError::TimedOut {
            op: p.what,
            rank: sentry.rank,
            seconds: sentry.timeout.as_secs(),
        })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;

    use super::*;
    use crate::comm::{OpKind, StepPhase};

    fn sentry(timeout_ms: u64, probe: Option<Probe>, alarm: Alarm) -> Sentry {
        Sentry {
            rank: 2,
            timeout: Duration::from_millis(timeout_ms),
            probe: probe.map(|p| ("NCCL", p)),
            poll: Duration::from_millis(5),
            alarm,
        }
    }

    fn sender() -> (Alarm, mpsc::Receiver<CommError>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let alarm: Alarm = Box::new(move |e| {
            let _ = tx.lock().map(|tx| tx.send(e.clone()));
        });
        (alarm, rx)
    }

    #[test]
    fn a_wait_past_its_timeout_is_reported_and_the_waiter_sees_the_report() {
        let (alarm, rx) = sender();
        let dog = Watchdog::start(sentry(50, None, alarm));
        let quick = dog.enter(OpKind::AllGather.into());
        assert_eq!(dog.leave(quick), Ok(()));
        assert!(rx.recv_timeout(Duration::from_millis(150)).is_err());
        let stuck = dog.enter(OpKind::AllReduce.into());
        let report = rx.recv_timeout(Duration::from_secs(5)).expect("a timeout");
        let expected = CommError::TimedOut {
            op: OpKind::AllReduce.into(),
            rank: 2,
            seconds: 0,
        };
        assert_eq!(report, expected);
        assert_eq!(dog.leave(stuck), Err(expected), "the waiter sees why");
        let next = dog.enter(OpKind::Barrier.into());
        assert_eq!(
            dog.leave(next),
            Ok(()),
            "a report never blames the next wait"
        );
    }

    #[test]
    fn a_backend_failure_is_reported_at_once_and_only_while_waiting() {
        let failed = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (Arc::clone(&failed), Arc::clone(&asked));
        let probe: Probe = Box::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
            flag.load(Ordering::SeqCst)
                .then(|| "remote process exited (ncclRemoteError)".to_string())
        });
        let (alarm, rx) = sender();
        let dog = Watchdog::start(sentry(60_000, Some(probe), alarm));
        failed.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            asked.load(Ordering::SeqCst),
            0,
            "nothing is asked between waits"
        );
        let started = Instant::now();
        let watch = dog.handle().watch(StepPhase::MicroStep.into());
        let report = rx.recv_timeout(Duration::from_secs(5)).expect("a report");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "long before the timeout"
        );
        let expected = CommError::Backend {
            op: StepPhase::MicroStep.into(),
            rank: 2,
            backend: "NCCL",
            message: "remote process exited (ncclRemoteError)".into(),
        };
        assert_eq!(report, expected);
        assert_eq!(
            watch.finish::<(), CommError>(Ok(())),
            Err(expected),
            "the report wins over the wait's own result"
        );
        assert_eq!(
            report.to_string(),
            "the micro-step on rank 2: NCCL failed: remote process exited (ncclRemoteError)"
        );
    }

    #[test]
    fn a_wait_inside_a_watched_phase_leaves_the_phase_watched() {
        let (alarm, rx) = sender();
        let dog = Watchdog::start(sentry(80, None, alarm));
        let phase = dog.handle().watch(StepPhase::OptimizerStep.into());
        let inner = dog.enter(OpKind::AllReduceScalar.into());
        assert_eq!(dog.leave(inner), Ok(()));
        let report = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the phase times out");
        let expected = CommError::TimedOut {
            op: StepPhase::OptimizerStep.into(),
            rank: 2,
            seconds: 0,
        };
        assert_eq!(report, expected);
        assert_eq!(phase.finish::<(), CommError>(Ok(())), Err(expected));
    }

    #[test]
    fn a_watch_of_no_watchdog_passes_the_result_through() {
        let ok: Result<u8, CommError> = Watch::none().finish(Ok(3));
        assert_eq!(ok, Ok(3));
    }
}
