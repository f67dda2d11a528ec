//! NCCL's unique id handed from rank 0 to every rank by a `broadcast` of the job's host
//! [`Comm`]: under `mpirun` that is MPI's broadcast, so a job needs no `MASTER_ADDR` and no port
//! (the other way is the TCP rendezvous of [`super::rendezvous`]).
//!
//! The [`Comm`] contract moves `f32`s; the id's 128 bytes travel as 32 `f32` bit patterns, which
//! a broadcast copies exactly (no arithmetic touches them). One leading word says whether rank 0
//! could make the id at all, so a failure there ends every rank with the reason instead of
//! leaving them waiting.

use crate::comm::Comm;

/// Bytes in NCCL's unique id.
pub const ID_BYTES: usize = 128;

/// Words on the wire: the status, then the id.
const WORDS: usize = 1 + ID_BYTES / 4;

/// The status word: rank 0 made the id.
const MADE: u32 = 1;
/// The status word: rank 0 could not make the id.
const FAILED: u32 = 2;

/// Rank 0 runs `make_id` and every rank returns its bytes; `Err` names why on every rank.
pub fn share_id_over(
    comm: &mut dyn Comm,
    make_id: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<Vec<u8>, String> {
    let mut words = [0.0f32; WORDS];
    let mut local_failure = None;
    if comm.rank() == 0 {
        match make_id() {
            Ok(id) if id.len() == ID_BYTES => {
                words[0] = f32::from_bits(MADE);
                for (word, bytes) in words[1..].iter_mut().zip(id.chunks_exact(4)) {
                    *word = f32::from_bits(u32::from_le_bytes([
                        bytes[0], bytes[1], bytes[2], bytes[3],
                    ]));
                }
            }
            Ok(id) => {
                local_failure = Some(format!(
                    "the id has {} bytes, NCCL's has {ID_BYTES}",
                    id.len()
                ));
                words[0] = f32::from_bits(FAILED);
            }
            Err(why) => {
                local_failure = Some(why);
                words[0] = f32::from_bits(FAILED);
            }
        }
    }
    comm.broadcast(&mut words, 0)
        .map_err(|e| format!("broadcasting NCCL's id: {e}"))?;
    match words[0].to_bits() {
        MADE => Ok(words[1..]
            .iter()
            .flat_map(|w| w.to_bits().to_le_bytes())
            .collect()),
        FAILED => {
            Err(local_failure
                .unwrap_or_else(|| "rank 0 could not make NCCL's unique id".to_string()))
        }
        other => Err(format!(
            "broadcasting NCCL's id: status word {other:#x} is neither made nor failed"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local::run_ranks;

    /// Every byte value, including the patterns of NaNs, signalling NaNs and subnormals.
    fn awkward_id() -> Vec<u8> {
        let mut id: Vec<u8> = (0..ID_BYTES as u32).map(|i| (i * 37 + 255) as u8).collect();
        id[..4].copy_from_slice(&0x7fa0_0001u32.to_le_bytes()); // a signalling NaN
        id[4..8].copy_from_slice(&0xffff_ffffu32.to_le_bytes()); // a negative quiet NaN
        id[8..12].copy_from_slice(&1u32.to_le_bytes()); // the smallest subnormal
        id
    }

    #[test]
    fn every_rank_gets_rank_zeros_bytes_exactly() {
        for world in [1, 2, 3] {
            let got = run_ranks(world, |mut comm| {
                share_id_over(&mut comm, || Ok(awkward_id()))
            })
            .expect("ranks ran");
            for (rank, id) in got.into_iter().enumerate() {
                assert_eq!(id.as_deref(), Ok(awkward_id().as_slice()), "rank {rank}");
            }
        }
    }

    #[test]
    fn only_rank_zero_makes_the_id() {
        let got = run_ranks(3, |mut comm| {
            let rank = comm.rank();
            share_id_over(&mut comm, move || {
                assert_eq!(rank, 0, "rank {rank} made an id");
                Ok(vec![7; ID_BYTES])
            })
        })
        .expect("ranks ran");
        assert!(got.iter().all(|id| id.as_deref() == Ok(&[7; ID_BYTES][..])));
    }

    #[test]
    fn a_failure_on_rank_zero_ends_every_rank_with_a_reason() {
        let got = run_ranks(2, |mut comm| {
            share_id_over(&mut comm, || Err("libnccl not found".to_string()))
        })
        .expect("ranks ran");
        assert_eq!(got[0], Err("libnccl not found".to_string()));
        assert_eq!(
            got[1],
            Err("rank 0 could not make NCCL's unique id".to_string())
        );
        let short = run_ranks(2, |mut comm| share_id_over(&mut comm, || Ok(vec![1; 5])))
            .expect("ranks ran");
        assert!(short[0].as_ref().is_err_and(|e| e.contains("5 bytes")));
        assert!(short[1].is_err());
    }
}
