//! [`process_alive`]: whether the process that left a file behind (its PID in the file's name:
//! a temporary file, a checkpoint's staging directory, an NVMe swap directory) still runs, so
//! that what a killed run left can be swept and what a running one writes is left alone.

/// Whether process `pid` exists. Only Linux is asked (`/proc/PID`); elsewhere every process
/// counts as running, so nothing is swept.
pub fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    if cfg!(target_os = "linux") {
        std::path::Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_an_impossible_pid_does_not() {
        assert!(process_alive(std::process::id()));
        if cfg!(target_os = "linux") {
            // Above the kernel's largest pid_max (2^22).
            assert!(!process_alive(99_999_999));
        }
    }
}
