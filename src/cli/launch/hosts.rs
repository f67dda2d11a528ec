//! The DeepSpeed launcher's resource syntax: a hostfile of `host slots=N` lines (`#` starts a
//! comment), narrowed by `--include`/`--exclude` filters such as `node1:0,1@node2` (every slot
//! of `node2`, slots 0 and 1 of `node1`), then by `--num_nodes`/`--num_gpus`, which may not
//! ask for more hosts or slots than there are.

use std::fmt;

/// One host and the slot indices (GPUs, or CPU ranks) used on it, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its name or address.
    pub name: String,
    /// The slots used.
    pub slots: Vec<usize>,
}

/// Why a hostfile or a filter is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostsError {
    /// A hostfile line is not `host slots=N`.
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The text.
        text: String,
    },
    /// A host appears twice in the hostfile.
    Duplicate {
        /// The host.
        host: String,
        /// 1-based line number of the second appearance.
        line: usize,
    },
    /// A filter names a host that is not in the hostfile.
    UnknownHost {
        /// The flag (`--include` or `--exclude`).
        flag: &'static str,
        /// The host.
        host: String,
    },
    /// A filter names a slot the host does not have.
    NoSuchSlot {
        /// The flag.
        flag: &'static str,
        /// The host.
        host: String,
        /// The slot asked for.
        slot: usize,
        /// The host's slots.
        slots: usize,
    },
    /// A filter is not `host[:slot,slot...]@...`.
    BadFilter {
        /// The flag.
        flag: &'static str,
        /// Its value.
        value: String,
    },
    /// `--num_gpus` asks for more ranks than a host has slots.
    TooManyRanks {
        /// The host.
        host: String,
        /// Ranks asked for.
        asked: usize,
        /// Its slots.
        slots: usize,
    },
    /// `--num_nodes` asks for more hosts than are listed.
    TooManyNodes {
        /// Hosts asked for.
        asked: usize,
        /// Hosts there are.
        hosts: usize,
    },
    /// Nothing is left to run on.
    Empty,
}

impl fmt::Display for HostsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostsError::BadLine { line, text } => write!(
                f,
                "line {line}: {text:?} is not `HOST slots=N` (a comment starts with #)"
            ),
            HostsError::Duplicate { host, line } => {
                write!(f, "line {line}: host {host} is listed twice")
            }
            HostsError::UnknownHost { flag, host } => {
                write!(
                    f,
                    "{flag} names host {host}, which the hostfile does not list"
                )
            }
            HostsError::NoSuchSlot {
                flag,
                host,
                slot,
                slots,
            } => write!(
                f,
                "{flag} names slot {slot} of {host}, which has {slots} slot(s) (0..{slots})"
            ),
            HostsError::BadFilter { flag, value } => write!(
                f,
                "{flag} {value:?} is not HOST[:SLOT,SLOT...] joined by @ (e.g. node1:0,1@node2)"
            ),
            HostsError::TooManyRanks { host, asked, slots } => write!(
                f,
                "--num_gpus {asked} asks for more ranks than host {host} has slots ({slots}); \
                 ask for at most {slots}"
            ),
            HostsError::TooManyNodes { asked, hosts } => write!(
                f,
                "--num_nodes {asked} asks for more hosts than the {hosts} there are"
            ),
            HostsError::Empty => write!(f, "no host and slot is left to run on"),
        }
    }
}

/// Parses a hostfile: each non-blank line (after removing `#` comments) is `host slots=N`.
pub fn parse_hostfile(text: &str) -> Result<Vec<(String, usize)>, HostsError> {
    let mut hosts: Vec<(String, usize)> = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let bad = || HostsError::BadLine {
            line,
            text: raw.to_string(),
        };
        let mut words = content.split_whitespace();
        let (Some(host), Some(slots), None) = (words.next(), words.next(), words.next()) else {
            return Err(bad());
        };
        let slots: usize = slots
            .strip_prefix("slots=")
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .ok_or_else(bad)?;
        if hosts.iter().any(|(h, _)| h == host) {
            return Err(HostsError::Duplicate {
                host: host.to_string(),
                line,
            });
        }
        hosts.push((host.to_string(), slots));
    }
    Ok(hosts)
}

