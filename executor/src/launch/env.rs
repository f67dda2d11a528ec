//! Where this process sits in a job of several processes, read from the launcher's environment.
//!
//! | launcher | rank | world size | local rank | local world size | master |
//! |---|---|---|---|---|---|
//! | torchrun, `deepspeed` | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` | `MASTER_ADDR`, `MASTER_PORT` |
//! | `mpirun` (Open MPI) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` | `MASTER_ADDR` if exported |
//! | `mpirun`/`mpiexec` (MPICH, Intel MPI) | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` | `MASTER_ADDR` if exported |
//! | `srun` (Slurm) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` | `SLURM_NTASKS_PER_NODE` (when one number) | `MASTER_ADDR`, else the first host of `SLURM_JOB_NODELIST` |
//!
//! * Where several launchers' variables are set, every value they give for the same quantity must
//!   agree; a disagreement is [`LaunchEnvError::Conflict`], naming both variables.
//! * Slurm's variables count only when no other launcher's are set: `srun torchrun ...` and
//!   `mpirun` inside an allocation leave the step's `SLURM_PROCID` (a node's index, or 0) in every
//!   process, and the launcher that started the process is the one to believe.
//! * `MASTER_PORT` defaults to 29500 (torch's and DeepSpeed's default). `MASTER_ADDR` is required
//!   of torchrun jobs of more than one process; MPI needs no address (collectives go over MPI),
//!   so under `mpirun` it is `None` unless exported.
//! * With none of the rank variables set, the process is a job of one.

use std::fmt;

use super::nodelist::first_host;

/// torch's and DeepSpeed's default rendezvous port.
pub const DEFAULT_MASTER_PORT: u16 = 29_500;

/// Which launcher's variables describe the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: a job of one.
    Single,
    /// torchrun or the DeepSpeed launcher (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// MPICH's or Intel MPI's process manager (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`).
    Slurm,
}

impl Launcher {
    /// How the launcher is called in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Launcher::Single => "no launcher",
            Launcher::Torchrun => "torchrun / the deepspeed launcher",
            Launcher::OpenMpi => "mpirun (Open MPI)",
            Launcher::Pmi => "mpirun (MPICH / Intel MPI)",
            Launcher::Slurm => "srun (Slurm)",
        }
    }

    /// Whether the processes were started by an MPI process manager, so `MPI_Init` finds the
    /// whole job.
    pub const fn is_mpi(self) -> bool {
        matches!(self, Launcher::OpenMpi | Launcher::Pmi)
    }
}

/// The variables one launcher sets.
struct Source {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: &'static str,
}

/// In order of precedence: the first whose variables are set names the launcher.
const SOURCES: [Source; 4] = [
    Source {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: "LOCAL_WORLD_SIZE",
    },
    Source {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    },
    Source {
        launcher: Launcher::Pmi,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: "MPI_LOCALNRANKS",
    },
    Source {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: "SLURM_NTASKS_PER_NODE",
    },
];

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// The launcher whose variables were read.
    pub launcher: Launcher,
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes.
    pub world_size: usize,
    /// Rank on this node: the GPU ordinal this process uses.
    pub local_rank: usize,
    /// Processes on this node, when the launcher says.
    pub local_world_size: Option<usize>,
    /// Host of rank 0's rendezvous listener (`None` under MPI without `MASTER_ADDR`).
    pub master_addr: Option<String>,
    /// Its port.
    pub master_port: u16,
}

/// Why the environment does not describe a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchEnvError {
    /// A variable that must accompany another is missing.
    Missing {
        /// The variable missing.
        name: &'static str,
        /// Why it is needed.
        because: &'static str,
    },
    /// A variable is not a valid number (or host list).
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// Two launchers' variables give different values for the same quantity.
    Conflict {
        /// The variable read first.
        name: &'static str,
        /// Its value.
        value: usize,
        /// The variable that disagrees.
        other_name: &'static str,
        /// Its value.
        other_value: usize,
    },
    /// The rank is not below the world size (or the world is empty).
    RankOutOfRange {
        /// The rank.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
}

