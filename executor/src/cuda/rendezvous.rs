//! A small TCP rendezvous that hands rank 0's bytes (NCCL's 128-byte unique id) to every other
//! process of the job, on `MASTER_ADDR:MASTER_PORT`. std::net only, no MPI.
//!
//! Protocol (integers little-endian):
//! * each rank `r > 0` connects (retrying until the deadline while rank 0 is not listening yet)
//!   and sends `"DSPLANRV"`, version `u32` = 1, its rank `u32`, the world size `u32`;
//! * rank 0 accepts until it has heard from every rank `1..world`, checking that each hello has
//!   the right magic and version, the same world size, a rank in range and not seen before;
//! * rank 0 then answers every peer `"DSPLANRV"`, status `u8` (0 ok, 1 refused), a length `u32`
//!   and that many bytes: the payload, or the reason for refusing. A bad hello makes rank 0
//!   refuse every peer that connected, so misconfigured jobs fail on every rank with the reason
//!   instead of hanging.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use crate::launch::LaunchEnv;

const MAGIC: &[u8; 8] = b"DSPLANRV";
const VERSION: u32 = 1;
const HELLO_LEN: usize = 20;
/// Pause between attempts (connect, accept).
const POLL: Duration = Duration::from_millis(20);
/// The largest payload or message accepted.
const MAX_PAYLOAD: u32 = 1 << 20;

/// Why the rendezvous failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RendezvousError {
    /// A socket operation failed.
    Io(String),
    /// Not everyone arrived in time.
    Timeout {
        /// Ranks rank 0 had not heard from (empty on a peer, which only knows rank 0 was silent).
        missing: Vec<usize>,
        /// The time waited.
        seconds: u64,
    },
    /// A peer spoke something other than this protocol.
    Protocol(String),
    /// The job is misconfigured (world sizes differ, a rank is out of range or duplicated).
    Mismatch(String),
    /// Rank 0 refused this peer, with its reason.
    Refused(String),
    /// Rank 0 could not produce the bytes to share.
    Payload(String),
}

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RendezvousError::Io(e) => write!(f, "rendezvous: {e}"),
            RendezvousError::Timeout { missing, seconds } if missing.is_empty() => write!(
                f,
                "rendezvous: no answer from rank 0 within {seconds} s (is MASTER_ADDR:MASTER_PORT \
                 right, and is rank 0 running?)"
            ),
            RendezvousError::Timeout { missing, seconds } => write!(
                f,
                "rendezvous: ranks {missing:?} did not arrive within {seconds} s"
            ),
            RendezvousError::Protocol(e) => write!(f, "rendezvous: protocol error: {e}"),
            RendezvousError::Mismatch(e) => write!(f, "rendezvous: misconfigured job: {e}"),
            RendezvousError::Refused(e) => write!(f, "rendezvous: rank 0 refused: {e}"),
            RendezvousError::Payload(e) => {
                write!(f, "rendezvous: rank 0 has nothing to share: {e}")
            }
        }
    }
}

impl std::error::Error for RendezvousError {}

fn io(context: &str) -> impl Fn(std::io::Error) -> RendezvousError + '_ {
    move |e| RendezvousError::Io(format!("{context}: {e}"))
}

/// Rank 0's side: a bound listener waiting for the other ranks.
#[derive(Debug)]
pub struct RendezvousRoot {
    listener: TcpListener,
    world_size: usize,
}

impl RendezvousRoot {
    /// Listens on `addr:port` (`0.0.0.0` for every interface; port 0 picks a free one).
    pub fn bind(addr: &str, port: u16, world_size: usize) -> Result<Self, RendezvousError> {
        let listener = TcpListener::bind((addr, port)).map_err(io("bind"))?;
        listener.set_nonblocking(true).map_err(io("listen"))?;
        Ok(Self {
            listener,
            world_size,
        })
    }

    /// The port actually bound.
    pub fn local_port(&self) -> Result<u16, RendezvousError> {
        Ok(self
            .listener
            .local_addr()
            .map_err(io("local address"))?
            .port())
    }