/// A parsed filter: hosts with the slots named (`None`: all of them).
type Filter = Vec<(String, Option<Vec<usize>>)>;

fn parse_filter(flag: &'static str, value: &str) -> Result<Filter, HostsError> {
    let bad = || HostsError::BadFilter {
        flag,
        value: value.to_string(),
    };
    value
        .split('@')
        .map(|part| {
            let part = part.trim();
            let (host, slots) = match part.split_once(':') {
                Some((host, slots)) => {
                    let slots = slots
                        .split(',')
                        .map(|s| s.trim().parse::<usize>().map_err(|_| bad()))
                        .collect::<Result<Vec<_>, _>>()?;
                    (host, Some(slots))
                }
                None => (part, None),
            };
            if host.is_empty() {
                return Err(bad());
            }
            Ok((host.to_string(), slots))
        })
        .collect()
}

/// The hosts and slots to run on: the hostfile's, narrowed by `include` or `exclude` (at most
/// one of them), then to the first `num_nodes` hosts and the first `num_gpus` slots of each.
pub fn select(
    hostfile: &[(String, usize)],
    include: Option<&str>,
    exclude: Option<&str>,
    num_nodes: Option<usize>,
    num_gpus: Option<usize>,
) -> Result<Vec<Host>, HostsError> {
    let mut hosts: Vec<Host> = hostfile
        .iter()
        .map(|(name, slots)| Host {
            name: name.clone(),
            slots: (0..*slots).collect(),
        })
        .collect();
    let check = |flag: &'static str, filter: &Filter| -> Result<(), HostsError> {
        for (host, slots) in filter {
            let Some((_, count)) = hostfile.iter().find(|(h, _)| h == host) else {
                return Err(HostsError::UnknownHost {
                    flag,
                    host: host.clone(),
                });
            };
            if let Some(&slot) = slots.iter().flatten().find(|&&s| s >= *count) {
                return Err(HostsError::NoSuchSlot {
                    flag,
                    host: host.clone(),
                    slot,
                    slots: *count,
                });
            }
        }
        Ok(())
    };
    if let Some(include) = include {
        let filter = parse_filter("--include", include)?;
        check("--include", &filter)?;
        hosts = filter
            .into_iter()
            .map(|(name, slots)| {
                let all = hosts
                    .iter()
                    .find(|h| h.name == name)
                    .map(|h| h.slots.clone())
                    .unwrap_or_default();
                Host {
                    name,
                    slots: slots.unwrap_or(all),
                }
            })
            .collect();
    }
    if let Some(exclude) = exclude {
        let filter = parse_filter("--exclude", exclude)?;
        check("--exclude", &filter)?;
        for (name, slots) in filter {
            match slots {
                None => hosts.retain(|h| h.name != name),
                Some(slots) => {
                    for host in hosts.iter_mut().filter(|h| h.name == name) {
                        host.slots.retain(|s| !slots.contains(s));
                    }
                }
            }
        }
        hosts.retain(|h| !h.slots.is_empty());
    }
    if let Some(n) = num_nodes {
        if n > hosts.len() {
            return Err(HostsError::TooManyNodes {
                asked: n,
                hosts: hosts.len(),
            });
        }
        hosts.truncate(n);
    }
    if let Some(n) = num_gpus {
        for host in &mut hosts {
            if n > host.slots.len() {
                return Err(HostsError::TooManyRanks {
                    host: host.name.clone(),
                    asked: n,
                    slots: host.slots.len(),
                });
            }
            host.slots.truncate(n);
        }
    }
    if hosts.iter().all(|h| h.slots.is_empty()) {
        return Err(HostsError::Empty);
    }
    Ok(hosts)
}

