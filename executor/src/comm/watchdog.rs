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

/// The wait being watched, if any.
#[derive(Default)]
struct Watched {
    /// Increases with every wait, so a late wake-up never blames the next one.
    ticket: u64,
    pending: Option<(Waiting, Instant)>,
    /// The report of wait `ticket`, and when it was made.
    fired: Option<(u64, CommError, Instant)>,
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
    guard.pending = Some((what, Instant::now()));
    state.1.notify_one();
    guard.ticket
}

fn leave(state: &Shared, ticket: u64) -> Result<(), CommError> {
    let mut guard = lock(state);
    if guard.ticket == ticket {
        guard.pending = None;
    }
    match guard.fired.take() {
        Some((fired, error, _)) if fired == ticket => Err(error),
        other => {
            guard.fired = other;
            Ok(())
        }
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
        if let Some((ticket, error, at)) = &guard.fired
            && guard.ticket == *ticket
            && guard.pending.is_some()
            && at.elapsed() >= GRACE
        {
            eprintln!(
                "error: {error}; the wait did not end within {} s of that report, so rank {} \
                 ends its process",
                GRACE.as_secs(),
                sentry.rank
            );
            std::process::exit(1);
        }
        let Some((what, since)) = guard.pending else {
            guard = wake
                .wait_timeout(guard, GRACE)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        };
        let already = matches!(&guard.fired, Some((t, _, _)) if *t == guard.ticket);
        if !already && let Some(error) = verdict(sentry, what, since) {
            let ticket = guard.ticket;
            guard.fired = Some((ticket, error.clone(), Instant::now()));
            drop(guard);
            (sentry.alarm)(&error);
            guard = lock(state);
            continue;
        }
        let left = sentry.timeout.saturating_sub(since.elapsed());
        let nap = if already {
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

/// The report on a wait for `what` pending since `since`, if it is due.
fn verdict(sentry: &Sentry, what: Waiting, since: Instant) -> Option<CommError> {
    if let Some((backend, probe)) = &sentry.probe
        && let Some(message) = probe()
    {
        return Some(CommError::Backend {
            op: what,
            rank: sentry.rank,
            backend,
            message,
        });
    }
    (since.elapsed() >= sentry.timeout).then_some(CommError::TimedOut {
        op: what,
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
    fn a_watch_of_no_watchdog_passes_the_result_through() {
        let ok: Result<u8, CommError> = Watch::none().finish(Ok(3));
        assert_eq!(ok, Ok(3));
    }
}
