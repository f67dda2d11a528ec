//! Two nodes on one machine (feature `mpi`): two network namespaces joined by a veth pair, each
//! a "node" with its own address and host name. The job is started the way a user starts a
//! two-node job, `dsplan launch --hostfile FILE` on the first node, and mpirun reaches the second
//! through its rsh agent (here a script that enters the other namespace instead of ssh). The
//! model it trains equals, byte for byte, the one-node run.
//!
//! The test makes and removes its namespaces itself, and skips with a message where it may not
//! (not root, no `ip netns`, no `unshare`) or where mpirun is missing.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::json;

/// Two namespaces `<prefix>a`/`<prefix>b` and a veth pair between them; removed on drop.
struct TwoNodes {
    names: [String; 2],
    addresses: [String; 2],
}

impl TwoNodes {
    /// Makes the namespaces, or says why it cannot (the caller skips).
    fn new() -> Result<Self, String> {
        let id = std::process::id() % 50_000;
        let names = [format!("dsn{id}a"), format!("dsn{id}b")];
        // A /24 chosen from the pid, so parallel runs on one host do not meet.
        let subnet = format!("10.{}.{}", 100 + id % 100, (id / 100) % 250);
        let addresses = [format!("{subnet}.1"), format!("{subnet}.2")];
        let nodes = Self { names, addresses };
        let [a, b] = &nodes.names;
        let (veth_a, veth_b) = (format!("dsv{id}a"), format!("dsv{id}b"));
        ip(&["netns", "add", a])?;
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", b],
            vec![
                "link", "add", &veth_a, "type", "veth", "peer", "name", &veth_b,
            ],
            vec!["link", "set", &veth_a, "netns", a],
            vec!["link", "set", &veth_b, "netns", b],
        ];
        for step in &steps {
            ip(step)?;
        }
        for ((ns, veth), address) in [(a, &veth_a), (b, &veth_b)]
            .into_iter()
            .zip(&nodes.addresses)
        {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                veth,
            ])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", veth, "up"])?;
        }
        Ok(nodes)
    }

    /// A command run on node `index`: in its namespace, with its own host name.
    fn on(&self, index: usize, program: &Path) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.names[index]])
            .args(["unshare", "--uts", "sh", "-c"])
            .arg(format!("hostname node{index} && exec \"$@\""))
            .arg("sh")
            .arg(program);
        command
    }

    /// The rsh agent mpirun uses instead of ssh: `agent HOST COMMAND...` runs the command on
    /// the node with that address.
    fn rsh_agent(&self, dir: &Path) -> PathBuf {
        let mut cases = String::new();
        for (index, (name, address)) in self.names.iter().zip(&self.addresses).enumerate() {
            cases.push_str(&format!(
                "  {address}) exec ip netns exec {name} unshare --uts sh -c \"hostname node{index} && exec $*\" ;;\n"
            ));
        }
        let script = format!(
            "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n{cases}  *) echo \"no node $host\" >&2; exit 1 ;;\nesac\n"
        );
        let path = dir.join("rsh_agent.sh");
        std::fs::write(&path, script).expect("agent written");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("agent executable");
        path
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = ip(&["netns", "del", name]); // the veth pair goes with its namespace
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("`ip` cannot run: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn checked(output: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}): {stderr}{stdout}",
        output.status
    );
    stderr
}

#[test]
fn a_job_over_two_network_namespaces_equals_the_one_node_run() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipping: mpirun not found; install openmpi-bin");
        return;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("skipping: unshare (util-linux) not found");
        return;
    }
    let nodes = match TwoNodes::new() {
        Ok(nodes) => nodes,
        Err(why) => {
            eprintln!("skipping: cannot make two network namespaces here ({why}); needs root");
            return;
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("zero2_bf16.json");
    let body = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": true},
    });
    std::fs::write(&config, body.to_string()).expect("config written");
    let hostfile = dir.path().join("hostfile");
    std::fs::write(
        &hostfile,
        format!(
            "# two nodes, one rank each\n{} slots=1\n{} slots=1\n",
            nodes.addresses[0], nodes.addresses[1]
        ),
    )
    .expect("hostfile written");
    let run = |model: &Path| -> Vec<String> {
        let mut args: Vec<String> = [config.to_str(), Some("--steps"), Some("3")]
            .into_iter()
            .flatten()
            .map(String::from)
            .collect();
        args.extend(
            ["--seq-len", "16", "--device", "cpu", "--save-model"]
                .map(String::from)
                .into_iter()
                .chain([model.display().to_string()]),
        );
        args
    };
    let dsplan = assert_cmd::cargo::cargo_bin("dsplan");

    let one_node = dir.path().join("one_node.safetensors");
    let output = Command::new(&dsplan)
        .arg("run")
        .args(run(&one_node))
        .args(["--world-size", "2"])
        .output()
        .expect("dsplan runs");
    checked(output, "the one-node run");

    let two_nodes = dir.path().join("two_nodes.safetensors");
    let subnet = format!("{}/24", nodes.addresses[0]);
    let agent = nodes.rsh_agent(dir.path());
    let output = nodes
        .on(0, &dsplan)
        .args(["launch", "--hostfile"])
        .arg(&hostfile)
        .args(run(&two_nodes))
        // What a user sets in Open MPI's environment for a cluster: the network to use, and
        // here the rsh agent that stands in for ssh. Shared memory cannot join two nodes.
        .env("OMPI_MCA_plm_rsh_agent", &agent)
        .env("OMPI_MCA_oob_tcp_if_include", &subnet)
        .env("OMPI_MCA_btl_tcp_if_include", &subnet)
        .env("OMPI_MCA_btl", "tcp,self")
        .current_dir(dir.path())
        .output()
        .expect("dsplan launch runs");
    let log = checked(output, "dsplan launch on two nodes");
    assert!(
        log.contains(&format!(
            "2 rank(s) on {}:1, {}:1",
            nodes.addresses[0], nodes.addresses[1]
        )),
        "{log}"
    );
    assert!(log.contains("[rank 0] [Rank 0] step=3"), "{log}");
    let (a, b) = (
        std::fs::read(&one_node).expect("one-node model"),
        std::fs::read(&two_nodes).expect("two-node model"),
    );
    assert!(
        a == b,
        "the model trained on two nodes differs from the one-node run"
    );
}