    /// Waits for ranks `1..world_size` and sends each of them `payload`.
    pub fn serve(self, payload: &[u8], timeout: Duration) -> Result<(), RendezvousError> {
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..self.world_size).map(|_| None).collect();
        let mut problem: Option<RendezvousError> = None;
        let mut arrived = 1; // rank 0 itself
        while arrived < self.world_size && problem.is_none() {
            let (mut stream, from) = match self.listener.accept() {
                Ok(connection) => connection,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing = (1..self.world_size)
                            .filter(|&r| peers[r].is_none())
                            .collect();
                        problem = Some(RendezvousError::Timeout {
                            missing,
                            seconds: timeout.as_secs(),
                        });
                        break;
                    }
                    thread::sleep(POLL);
                    continue;
                }
                Err(e) => return Err(io("accept")(e)),
            };
            let hello = read_hello(&mut stream, deadline);
            match hello.and_then(|(rank, world)| self.check(rank, world, &peers)) {
                Ok(rank) => {
                    peers[rank] = Some(stream);
                    arrived += 1;
                }
                Err(error) => {
                    let _ = send_reply(&mut stream, 1, error.to_string().as_bytes());
                    problem = Some(match error {
                        RendezvousError::Mismatch(e) => {
                            RendezvousError::Mismatch(format!("{e} (connection from {from})"))
                        }
                        other => other,
                    });
                }
            }
        }
        match problem {
            None => {
                for stream in peers.iter_mut().flatten() {
                    send_reply(stream, 0, payload)?;
                }
                Ok(())
            }
            Some(error) => {
                let reason = error.to_string();
                for stream in peers.iter_mut().flatten() {
                    let _ = send_reply(stream, 1, reason.as_bytes());
                }
                Err(error)
            }
        }
    }

    fn check(
        &self,
        rank: usize,
        world: usize,
        peers: &[Option<TcpStream>],
    ) -> Result<usize, RendezvousError> {
        if world != self.world_size {
            return Err(RendezvousError::Mismatch(format!(
                "rank {rank} says WORLD_SIZE={world}, rank 0 says {}",
                self.world_size
            )));
        }
        if rank == 0 || rank >= self.world_size {
            return Err(RendezvousError::Mismatch(format!(
                "a peer claims rank {rank}, outside 1..{}",
                self.world_size
            )));
        }
        if peers[rank].is_some() {
            return Err(RendezvousError::Mismatch(format!(
                "two processes claim rank {rank}"
            )));
        }
        Ok(rank)
    }
}

fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), RendezvousError> {
    let remaining = deadline.saturating_duration_since(Instant::now()).max(POLL);
    stream.set_nonblocking(false).map_err(io("socket mode"))?;
    stream
        .set_read_timeout(Some(remaining))
        .map_err(io("socket timeout"))?;
    stream.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RendezvousError::Timeout {
            missing: Vec::new(),
            seconds: remaining.as_secs(),
        },
        _ => io("read")(e),
    })
}

fn read_hello(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<(usize, usize), RendezvousError> {
    let mut hello = [0u8; HELLO_LEN];
    read_exact_by(stream, &mut hello, deadline)?;
    if &hello[..8] != MAGIC {
        return Err(RendezvousError::Protocol(
            "not a dsplan rendezvous hello".to_string(),
        ));
    }
    let word = |i: usize| u32::from_le_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
    if word(8) != VERSION {
        return Err(RendezvousError::Protocol(format!(
            "protocol version {} (this build speaks {VERSION})",
            word(8)
        )));
    }
    Ok((word(12) as usize, word(16) as usize))
}

fn send_reply(stream: &mut TcpStream, status: u8, bytes: &[u8]) -> Result<(), RendezvousError> {
    let mut message = Vec::with_capacity(13 + bytes.len());
    message.extend_from_slice(MAGIC);
    message.push(status);
    message.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    message.extend_from_slice(bytes);
    stream.write_all(&message).map_err(io("send"))
}

/// A peer's side: connects to rank 0 at `addr:port` and returns the bytes it shares.
pub fn join(
    addr: &str,
    port: u16,
    rank: usize,
    world_size: usize,
    timeout: Duration,
) -> Result<Vec<u8>, RendezvousError> {
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        let attempt = (addr, port)
            .to_socket_addrs()
            .map_err(io("resolve MASTER_ADDR"))?
            .find_map(|a| {
                TcpStream::connect_timeout(&a, POLL.max(Duration::from_millis(200))).ok()
            });
        match attempt {
            Some(stream) => break stream,
            None if Instant::now() >= deadline => {
                return Err(RendezvousError::Timeout {
                    missing: Vec::new(),
                    seconds: timeout.as_secs(),
                });
            }
            None => thread::sleep(POLL),
        }
    };
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(MAGIC);
    for word in [VERSION, rank as u32, world_size as u32] {
        hello.extend_from_slice(&word.to_le_bytes());
    }
    stream.write_all(&hello).map_err(io("send hello"))?;
    let mut header = [0u8; 13];
    read_exact_by(&mut stream, &mut header, deadline)?;
    if &header[..8] != MAGIC {
        return Err(RendezvousError::Protocol(
            "rank 0 did not answer in this protocol".to_string(),
        ));
    }
    let len = u32::from_le_bytes([header[9], header[10], header[11], header[12]]);
    if len > MAX_PAYLOAD {
        return Err(RendezvousError::Protocol(format!(
            "a {len}-byte answer is too long"
        )));
    }
    let mut body = vec![0u8; len as usize];
    read_exact_by(&mut stream, &mut body, deadline)?;
    match header[8] {
        0 => Ok(body),
        _ => Err(RendezvousError::Refused(
            String::from_utf8_lossy(&body).into_owned(),
        )),
    }
}

