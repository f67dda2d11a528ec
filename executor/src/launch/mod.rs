//! Where this process sits in a job of several processes, as the launcher that started it says:
//! [`env`] reads the variables of torchrun / the DeepSpeed launcher, `mpirun` (Open MPI, MPICH,
//! Intel MPI) and `srun`; [`nodelist`] expands Slurm's compressed host lists. CPU processes
//! (ranks over MPI) and GPU processes (ranks over NCCL) read the same [`LaunchEnv`].

pub mod env;
pub mod nodelist;

pub use env::{DEFAULT_MASTER_PORT, LaunchEnv, LaunchEnvError, Launcher};