impl fmt::Display for LaunchEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchEnvError::Missing { name, because } => {
                write!(f, "environment variable {name} is not set ({because})")
            }
            LaunchEnvError::Invalid { name, value } => {
                write!(f, "environment variable {name}={value:?} is not valid")
            }
            LaunchEnvError::Conflict {
                name,
                value,
                other_name,
                other_value,
            } => write!(
                f,
                "{name}={value} but {other_name}={other_value}; two launchers' variables \
                 disagree about this process (unset the stale ones)"
            ),
            LaunchEnvError::RankOutOfRange { rank, world_size } => write!(
                f,
                "rank {rank} is not a rank of a world of {world_size} process(es)"
            ),
        }
    }
}

impl std::error::Error for LaunchEnvError {}

/// One quantity as read from every launcher that sets it: the first value and its variable.
type Reading = Option<(&'static str, usize)>;

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_process_env() -> Result<Self, LaunchEnvError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Whether this process was started as one of several.
    pub fn is_multi_process(&self) -> bool {
        self.world_size > 1
    }

    /// Reads variables through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchEnvError> {
        let lookup = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let number = |name: &'static str| -> Result<Option<usize>, LaunchEnvError> {
            match lookup(name) {
                None => Ok(None),
                Some(value) => value
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| LaunchEnvError::Invalid { name, value }),
            }
        };
        let sets = |s: &Source| lookup(s.rank).is_some() || lookup(s.size).is_some();
        let primary_set = SOURCES[..3].iter().any(sets);
        let sources: Vec<&Source> = SOURCES
            .iter()
            .filter(|s| s.launcher != Launcher::Slurm || !primary_set)
            .collect();
        let launcher = sources
            .iter()
            .find(|s| sets(s))
            .map_or(Launcher::Single, |s| s.launcher);
        // Reads one quantity from every source; all values present must agree.
        let agreed = |pick: fn(&Source) -> &'static str| -> Result<Reading, LaunchEnvError> {
            let mut first: Reading = None;
            for source in &sources {
                let name = pick(source);
                if source.launcher == Launcher::Slurm && name == "SLURM_NTASKS_PER_NODE" {
                    continue; // read below: it may be a list such as "2(x3)"
                }
                let Some(value) = number(name)? else { continue };
                match first {
                    None => first = Some((name, value)),
                    Some((first_name, first_value)) if first_value != value => {
                        return Err(LaunchEnvError::Conflict {
                            name: first_name,
                            value: first_value,
                            other_name: name,
                            other_value: value,
                        });
                    }
                    Some(_) => {}
                }
            }
            Ok(first)
        };
        let rank = agreed(|s| s.rank)?;
        let world = agreed(|s| s.size)?;
        let local = agreed(|s| s.local_rank)?;
        let mut local_size = agreed(|s| s.local_size)?.map(|(_, v)| v);
        if launcher == Launcher::Slurm && local_size.is_none() {
            // One number when every node runs the same count, else a list: then unknown.
            local_size = lookup("SLURM_NTASKS_PER_NODE").and_then(|v| v.trim().parse().ok());
        }
        let (rank, world_size) = match (rank, world) {
            (Some((_, rank)), Some((_, world))) => (rank, world),
            (None, None) => (0, 1),
            (Some((name, _)), None) => {
                return Err(LaunchEnvError::Missing {
                    name: size_of(name),
                    because: "the rank is set but not the world size",
                });
            }
            (None, Some((name, _))) => {
                return Err(LaunchEnvError::Missing {
                    name: rank_of(name),
                    because: "the world size is set but not the rank",
                });
            }
        };
        if rank >= world_size {
            return Err(LaunchEnvError::RankOutOfRange { rank, world_size });
        }
        let master_addr = match lookup("MASTER_ADDR") {
            Some(addr) => Some(addr.trim().to_string()),
            None if world_size == 1 => Some("127.0.0.1".to_string()),
            None => match launcher {
                Launcher::Slurm => {
                    let (name, list) = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                        .into_iter()
                        .find_map(|name| lookup(name).map(|v| (name, v)))
                        .ok_or(LaunchEnvError::Missing {
                            name: "SLURM_JOB_NODELIST",
                            because: "srun names the master by the job's first host",
                        })?;
                    Some(first_host(&list).ok_or(LaunchEnvError::Invalid { name, value: list })?)
                }
                Launcher::OpenMpi | Launcher::Pmi => None,
                Launcher::Torchrun | Launcher::Single => {
                    return Err(LaunchEnvError::Missing {
                        name: "MASTER_ADDR",
                        because: "the job has more than one process",
                    });
                }
            },
        };
        let master_port = match lookup("MASTER_PORT") {
            None => DEFAULT_MASTER_PORT,
            Some(value) => value.trim().parse().map_err(|_| LaunchEnvError::Invalid {
                name: "MASTER_PORT",
                value,
            })?,
        };
        Ok(LaunchEnv {
            launcher,
            rank,
            world_size,
            // A job of one on a machine: the rank is the GPU. Otherwise the launcher must say.
            local_rank: local.map_or(if world_size == 1 { 0 } else { rank }, |(_, v)| v),
            local_world_size: local_size,
            master_addr,
            master_port,
        })
    }
}

