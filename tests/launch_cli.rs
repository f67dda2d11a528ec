//! `dsplan launch` refuses a job larger than its hosts before starting anything, and the
//! `mpirun` it starts dies with it. A stand-in `mpirun` (a shell script first on `PATH`) records
//! that it started and then spins ignoring SIGTERM, as a real one does while it starts
//! thousands of ranks.

use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::config_path;

/// A directory holding the stand-in `mpirun`, which writes its pid to `started` and spins.
fn fake_mpirun(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).expect("dir");
    let started = dir.join("started");
    let script = bin.join("mpirun");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             if [ \"$1\" = --version ]; then echo 'stand-in mpirun'; exit 0; fi\n\
             echo $$ > {}\n\
             trap '' TERM\n\
             while :; do sleep 0.1; done\n",
            started.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (bin, started)
}

fn launch(bin: &Path, args: &[&str]) -> Process {
    let mut command = Process::new(env!("CARGO_BIN_EXE_dsplan"));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    command
        .arg("launch")
        .args(args)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

#[cfg(target_os = "linux")]
#[test]
fn more_ranks_than_slots_is_refused_at_once_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (bin, started) = fake_mpirun(dir.path());
    let config = config_path("zero0_fp32.json");
    let hostfile = dir.path().join("hostfile");
    std::fs::write(&hostfile, "localhost slots=2\n").expect("hostfile");
    for args in [
        vec!["--num_gpus", "100000", config.as_str()],
        vec![
            "--hostfile",
            hostfile.to_str().expect("utf-8"),
            "--num_gpus",
            "3",
            config.as_str(),
        ],
    ] {
        let begun = Instant::now();
        let mut child = launch(&bin, &args).spawn().expect("spawned");
        // The old launch started mpirun here and never returned: bounded by a kill.
        let deadline = begun + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("waited") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{args:?}: launch still runs after 20 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = begun.elapsed();
        let output = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("asks for more ranks than host"), "{stderr}");
        assert!(!started.exists(), "{args:?}: mpirun was started");
        eprintln!("{args:?}: refused in {:.3} s", took.as_secs_f64());
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_terminated_launch_takes_its_mpirun_with_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (bin, started) = fake_mpirun(dir.path());
    let config = config_path("zero0_fp32.json");
    let mut child = launch(&bin, &["--num_gpus", "1", &config])
        .spawn()
        .expect("spawned");
    let begun = Instant::now();
    let mpirun: u32 = loop {
        if let Some(pid) = std::fs::read_to_string(&started)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(
            begun.elapsed() < Duration::from_secs(20),
            "mpirun never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(alive(mpirun));
    let killed = Process::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let stopping = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waited") {
            break status;
        }
        if stopping.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("launch ignored SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stopped by a signal"), "{stderr}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(mpirun) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!alive(mpirun), "mpirun outlived launch");
    eprintln!(
        "launch and its SIGTERM-ignoring mpirun ended {:.2} s after SIGTERM",
        stopping.elapsed().as_secs_f64()
    );
}