/// The whole exchange for this process: rank 0 makes the bytes with `make_payload` and serves
/// them on every interface at `MASTER_PORT`; the others fetch them from `MASTER_ADDR`. A job of
/// one makes the bytes and touches no network.
pub fn share_from_root(
    env: &LaunchEnv,
    make_payload: impl FnOnce() -> Result<Vec<u8>, String>,
    timeout: Duration,
) -> Result<Vec<u8>, RendezvousError> {
    if env.rank == 0 {
        // Bind before making the payload, so peers can connect while it is being made.
        let root = (env.world_size > 1)
            .then(|| RendezvousRoot::bind("0.0.0.0", env.master_port, env.world_size))
            .transpose()?;
        let payload = make_payload().map_err(RendezvousError::Payload)?;
        if let Some(root) = root {
            root.serve(&payload, timeout)?;
        }
        Ok(payload)
    } else {
        let master = env.master_addr.as_deref().ok_or_else(|| {
            RendezvousError::Mismatch(
                "MASTER_ADDR is not set: mpirun does not set it; export it to every rank \
                 (`mpirun -x MASTER_ADDR=HOST`)"
                    .to_string(),
            )
        })?;
        join(master, env.master_port, env.rank, env.world_size, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(10);

    fn root(world: usize) -> (RendezvousRoot, u16) {
        let root = RendezvousRoot::bind("127.0.0.1", 0, world).expect("bind loopback");
        let port = root.local_port().expect("port");
        (root, port)
    }

    #[test]
    fn every_rank_receives_rank_zeros_bytes() {
        let payload: Vec<u8> = (0..128).map(|i| (i * 7 % 251) as u8).collect();
        let (root, port) = root(4);
        let peers: Vec<_> = (1..4)
            .map(|rank| thread::spawn(move || join("127.0.0.1", port, rank, 4, LONG)))
            .collect();
        root.serve(&payload, LONG).expect("serve");
        for peer in peers {
            assert_eq!(peer.join().expect("peer thread"), Ok(payload.clone()));
        }
    }

    #[test]
    fn a_peer_that_starts_first_waits_for_rank_zero() {
        // Reserve a free port, release it, start the peer, then bind rank 0 on it.
        let port = root(2).1;
        let peer = thread::spawn(move || join("127.0.0.1", port, 1, 2, LONG));
        thread::sleep(Duration::from_millis(100));
        let root = RendezvousRoot::bind("127.0.0.1", port, 2).expect("rebind");
        root.serve(b"id", LONG).expect("serve");
        assert_eq!(peer.join().expect("peer"), Ok(b"id".to_vec()));
    }

    #[test]
    fn a_world_size_mismatch_fails_on_both_sides() {
        let (root, port) = root(2);
        let peer = thread::spawn(move || join("127.0.0.1", port, 1, 3, LONG));
        let error = root.serve(b"id", LONG).expect_err("mismatch");
        assert!(matches!(error, RendezvousError::Mismatch(ref m) if m.contains("WORLD_SIZE=3")));
        let peer_error = peer.join().expect("peer").expect_err("refused");
        assert!(
            matches!(peer_error, RendezvousError::Refused(ref m) if m.contains("WORLD_SIZE=3"))
        );
    }

    #[test]
    fn a_duplicate_rank_is_refused_to_everyone() {
        let (root, port) = root(3);
        let first = thread::spawn(move || join("127.0.0.1", port, 1, 3, LONG));
        thread::sleep(Duration::from_millis(50));
        let second = thread::spawn(move || join("127.0.0.1", port, 1, 3, LONG));
        let error = root.serve(b"id", LONG).expect_err("duplicate");
        assert!(error.to_string().contains("two processes claim rank 1"));
        for peer in [first, second] {
            assert!(matches!(
                peer.join().expect("peer"),
                Err(RendezvousError::Refused(_))
            ));
        }
    }

    #[test]
    fn missing_ranks_time_out_with_their_numbers() {
        let (root, port) = root(3);
        let peer = thread::spawn(move || join("127.0.0.1", port, 2, 3, LONG));
        let error = root
            .serve(b"id", Duration::from_millis(300))
            .expect_err("rank 1 missing");
        assert_eq!(
            error,
            RendezvousError::Timeout {
                missing: vec![1],
                seconds: 0
            }
        );
        assert!(matches!(
            peer.join().expect("peer"),
            Err(RendezvousError::Refused(_))
        ));
        // A peer with no rank 0 at all gives up at its deadline.
        let lonely = join("127.0.0.1", port, 1, 2, Duration::from_millis(200));
        assert!(matches!(lonely, Err(RendezvousError::Timeout { .. })));
    }

    #[test]
    fn a_job_of_one_needs_no_network() {
        let env = LaunchEnv::from_lookup(|_| None).expect("single process");
        let bytes = share_from_root(&env, || Ok(vec![9; 128]), LONG).expect("shared");
        assert_eq!(bytes, vec![9; 128]);
        let failed = share_from_root(&env, || Err("no NCCL".to_string()), LONG);
        assert_eq!(failed, Err(RendezvousError::Payload("no NCCL".to_string())));
    }
}