/// The world-size variable of the launcher whose rank variable is `rank_name`.
fn size_of(rank_name: &'static str) -> &'static str {
    SOURCES
        .iter()
        .find(|s| s.rank == rank_name)
        .map_or("WORLD_SIZE", |s| s.size)
}

/// The rank variable of the launcher whose world-size variable is `size_name`.
fn rank_of(size_name: &'static str) -> &'static str {
    SOURCES
        .iter()
        .find(|s| s.size == size_name)
        .map_or("RANK", |s| s.rank)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv, LaunchEnvError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn torchrun_variables() {
        let parsed = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "12345"),
        ]);
        assert_eq!(
            parsed,
            Ok(LaunchEnv {
                launcher: Launcher::Torchrun,
                rank: 3,
                world_size: 8,
                local_rank: 1,
                local_world_size: Some(4),
                master_addr: Some("node0".to_string()),
                master_port: 12345
            })
        );
    }

    #[test]
    fn open_mpi_variables_and_defaults() {
        let parsed = env(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ])
        .expect("valid");
        assert_eq!(parsed.launcher, Launcher::OpenMpi);
        assert_eq!(
            (
                parsed.rank,
                parsed.world_size,
                parsed.local_rank,
                parsed.local_world_size
            ),
            (5, 16, 1, Some(4))
        );
        assert_eq!(parsed.master_port, DEFAULT_MASTER_PORT);
        assert_eq!(parsed.master_addr, None, "MPI needs no address");
        // Both styles set and agreeing is fine; disagreeing is an error naming both.
        assert!(
            env(&[
                ("RANK", "1"),
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
            ])
            .is_ok()
        );
        let conflict = env(&[
            ("RANK", "1"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
        ])
        .expect_err("conflict")
        .to_string();
        assert!(
            conflict.contains("RANK=1") && conflict.contains("OMPI_COMM_WORLD_RANK=0"),
            "{conflict}"
        );
    }

    #[test]
    fn mpich_and_intel_mpi_variables() {
        let parsed = env(&[
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("MPI_LOCALRANKID", "0"),
            ("MPI_LOCALNRANKS", "1"),
            ("MASTER_ADDR", "10.1.0.1"),
        ])
        .expect("valid");
        assert_eq!(parsed.launcher, Launcher::Pmi);
        assert!(parsed.launcher.is_mpi());
        assert_eq!(
            (parsed.rank, parsed.world_size, parsed.local_rank),
            (2, 3, 0)
        );
        assert_eq!(parsed.master_addr.as_deref(), Some("10.1.0.1"));
        let conflict = env(&[
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("PMI_RANK", "0"),
        ])
        .expect_err("conflict")
        .to_string();
        assert!(
            conflict.contains("OMPI_COMM_WORLD_SIZE=4") && conflict.contains("PMI_SIZE=2"),
            "{conflict}"
        );
    }

    #[test]
    fn slurm_variables_name_the_first_host_the_master() {
        let parsed = env(&[
            ("SLURM_PROCID", "4"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS_PER_NODE", "2"),
            ("SLURM_JOB_NODELIST", "node[01-03],gpu5"),
        ])
        .expect("valid");
        assert_eq!(
            parsed,
            LaunchEnv {
                launcher: Launcher::Slurm,
                rank: 4,
                world_size: 6,
                local_rank: 1,
                local_world_size: Some(2),
                master_addr: Some("node01".to_string()),
                master_port: DEFAULT_MASTER_PORT,
            }
        );
        // An uneven task count per node is a list: the local world is then unknown.
        let uneven = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_NTASKS_PER_NODE", "2,1"),
            ("SLURM_JOB_NODELIST", "gpu5"),
        ])
        .expect("valid");
        assert_eq!(uneven.local_world_size, None);
        assert_eq!(uneven.master_addr.as_deref(), Some("gpu5"));
        // MASTER_ADDR wins over the node list.
        let named = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "a[1-2]"),
            ("MASTER_ADDR", "b"),
        ])
        .expect("valid");
        assert_eq!(named.master_addr.as_deref(), Some("b"));
        assert!(matches!(
            env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]),
            Err(LaunchEnvError::Missing {
                name: "SLURM_JOB_NODELIST",
                ..
            })
        ));
        assert!(matches!(
            env(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_JOB_NODELIST", "a[1-"),
            ]),
            Err(LaunchEnvError::Invalid {
                name: "SLURM_JOB_NODELIST",
                ..
            })
        ));
    }

    #[test]
    fn another_launcher_inside_an_allocation_overrides_slurm() {
        // `srun torchrun`: SLURM_PROCID is the node's index, RANK the process's.
        let parsed = env(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("MASTER_ADDR", "n0"),
        ])
        .expect("valid");
        assert_eq!(
            (parsed.launcher, parsed.rank, parsed.world_size),
            (Launcher::Torchrun, 5, 8)
        );
    }

    #[test]
    fn a_job_of_one_needs_nothing() {
        assert_eq!(
            env(&[]),
            Ok(LaunchEnv {
                launcher: Launcher::Single,
                rank: 0,
                world_size: 1,
                local_rank: 0,
                local_world_size: None,
                master_addr: Some("127.0.0.1".to_string()),
                master_port: DEFAULT_MASTER_PORT
            })
        );
    }

    #[test]
    fn bad_environments_are_errors() {
        assert!(matches!(
            env(&[("RANK", "0")]),
            Err(LaunchEnvError::Missing {
                name: "WORLD_SIZE",
                ..
            })
        ));
        assert!(matches!(
            env(&[("OMPI_COMM_WORLD_SIZE", "2")]),
            Err(LaunchEnvError::Missing {
                name: "OMPI_COMM_WORLD_RANK",
                ..
            })
        ));
        assert!(matches!(
            env(&[("RANK", "0"), ("WORLD_SIZE", "2")]),
            Err(LaunchEnvError::Missing {
                name: "MASTER_ADDR",
                ..
            })
        ));
        assert_eq!(
            env(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]),
            Err(LaunchEnvError::RankOutOfRange {
                rank: 2,
                world_size: 2
            })
        );
        assert!(matches!(
            env(&[("RANK", "x"), ("WORLD_SIZE", "2")]),
            Err(LaunchEnvError::Invalid { name: "RANK", .. })
        ));
        assert!(matches!(
            env(&[("MASTER_PORT", "70000")]),
            Err(LaunchEnvError::Invalid {
                name: "MASTER_PORT",
                ..
            })
        ));
        assert!(matches!(
            env(&[("RANK", "0"), ("WORLD_SIZE", "0")]),
            Err(LaunchEnvError::RankOutOfRange { .. })
        ));
    }
}
