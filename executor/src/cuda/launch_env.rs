//! Where this process sits in a multi-process (one process per GPU) job, read from the
//! launcher's environment.
//!
//! * torchrun / the DeepSpeed launcher: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`.
//! * Open MPI (`mpirun`): `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//!   `OMPI_COMM_WORLD_LOCAL_RANK`, used when the torch-style variable is unset. When both are
//!   set they must agree.
//! * `MASTER_ADDR` (required when there is more than one process; `127.0.0.1` otherwise) and
//!   `MASTER_PORT` (default 29500, torch's and DeepSpeed's default).
//!
//! With none of the rank variables set, the process is a job of one.

use std::fmt;

/// torch's and DeepSpeed's default rendezvous port.
pub const DEFAULT_MASTER_PORT: u16 = 29_500;

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank, `0..world_size`.
    pub rank: usize,
    /// Number of processes.
    pub world_size: usize,
    /// Rank on this node: the GPU ordinal this process uses.
    pub local_rank: usize,
    /// Host of rank 0's rendezvous listener.
    pub master_addr: String,
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
    /// A variable is not a valid number.
    Invalid {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// The torch-style and Open MPI variables disagree.
    Conflict {
        /// The torch-style variable.
        name: &'static str,
        /// Its value.
        value: usize,
        /// The Open MPI variable.
        ompi_name: &'static str,
        /// Its value.
        ompi_value: usize,
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
                write!(
                    f,
                    "environment variable {name}={value:?} is not a valid number"
                )
            }
            LaunchEnvError::Conflict {
                name,
                value,
                ompi_name,
                ompi_value,
            } => write!(
                f,
                "{name}={value} but {ompi_name}={ompi_value}; they must agree"
            ),
            LaunchEnvError::RankOutOfRange { rank, world_size } => write!(
                f,
                "rank {rank} is not a rank of a world of {world_size} process(es)"
            ),
        }
    }
}

impl std::error::Error for LaunchEnvError {}

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_process_env() -> Result<Self, LaunchEnvError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LaunchEnvError> {
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
        let either = |name: &'static str,
                      ompi_name: &'static str|
         -> Result<Option<usize>, LaunchEnvError> {
            match (number(name)?, number(ompi_name)?) {
                (Some(value), Some(ompi_value)) if value != ompi_value => {
                    Err(LaunchEnvError::Conflict {
                        name,
                        value,
                        ompi_name,
                        ompi_value,
                    })
                }
                (Some(value), _) | (None, Some(value)) => Ok(Some(value)),
                (None, None) => Ok(None),
            }
        };
        let rank = either("RANK", "OMPI_COMM_WORLD_RANK")?;
        let world = either("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")?;
        let local = either("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")?;
        let (rank, world_size) = match (rank, world) {
            (Some(rank), Some(world)) => (rank, world),
            (None, None) => (0, 1),
            (Some(_), None) => {
                return Err(LaunchEnvError::Missing {
                    name: "WORLD_SIZE",
                    because: "RANK is set",
                });
            }
            (None, Some(_)) => {
                return Err(LaunchEnvError::Missing {
                    name: "RANK",
                    because: "WORLD_SIZE is set",
                });
            }
        };
        if rank >= world_size {
            return Err(LaunchEnvError::RankOutOfRange { rank, world_size });
        }
        let master_addr = match lookup("MASTER_ADDR").filter(|a| !a.trim().is_empty()) {
            Some(addr) => addr.trim().to_string(),
            None if world_size == 1 => "127.0.0.1".to_string(),
            None => {
                return Err(LaunchEnvError::Missing {
                    name: "MASTER_ADDR",
                    because: "the job has more than one process",
                });
            }
        };
        let master_port = match lookup("MASTER_PORT") {
            None => DEFAULT_MASTER_PORT,
            Some(value) => value.trim().parse().map_err(|_| LaunchEnvError::Invalid {
                name: "MASTER_PORT",
                value,
            })?,
        };
        Ok(LaunchEnv {
            rank,
            world_size,
            // A job of one on a machine: the rank is the GPU. Otherwise the launcher must say.
            local_rank: local.unwrap_or(if world_size == 1 { 0 } else { rank }),
            master_addr,
            master_port,
        })
    }
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
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "12345"),
        ]);
        assert_eq!(
            parsed,
            Ok(LaunchEnv {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                master_addr: "node0".to_string(),
                master_port: 12345
            })
        );
    }

    #[test]
    fn open_mpi_variables_and_defaults() {
        let parsed = env(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
            ("MASTER_ADDR", "10.0.0.1"),
        ])
        .expect("valid");
        assert_eq!(
            (parsed.rank, parsed.world_size, parsed.local_rank),
            (5, 16, 5)
        );
        assert_eq!(parsed.master_port, DEFAULT_MASTER_PORT);
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
        .expect_err("conflict");
        assert!(conflict.to_string().contains("OMPI_COMM_WORLD_RANK=0"));
    }

    #[test]
    fn a_job_of_one_needs_nothing() {
        assert_eq!(
            env(&[]),
            Ok(LaunchEnv {
                rank: 0,
                world_size: 1,
                local_rank: 0,
                master_addr: "127.0.0.1".to_string(),
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
