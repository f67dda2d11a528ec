//! A sample of the front-end fuzz shapes (`planner/tests/front_end_fuzz.rs`) through the
//! binary: `validate` and `resolve` must exit 0, 1 or 2 (never a panic's 101 or a signal),
//! within a time limit, and print no raw control character.

use std::path::PathBuf;
use std::time::Duration;

use assert_cmd::Command;

fn cases(dir: &tempfile::TempDir) -> Vec<PathBuf> {
    let mut duplicates = String::from("{");
    // Issue 33: enough duplicates that an uncapped report runs to megabytes.
    for _ in 0..50_000 {
        duplicates.push_str("\"gradient_clipping\": 1.0, ");
    }
    duplicates.push('}');
    let texts: Vec<(&str, Vec<u8>)> = vec![
        ("huge.json", format!("{{\"a\": \"{}\"}}", "x".repeat(4 << 20)).into_bytes()),
        ("deep.json", format!("{{\"a\": {}1{}}}", "[".repeat(5000), "]".repeat(5000)).into_bytes()),
        ("dups.json", duplicates.into_bytes()),
        ("escape.json", b"{\"\\u001b]0;pwned\\u0007\": {\"\\u009b2J\": 1}}".to_vec()),
        ("raw.json", b"{\"a\": 1,\x1b[2J\x07 \x9b}".to_vec()),
        ("zeros.json", vec![0; 1024]),
        ("empty.json", Vec::new()),
        ("number.json", b"{\"train_batch_size\": 1e400}".to_vec()),
        ("big-int.json", b"{\"train_micro_batch_size_per_gpu\": 18446744073709551616}".to_vec()),
        ("alias.json", br#"{"train_batch_size": 8, "zero_optimization": {"stage": 3, "max_live_parameters": 1, "stage3_max_live_parameters": 2}}"#.to_vec()),
        ("auto.json", br#"{"train_batch_size": "auto", "fp16": {"enabled": "auto", "loss_scale": 4, "hysteresis": 1}}"#.to_vec()),
        ("cut.json", br#"{"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr""#.to_vec()),
        ("closed.json", br#"{"train_batch_size": 8, "autotuning": {"enabeld": true, "model_info": {"num_layer": 2}}, "timers": {"throughputs": {}}, "checkpoint": {"writer": {"decouple": true}}, "optimizer": {"type": "AdamW", "param": {"lr": 1}}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_mom": 1.5, "decay_lr_rate": -1, "cycle_min_lr": -1}}, "pipeline": {"pipe_partitoned": true, "chunks": 4}, "expert_parallel": {"autoep_sise": 2}, "aio": {"block_size": 0, "queue_depth": 0, "intra_op_parallelism": 0}}"#.to_vec()),
        // Issue 33: the short-name stage-3 autos and fp16 hysteresis 0.
        ("issue33.json", br#"{"train_batch_size": 8, "fp16": {"enabled": true, "hysteresis": 0}, "zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto", "param_persistence_threshold": "auto"}}"#.to_vec()),
        // Issue 33: a path with terminal escapes.
        ("\u{1b}]0;pwned\u{7}\u{1b}[2J.json", br#"{"train_batch_size": 8}"#.to_vec()),
        ("nested.json", br#"{"train_batch_size": 8, "zero_optimization": {"stage": 3, "sub_group_size": 0, "offload_optimizer": {"device": "cpu", "buffer_count": -1}}}"#.to_vec()),
    ];
    let mut paths: Vec<PathBuf> = texts
        .into_iter()
        .map(|(name, bytes)| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).expect("write");
            path
        })
        .collect();
    paths.push(dir.path().to_path_buf()); // a directory
    paths.push(dir.path().join("missing.json"));
    let fifo = dir.path().join("pipe.json");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        paths.push(fifo);
    }
    paths
}

#[test]
fn every_sample_exits_0_1_or_2_and_prints_no_control_character() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = cases(&dir);
    let mut runs = 0;
    for path in &paths {
        let file = path.to_str().expect("utf-8").to_string();
        for args in [
            vec!["validate".to_string(), file.clone()],
            vec![
                "resolve".to_string(),
                file.clone(),
                "--world-size".to_string(),
                "2".to_string(),
            ],
        ] {
            let output = Command::cargo_bin("dsplan")
                .expect("binary")
                .timeout(Duration::from_secs(60))
                .args(&args)
                .output()
                .expect("runs");
            let code = output.status.code();
            assert!(matches!(code, Some(0..=2)), "{args:?}: exit {code:?}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !stderr.chars().any(|c| c.is_control() && c != '\n'),
                "{args:?}: {stderr:?}"
            );
            // Every diagnostic kind is capped: a page of output, whatever the input.
            assert!(
                output.stdout.len() + output.stderr.len() < 2_000_000,
                "{args:?}: {} bytes",
                output.stdout.len() + output.stderr.len()
            );
            runs += 1;
        }
    }
    eprintln!("front-end fuzz through the binary: {runs} runs");
    assert!(runs >= 32, "{runs}");
}
