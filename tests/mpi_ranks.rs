//! Ranks as processes under `mpirun` (feature `mpi`): the same run as ranks as threads, bit for
//! bit, at every stage, precision and world size; checkpoints written by processes resumed by
//! processes and by threads; a rank killed mid-step takes the job down, naming it.
//!
//! Every test skips with a message when `mpirun` is not installed.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

fn dsplan_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("dsplan")
}

/// `mpirun` and the flags this machine needs, or `None` (with a message) when it is missing.
fn mpirun() -> Option<Vec<String>> {
    let version = match Command::new("mpirun").arg("--version").output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => {
            eprintln!("skipping: mpirun not found ({e}); install openmpi-bin");
            return None;
        }
    };
    let mut args = vec!["mpirun".to_string()];
    if version.contains("Open MPI") {
        // Tests run as root in CI containers, and 4 ranks on 2 cores.
        args.extend(["--allow-run-as-root", "--oversubscribe"].map(String::from));
    }
    Some(args)
}

fn config(dir: &Path, stage: u8, precision: &str) -> String {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage},
    });
    if stage == 3 {
        config["zero_optimization"]["stage3_param_persistence_threshold"] = json!(0);
    }
    match precision {
        "bf16" => config["bf16"] = json!({"enabled": true}),
        "fp16" => config["fp16"] = json!({"enabled": true, "initial_scale_power": 8}),
        _ => {}
    }
    let path = dir.join(format!("zero{stage}_{precision}.json"));
    std::fs::write(&path, config.to_string()).expect("config written");
    path.display().to_string()
}

/// The arguments of a short run writing its model to `model`.
fn run_args(config: &str, steps: u64, model: &Path) -> Vec<String> {
    [
        "run",
        config,
        "--steps",
        &steps.to_string(),
        "--seq-len",
        "16",
        "--device",
        "cpu",
        "--save-model",
        model.to_str().expect("utf-8"),
    ]
    .map(String::from)
    .to_vec()
}

fn checked(output: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}): {stderr}",
        output.status
    );
    stderr
}

fn threads(world: usize, args: &[String]) -> String {
    let output = Command::new(dsplan_bin())
        .args(args)
        .args(["--world-size", &world.to_string()])
        .output()
        .expect("dsplan runs");
    checked(output, &format!("{world} threads"))
}

fn processes(mpirun: &[String], world: usize, args: &[String]) -> String {
    let output = Command::new(&mpirun[0])
        .args(&mpirun[1..])
        .args(["-np", &world.to_string()])
        .arg(dsplan_bin())
        .args(args)
        .output()
        .expect("mpirun runs");
    checked(output, &format!("{world} processes"))
}

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// For every stage and precision: the model trained by `world` processes is byte for byte the
/// model trained by `world` threads; rank 0 alone prints the header and progress.
fn processes_equal_threads(world: usize) {
    let Some(mpirun) = mpirun() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    for stage in 0..=3u8 {
        for precision in ["fp32", "bf16", "fp16"] {
            let config = config(dir.path(), stage, precision);
            let by_threads = dir.path().join("threads.safetensors");
            let by_processes = dir.path().join("processes.safetensors");
            let thread_log = threads(world, &run_args(&config, 3, &by_threads));
            let process_log = processes(&mpirun, world, &run_args(&config, 3, &by_processes));
            assert!(
                bytes(&by_threads) == bytes(&by_processes),
                "stage {stage} {precision} W={world}: processes differ from threads"
            );
            assert_eq!(
                process_log.matches("dsplan run ").count(),
                1,
                "rank 0 alone prints the header: {process_log}"
            );
            assert!(
                process_log.contains(&format!("{world} process rank(s)")),
                "{process_log}"
            );
            // The same progress lines, in today's format (tokens/s and times aside).
            let progress = |log: &str| -> Vec<String> {
                log.lines()
                    .filter(|l| l.starts_with("[Rank 0] step="))
                    .map(|l| l.split(", tokens/s").next().unwrap_or(l).to_string())
                    .collect()
            };
            assert_eq!(progress(&thread_log).len(), 3, "{thread_log}");
            assert_eq!(progress(&thread_log), progress(&process_log));
        }
    }
}

#[test]
fn two_processes_equal_two_threads_bit_for_bit() {
    processes_equal_threads(2);
}

#[test]
fn three_and_four_processes_equal_threads_bit_for_bit() {
    processes_equal_threads(3);
    processes_equal_threads(4);
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).expect("readable").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                found.push(rel.display().to_string());
            }
        }
    }
    found.sort();
    found
}

