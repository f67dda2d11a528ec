//! Which CPUs this process may run on, grouped by NUMA node, from
//! `/sys/devices/system/node/node*/cpulist` and the process's affinity mask.

use std::fmt;
use std::path::Path;

/// One NUMA node's CPUs that this process may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The kernel's node number.
    pub id: usize,
    /// CPU numbers, ascending.
    pub cpus: Vec<usize>,
}

/// Where a [`Topology`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySource {
    /// Read from sysfs.
    Sysfs,
    /// sysfs had no usable node list; one node holding every allowed CPU is assumed.
    SingleNodeFallback {
        /// Why sysfs was not used.
        reason: String,
    },
}

/// The allowed CPUs by node (nodes without allowed CPUs left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Nodes, ascending by id, each with at least one CPU.
    pub nodes: Vec<Node>,
    /// Where this came from.
    pub source: TopologySource,
}

/// A `cpulist` that does not parse (`0-3,8,10-11` is the format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuListError {
    /// The text.
    pub text: String,
}

impl fmt::Display for CpuListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot parse CPU list {:?} (expected ranges such as 0-3,8,10-11)",
            self.text
        )
    }
}

impl std::error::Error for CpuListError {}

/// Parses a kernel CPU list such as `0-3,8,10-11` (an empty list is empty).
pub fn parse_cpulist(text: &str) -> Result<Vec<usize>, CpuListError> {
    let error = || CpuListError {
        text: text.to_string(),
    };
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>(), b.parse::<usize>()),
            None => (part.parse::<usize>(), part.parse::<usize>()),
        };
        let (first, last) = (first.map_err(|_| error())?, last.map_err(|_| error())?);
        if last < first {
            return Err(error());
        }
        cpus.extend(first..=last);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

impl Topology {
    /// This machine's nodes, restricted to the CPUs this process may run on.
    pub fn detect() -> Topology {
        let allowed = allowed_cpus();
        match read_sysfs_nodes(Path::new("/sys/devices/system/node")) {
            Ok(nodes) => Topology::from_nodes(nodes, &allowed),
            Err(reason) => Topology::single_node(allowed, reason),
        }
    }

    /// Nodes (id and CPU list) restricted to `allowed` CPUs; one fallback node of `allowed`
    /// when no node keeps a CPU.
    pub fn from_nodes(nodes: Vec<(usize, Vec<usize>)>, allowed: &[usize]) -> Topology {
        let mut kept: Vec<Node> = nodes
            .into_iter()
            .map(|(id, cpus)| Node {
                id,
                cpus: cpus.into_iter().filter(|c| allowed.contains(c)).collect(),
            })
            .filter(|node| !node.cpus.is_empty())
            .collect();
        kept.sort_by_key(|node| node.id);
        if kept.is_empty() {
            return Topology::single_node(
                allowed.to_vec(),
                "no NUMA node lists an allowed CPU".to_string(),
            );
        }
        Topology {
            nodes: kept,
            source: TopologySource::Sysfs,
        }
    }

    /// One node 0 holding `cpus` (`reason` says why).
    pub fn single_node(cpus: Vec<usize>, reason: String) -> Topology {
        Topology {
            nodes: vec![Node { id: 0, cpus }],
            source: TopologySource::SingleNodeFallback { reason },
        }
    }

    /// Allowed CPUs over all nodes.
    pub fn cpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.cpus.len()).sum()
    }
}

/// `node<N>/cpulist` for every node directory under `dir`.
fn read_sysfs_nodes(dir: &Path) -> Result<Vec<(usize, Vec<usize>)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut nodes = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let path = entry.path().join("cpulist");
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let cpus = parse_cpulist(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        nodes.push((id, cpus));
    }
    if nodes.is_empty() {
        return Err(format!("{} lists no node", dir.display()));
    }
    Ok(nodes)
}

/// The CPUs this process may run on (its affinity mask), or `0..available_parallelism`.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `set` is a plain bit set the kernel fills; size passed is its own.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect();
                if !cpus.is_empty() {
                    return cpus;
                }
            }
        }
    }
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..n).collect()
}

/// Pins the calling thread to `cpu`; `false` where that is not possible.
pub fn pin_current_thread(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: as in `allowed_cpus`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse_and_bad_ones_are_errors() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n").ok(),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("").ok(), Some(vec![]));
        assert!(parse_cpulist("3-1").is_err());
        assert!(parse_cpulist("a-b").is_err());
    }

    #[test]
    fn nodes_keep_only_allowed_cpus() {
        let topo = Topology::from_nodes(
            vec![(1, vec![4, 5, 6, 7]), (0, vec![0, 1, 2, 3])],
            &[1, 2, 5],
        );
        assert_eq!(topo.source, TopologySource::Sysfs);
        assert_eq!(
            topo.nodes,
            vec![
                Node {
                    id: 0,
                    cpus: vec![1, 2]
                },
                Node {
                    id: 1,
                    cpus: vec![5]
                }
            ]
        );
        let none = Topology::from_nodes(vec![(0, vec![0])], &[3]);
        assert!(matches!(
            none.source,
            TopologySource::SingleNodeFallback { .. }
        ));
        assert_eq!(none.nodes[0].cpus, vec![3]);
    }

    #[test]
    fn this_machine_has_at_least_one_node_with_a_cpu() {
        let topo = Topology::detect();
        assert!(topo.cpu_count() >= 1, "{topo:?}");
    }
}
