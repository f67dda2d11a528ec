//! The `mpirun` that `dsplan launch` starts dies with it.
//!
//! [`Supervised::spawn`] starts the child in a process group of its own (so the ranks it starts
//! can be signalled together) and, on Linux, asks the kernel to kill it if `launch` dies first
//! (`PR_SET_PDEATHSIG`, which covers a `kill -9` of `launch`). While [`Supervised::wait`]
//! waits, SIGTERM, SIGINT and SIGHUP to `launch` are caught: the group gets SIGTERM, then,
//! after [`GRACE`], SIGKILL (an `mpirun` that is busy starting ranks ignores SIGTERM). A
//! `Supervised` dropped before its child ended (an error, a panic) kills the group too.

use std::io;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long the group has between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// How often the child is looked at while it runs.
const POLL: Duration = Duration::from_millis(50);

/// How a supervised child ended.
#[derive(Debug)]
pub enum Ended {
    /// By itself.
    Exited(ExitStatus),
    /// Stopped because `launch` was asked to stop (SIGTERM, SIGINT or SIGHUP).
    Stopped,
}

/// A child process in its own process group, ended with `launch`.
#[derive(Debug)]
pub struct Supervised {
    child: Child,
    signalled: Arc<AtomicBool>,
    done: bool,
}

impl Supervised {
    /// Starts `command` in a new process group, registering the signal handlers first.
    pub fn spawn(command: &mut Command) -> io::Result<Self> {
        let signalled = Arc::new(AtomicBool::new(false));
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            for number in [
                signal_hook::consts::SIGTERM,
                signal_hook::consts::SIGINT,
                signal_hook::consts::SIGHUP,
            ] {
                signal_hook::flag::register(number, Arc::clone(&signalled))?;
            }
            command.process_group(0);
            #[cfg(target_os = "linux")]
            // SAFETY: prctl is async-signal-safe and touches nothing of the parent.
            unsafe {
                command.pre_exec(|| {
                    rustix::process::set_parent_process_death_signal(Some(
                        rustix::process::Signal::KILL,
                    ))
                    .map_err(io::Error::from)
                });
            }
        }
        let child = command.spawn()?;
        Ok(Self {
            child,
            signalled,
            done: false,
        })
    }

    /// The child (to take its pipes).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Waits for the child to end, or for `launch` to be signalled; then ends the group.
    pub fn wait(mut self) -> io::Result<Ended> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.done = true;
                return Ok(Ended::Exited(status));
            }
            if self.signalled.load(Ordering::SeqCst) {
                self.end_group(GRACE);
                self.done = true;
                return Ok(Ended::Stopped);
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGTERM to the group, SIGKILL after `grace` if the child still runs; reaps the child.
    fn end_group(&mut self, grace: Duration) {
        signal_group(&self.child, Stop::Terminate);
        let started = Instant::now();
        while started.elapsed() < grace {
            if let Ok(Some(_)) = self.child.try_wait() {
                // The leader is gone; what it started may not be.
                signal_group(&self.child, Stop::Kill);
                return;
            }
            std::thread::sleep(POLL);
        }
        signal_group(&self.child, Stop::Kill);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if !self.done {
            signal_group(&self.child, Stop::Kill);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Which signal ends a group.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Terminate,
    Kill,
}

#[cfg(unix)]
fn signal_group(child: &Child, stop: Stop) {
    use rustix::process::{Pid, Signal, kill_process_group};
    let signal = match stop {
        Stop::Terminate => Signal::TERM,
        Stop::Kill => Signal::KILL,
    };
    let _ = kill_process_group(Pid::from_child(child), signal);
}

#[cfg(not(unix))]
fn signal_group(_: &Child, _: Stop) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn alive(pid: u32) -> bool {
        // A zombie still has /proc/PID; its state is Z.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
            .unwrap_or(false)
    }

    #[test]
    fn a_group_that_ignores_sigterm_is_killed_after_the_grace() {
        // A shell that ignores SIGTERM and starts a grandchild that does too.
        let mut command = Command::new("sh");
        command.args(["-c", "trap '' TERM; sleep 1000 & echo $!; wait"]);
        command.stdout(std::process::Stdio::piped());
        let mut job = Supervised::spawn(&mut command).expect("spawned");
        let mut line = String::new();
        use std::io::BufRead;
        let stdout = job.child().stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("grandchild pid");
        let grandchild: u32 = line.trim().parse().expect("a pid");
        let leader = job.child().id();
        assert!(alive(grandchild));
        let started = Instant::now();
        job.end_group(Duration::from_millis(300));
        job.done = true;
        assert!(started.elapsed() < Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(5);
        while (alive(grandchild) || alive(leader)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(leader), "the leader outlived the group's SIGKILL");
        assert!(
            !alive(grandchild),
            "the grandchild outlived the group's SIGKILL"
        );
    }
}