#[test]
fn checkpoints_saved_by_processes_resume_as_threads_saved_ones_do() {
    let Some(mpirun) = mpirun() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config(dir.path(), 2, "bf16");
    let model = dir.path().join("model.safetensors");
    let save = |dir_name: &str| -> Vec<String> {
        let mut args = run_args(&config, 2, &model);
        args.extend([
            "--save-checkpoint".to_string(),
            dir.path().join(dir_name).display().to_string(),
        ]);
        args
    };
    threads(2, &save("by_threads"));
    processes(&mpirun, 2, &save("by_processes"));
    // Today's layout: the same files, each rank's written by that rank.
    let layout = files_under(&dir.path().join("by_threads"));
    assert!(
        layout
            .iter()
            .any(|f| f.contains("rank_1") || f.contains("rank1") || f.contains("_1_")),
        "{layout:?}"
    );
    assert_eq!(layout, files_under(&dir.path().join("by_processes")));

    let resume = |from: &str, out: &Path| -> Vec<String> {
        let mut args = run_args(&config, 4, out);
        args.extend([
            "--resume".to_string(),
            dir.path().join(from).display().to_string(),
        ]);
        args
    };
    for (world, by_processes) in [(3, true), (2, false)] {
        let expected = dir.path().join(format!("expected{world}.safetensors"));
        let found = dir.path().join(format!("found{world}.safetensors"));
        threads(world, &resume("by_threads", &expected));
        if by_processes {
            processes(&mpirun, world, &resume("by_processes", &found));
        } else {
            threads(world, &resume("by_processes", &found));
        }
        assert!(
            bytes(&expected) == bytes(&found),
            "resumed at W={world} (processes: {by_processes}) differs from today's thread resume"
        );
    }
}

/// The pids of `parent`'s children, read from /proc.
fn children(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the fields after the last ')'.
        let after = stat.rsplit(')').next().unwrap_or("");
        let ppid = after.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(parent) {
            found.push(pid);
        }
    }
    found
}

/// The `OMPI_COMM_WORLD_RANK` of a process.
fn mpi_rank(pid: u32) -> Option<usize> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find_map(|v| v.strip_prefix("OMPI_COMM_WORLD_RANK="))
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_rank_killed_mid_step_takes_the_job_down_within_30_s_naming_it() {
    let Some(mpirun) = mpirun() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config(dir.path(), 2, "fp32");
    let log = dir.path().join("log.txt");
    let mut job = Command::new(&mpirun[0])
        .args(&mpirun[1..])
        .args(["-np", "3"])
        .arg(dsplan_bin())
        .args(run_args(
            &config,
            100_000,
            &dir.path().join("never.safetensors"),
        ))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("mpirun starts");
    // Wait until training is under way, then kill rank 1.
    let started = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("[Rank 0] step=2")
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no progress: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(
            job.try_wait().expect("waitable").is_none(),
            "job ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ranks: Vec<(u32, usize)> = children(job.id())
        .into_iter()
        .filter_map(|pid| mpi_rank(pid).map(|rank| (pid, rank)))
        .collect();
    assert_eq!(ranks.len(), 3, "three rank processes: {ranks:?}");
    let victim = ranks.iter().find(|(_, r)| *r == 1).expect("rank 1").0;
    let status = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let killed = Instant::now();
    let exit = loop {
        if let Some(exit) = job.try_wait().expect("waitable") {
            break exit;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            let _ = job.kill();
            panic!("the job was still running 30 s after rank 1 was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = killed.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!("job ended {took:?} after rank 1 was killed ({exit})");
    assert!(!exit.success(), "{text}");
    assert!(took < Duration::from_secs(30));
    assert!(text.contains("rank 1"), "the dead rank is named: {text}");
    for (pid, rank) in ranks {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s
                    .rsplit(')')
                    .next()
                    .is_some_and(|a| a.trim_start().starts_with('Z'))),
            "rank {rank} (pid {pid}) still runs"
        );
    }
}

#[test]
fn the_readme_launch_commands_run() {
    let Some(mpirun) = mpirun() else { return };
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let block = readme
        .split("<!-- launch-commands")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the README's launch commands");
    let dir = tempfile::tempdir().expect("temp dir");
    std::os::unix::fs::symlink(format!("{root}/configs"), dir.path().join("configs"))
        .expect("configs linked");
    let bin_dir = dsplan_bin().parent().expect("bin dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let first = line.split_whitespace().next().unwrap_or("");
        if ["apt-get", "cargo", "srun"].contains(&first) {
            continue; // installation, and Slurm (absent here; its environment is unit-tested)
        }
        let command = match line.strip_prefix("mpirun ") {
            Some(rest) => format!("{} {rest}", mpirun.join(" ")),
            None => line.to_string(),
        };
        let output = Command::new("sh")
            .args(["-c", &command])
            .current_dir(dir.path())
            .env("PATH", &path)
            .output()
            .expect("sh runs");
        let stderr = checked(output, line);
        if line.contains(" run ") || line.starts_with("dsplan launch") {
            assert!(stderr.contains("[Rank 0] step=10"), "{line}: {stderr}");
        }
        if line.starts_with("dsplan launch") {
            assert!(
                stderr.contains("[rank 0] [Rank 0] step=10"),
                "rank-prefixed output: {stderr}"
            );
        }
        ran += 1;
    }
    assert_eq!(ran, 4, "the commands run: {block}");
}