/// `.deepspeed_env`: `NAME=value` lines exported to every rank (blank lines and `#` comments
/// skipped).
pub fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, HostsError> {
    let mut vars = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.split_once('=').ok_or(HostsError::BadLine {
            line: index + 1,
            text: raw.to_string(),
        })?;
        vars.push((name.trim().to_string(), value.to_string()));
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTFILE: &str = "# the cluster\nnode1 slots=4\n\nnode2 slots=2 # two GPUs\n";

    fn hosts() -> Vec<(String, usize)> {
        parse_hostfile(HOSTFILE).expect("valid")
    }

    #[test]
    fn more_ranks_or_hosts_than_there_are_is_refused() {
        let error = select(&hosts(), None, None, None, Some(100_000)).expect_err("too many");
        assert_eq!(
            error,
            HostsError::TooManyRanks {
                host: "node1".into(),
                asked: 100_000,
                slots: 4
            }
        );
        assert!(error.to_string().contains("ask for at most 4"), "{error}");
        assert!(matches!(
            select(&hosts(), None, None, Some(3), None),
            Err(HostsError::TooManyNodes { asked: 3, hosts: 2 })
        ));
        assert!(select(&hosts(), Some("node1"), None, None, Some(4)).is_ok());
    }

    #[test]
    fn hostfiles_with_comments() {
        assert_eq!(hosts(), vec![("node1".into(), 4), ("node2".into(), 2)]);
        for bad in [
            "node1",
            "node1 slots=x",
            "node1 slots=0",
            "node1 gpus=2",
            "a slots=1 b",
        ] {
            assert!(
                matches!(
                    parse_hostfile(bad),
                    Err(HostsError::BadLine { line: 1, .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_hostfile("a slots=1\na slots=2"),
            Err(HostsError::Duplicate { line: 2, .. })
        ));
    }

    #[test]
    fn include_and_exclude() {
        let picked = select(&hosts(), Some("node1:0,1@node2"), None, None, None).expect("ok");
        assert_eq!(
            picked,
            vec![
                Host {
                    name: "node1".into(),
                    slots: vec![0, 1]
                },
                Host {
                    name: "node2".into(),
                    slots: vec![0, 1]
                }
            ]
        );
        let left = select(&hosts(), None, Some("node1:1,3@node2"), None, None).expect("ok");
        assert_eq!(
            left,
            vec![Host {
                name: "node1".into(),
                slots: vec![0, 2]
            }]
        );
        assert!(matches!(
            select(&hosts(), Some("node3"), None, None, None),
            Err(HostsError::UnknownHost { .. })
        ));
        let error = select(&hosts(), Some("node2:2"), None, None, None).expect_err("no slot 2");
        assert_eq!(
            error.to_string(),
            "--include names slot 2 of node2, which has 2 slot(s) (0..2)"
        );
        assert!(matches!(
            select(&hosts(), Some("node1:a"), None, None, None),
            Err(HostsError::BadFilter { .. })
        ));
        assert_eq!(
            select(&hosts(), None, Some("node1@node2"), None, None),
            Err(HostsError::Empty)
        );
    }

    #[test]
    fn num_nodes_and_num_gpus_take_the_first() {
        let picked = select(&hosts(), None, None, Some(1), Some(2)).expect("ok");
        assert_eq!(
            picked,
            vec![Host {
                name: "node1".into(),
                slots: vec![0, 1]
            }]
        );
    }

    #[test]
    fn deepspeed_env_files() {
        assert_eq!(
            parse_env_file("# comment\nNCCL_DEBUG=INFO\n\nPATHS=a=b\n").expect("ok"),
            vec![
                ("NCCL_DEBUG".into(), "INFO".into()),
                ("PATHS".into(), "a=b".into())
            ]
        );
        assert!(parse_env_file("novalue").is_err());
    }
}
