//! Peer authentication on the Raft port (format-spec/cluster.md section
//! 7.1): the challenge-response handshake that opens every connection
//! between members, frames and snapshot streams alike, before anything
//! else is read from it.
//!
//! Representation: three fixed-size messages. The dialer sends Hello (its
//! id, the id it expects to reach, its nonce); the listener answers
//! Challenge (its nonce and its proof); the dialer checks that proof and
//! sends Proof (its own). A proof is HMAC-SHA256 under the shared cluster
//! secret of the handshake's transcript: the header of the message that
//! carries it (so the listener's proof, kind 2, is never a valid dialer
//! proof, kind 3: no reflection), both node ids and both nonces (fresh on
//! each side for each connection: no replay). After it, the dialer's id
//! is the connection's authenticated peer.
//!
//! The message layouts, their checks ([`check_header`], [`decode_hello`],
//! ...) and the proofs are plain functions of bytes; [`dial`] and
//! [`accept`] drive them over a `TcpStream` under one deadline, reading
//! each message as its bytes arrive and refusing it at its first wrong
//! header byte.
//!
//! Invariants: a connection carries frames or a snapshot stream only after
//! both proofs were checked; proofs are compared in constant time
//! (`hmac`'s `verify_slice`); the secret's bytes are never formatted
//! ([`ClusterSecret`]'s `Debug` shows its length only).
//!
//! Costs: per connection 168 bytes exchanged, two HMAC-SHA256 of 88 bytes
//! on each side, 64 bytes from the OS's random source; memory: the three
//! messages on the stack.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::le::u64_at;

/// The first 6 bytes of every handshake message. Read as a frame's `len`
/// (section 7), `"TMPE"` is 0x45504d54, above any `frame_bytes_max`: a
/// node without authentication closes such a connection.
pub const MAGIC: [u8; 6] = *b"TMPEER";
/// The handshake's version, byte 6 of every message.
pub const VERSION: u8 = 1;
/// Byte 7 of a message: which one it is.
pub const KIND_HELLO: u8 = 1;
pub const KIND_CHALLENGE: u8 = 2;
pub const KIND_PROOF: u8 = 3;
/// Bytes of a message's header (magic, version, kind).
pub const HEADER_BYTES: usize = 8;
/// Bytes of a nonce, and of a proof (HMAC-SHA256).
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;
/// Bytes of each message.
pub const HELLO_BYTES: usize = HEADER_BYTES + 16 + NONCE_BYTES;
pub const CHALLENGE_BYTES: usize = HEADER_BYTES + NONCE_BYTES + MAC_BYTES;
pub const PROOF_BYTES: usize = HEADER_BYTES + MAC_BYTES;
/// Bytes a proof is computed over.
const TRANSCRIPT_BYTES: usize = HEADER_BYTES + 16 + 2 * NONCE_BYTES;
/// The shortest secret taken: 128 bits, so that a recorded handshake
/// (both nonces and a proof) cannot be brute-forced offline.
pub const CLUSTER_SECRET_BYTES_MIN: usize = 16;
/// Default of how long a whole handshake may take, from the accept (or
/// the connect) to the last proof.
pub const HANDSHAKE_MS_DEFAULT: u64 = 2000;

type HmacSha256 = Hmac<Sha256>;

/// The shared secret of a replica set's members (`serve
/// --cluster-token-file`), or the empty one of `--cluster-insecure`.
#[derive(Clone)]
pub struct ClusterSecret {
    key: Arc<[u8]>,
}

impl ClusterSecret {
    /// A secret of at least [`CLUSTER_SECRET_BYTES_MIN`] bytes.
    pub fn new(key: Vec<u8>) -> Result<ClusterSecret, String> {
        if key.len() < CLUSTER_SECRET_BYTES_MIN {
            return Err(format!(
                "a cluster secret of {} bytes: at least {CLUSTER_SECRET_BYTES_MIN} are needed \
                 (e.g. `head -c 32 /dev/urandom | base64 > FILE`)",
                key.len()
            ));
        }
        Ok(ClusterSecret { key: key.into() })
    }

    /// The empty secret of `serve --cluster-insecure`: the handshake runs
    /// as usual (ids are still bound to connections, sizes still bounded)
    /// but anyone can compute its proofs.
    pub fn insecure() -> ClusterSecret {
        ClusterSecret {
            key: Arc::from(&[][..]),
        }
    }

    /// Whether this is [`ClusterSecret::insecure`].
    pub fn is_insecure(&self) -> bool {
        self.key.is_empty()
    }

    fn mac(&self) -> HmacSha256 {
        // Invariant: HMAC takes a key of any length (longer keys are
        // hashed, shorter ones padded); only fixed-key MACs refuse one.
        HmacSha256::new_from_slice(&self.key).expect("invariant: HMAC takes any key length")
    }
}

impl fmt::Debug for ClusterSecret {
    /// The length only: the secret never reaches a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_insecure() {
            true => write!(f, "ClusterSecret(insecure)"),
            false => write!(f, "ClusterSecret({} bytes)", self.key.len()),
        }
    }
}

/// Why a handshake failed. The connection is closed on each.
#[derive(Debug)]
pub enum HandshakeError {
    /// A header byte (magic, version, kind) is not the one expected: the
    /// peer speaks something else, another version, or out of turn.
    Header {
        offset: usize,
        expected: u8,
        got: u8,
    },
    /// The Hello names another node as the one it dials.
    NotForMe { listener: u64 },
    /// The Hello's dialer id is 0, the listener's own, or not a member.
    Dialer { id: u64 },
    /// The peer's proof does not match: it does not hold the secret (or
    /// replays or reflects a proof made for another handshake).
    Proof,
    /// The handshake did not complete before its deadline.
    Timeout,
    /// The connection closed or failed, or the OS gave no random bytes.
    Io(io::Error),
}

impl HandshakeError {
    /// Whether the peer answered something wrong (a stranger, another
    /// set's member, a misconfigured one), as opposed to a connection that
    /// broke or stalled (a peer that died or restarted), which is no news.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, HandshakeError::Io(_) | HandshakeError::Timeout)
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Header {
                offset,
                expected,
                got,
            } => write!(
                f,
                "byte {offset} of a handshake message is {got:#04x}, not {expected:#04x}"
            ),
            HandshakeError::NotForMe { listener } => {
                write!(f, "the peer dials node {listener}, not this one")
            }
            HandshakeError::Dialer { id } => write!(f, "the peer claims id {id}, not a member"),
            HandshakeError::Proof => write!(
                f,
                "the peer's proof does not match (it holds another cluster secret, or none)"
            ),
            HandshakeError::Timeout => write!(f, "the handshake did not complete in time"),
            HandshakeError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// The dialer's first message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The dialer's node id: the connection's peer once authenticated.
    pub dialer: u64,
    /// The node the dialer means to reach.
    pub listener: u64,
    pub nonce: [u8; NONCE_BYTES],
}

/// The listener's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    pub nonce: [u8; NONCE_BYTES],
    /// The listener's proof: [`prove`] of kind 2.
    pub mac: [u8; MAC_BYTES],
}

fn header(kind: u8) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..6].copy_from_slice(&MAGIC);
    h[6] = VERSION;
    h[7] = kind;
    h
}

/// Checks the bytes of a message of `kind` received so far (any prefix):
/// an error at the first header byte that differs.
pub fn check_header(kind: u8, got: &[u8]) -> Result<(), HandshakeError> {
    let expected = header(kind);
    match expected.iter().zip(got).position(|(e, g)| e != g) {
        Some(offset) => Err(HandshakeError::Header {
            offset,
            expected: expected[offset],
            got: got[offset],
        }),
        None => Ok(()),
    }
}

fn array_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut x = [0u8; N];
    x.copy_from_slice(&b[at..at + N]);
    x
}

pub fn encode_hello(h: &Hello) -> [u8; HELLO_BYTES] {
    // Format: { magic: "TMPEER" | version: u8 = 1 | kind: u8 = 1 |
    //   dialer: u64 | listener: u64 | nonce: [u8; 32] }
    let mut b = [0u8; HELLO_BYTES];
    b[..8].copy_from_slice(&header(KIND_HELLO));
    b[8..16].copy_from_slice(&h.dialer.to_le_bytes());
    b[16..24].copy_from_slice(&h.listener.to_le_bytes());
    b[24..].copy_from_slice(&h.nonce);
    b
}

/// A Hello's fields, its header checked (the ids are the caller's to
/// judge).
pub fn decode_hello(b: &[u8; HELLO_BYTES]) -> Result<Hello, HandshakeError> {
    check_header(KIND_HELLO, b)?;
    Ok(Hello {
        dialer: u64_at(b, 8),
        listener: u64_at(b, 16),
        nonce: array_at(b, 24),
    })
}

pub fn encode_challenge(c: &Challenge) -> [u8; CHALLENGE_BYTES] {
    // Format: { magic | version: u8 = 1 | kind: u8 = 2 | nonce: [u8; 32] |
    //   mac: [u8; 32] }
    let mut b = [0u8; CHALLENGE_BYTES];
    b[..8].copy_from_slice(&header(KIND_CHALLENGE));
    b[8..40].copy_from_slice(&c.nonce);
    b[40..].copy_from_slice(&c.mac);
    b
}

pub fn decode_challenge(b: &[u8; CHALLENGE_BYTES]) -> Result<Challenge, HandshakeError> {
    check_header(KIND_CHALLENGE, b)?;
    Ok(Challenge {
        nonce: array_at(b, 8),
        mac: array_at(b, 40),
    })
}

pub fn encode_proof(mac: &[u8; MAC_BYTES]) -> [u8; PROOF_BYTES] {
    // Format: { magic | version: u8 = 1 | kind: u8 = 3 | mac: [u8; 32] }
    let mut b = [0u8; PROOF_BYTES];
    b[..8].copy_from_slice(&header(KIND_PROOF));
    b[8..].copy_from_slice(mac);
    b
}

pub fn decode_proof(b: &[u8; PROOF_BYTES]) -> Result<[u8; MAC_BYTES], HandshakeError> {
    check_header(KIND_PROOF, b)?;
    Ok(array_at(b, 8))
}

/// What a proof of `kind` (2: the listener's, 3: the dialer's) is
/// computed over.
fn transcript(kind: u8, hello: &Hello, listener_nonce: &[u8; NONCE_BYTES]) -> Vec<u8> {
    // Format: { header of the message carrying the proof (8) | dialer: u64 |
    //   listener: u64 | dialer_nonce: [u8; 32] | listener_nonce: [u8; 32] }
    let mut t = Vec::with_capacity(TRANSCRIPT_BYTES);
    t.extend_from_slice(&header(kind));
    t.extend_from_slice(&hello.dialer.to_le_bytes());
    t.extend_from_slice(&hello.listener.to_le_bytes());
    t.extend_from_slice(&hello.nonce);
    t.extend_from_slice(listener_nonce);
    t
}

/// The proof of `kind` for the handshake of `hello` and `listener_nonce`.
pub fn prove(
    secret: &ClusterSecret,
    kind: u8,
    hello: &Hello,
    listener_nonce: &[u8; NONCE_BYTES],
) -> [u8; MAC_BYTES] {
    let mut mac = secret.mac();
    mac.update(&transcript(kind, hello, listener_nonce));
    mac.finalize().into_bytes().into()
}

/// Checks a proof of `kind` in constant time.
pub fn verify(
    secret: &ClusterSecret,
    kind: u8,
    hello: &Hello,
    listener_nonce: &[u8; NONCE_BYTES],
    proof: &[u8; MAC_BYTES],
) -> Result<(), HandshakeError> {
    let mut mac = secret.mac();
    mac.update(&transcript(kind, hello, listener_nonce));
    mac.verify_slice(proof).map_err(|_| HandshakeError::Proof)
}

/// A fresh nonce from the OS's random source.
fn nonce() -> Result<[u8; NONCE_BYTES], HandshakeError> {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n)
        .map_err(|e| HandshakeError::Io(io::Error::other(format!("random source: {e}"))))?;
    Ok(n)
}

/// The dialer's side on a fresh connection to node `peer`: proves that
/// node `me` holds `secret` and checks that the peer does, within
/// `timeout`.
pub fn dial(
    conn: &mut TcpStream,
    secret: &ClusterSecret,
    me: u64,
    peer: u64,
    timeout: Duration,
) -> Result<(), HandshakeError> {
    let deadline = Instant::now() + timeout;
    let hello = Hello {
        dialer: me,
        listener: peer,
        nonce: nonce()?,
    };
    write_by(conn, &encode_hello(&hello), deadline)?;
    let mut b = [0u8; CHALLENGE_BYTES];
    read_by(conn, &mut b, deadline, KIND_CHALLENGE)?;
    let challenge = decode_challenge(&b)?;
    verify(
        secret,
        KIND_CHALLENGE,
        &hello,
        &challenge.nonce,
        &challenge.mac,
    )?;
    let proof = prove(secret, KIND_PROOF, &hello, &challenge.nonce);
    write_by(conn, &encode_proof(&proof), deadline)
}

/// The listener's side of a connection just accepted by node `me`: the
/// dialer's id once it proved that it holds `secret` (and is `admits`ed),
/// within `timeout`.
pub fn accept(
    conn: &mut TcpStream,
    secret: &ClusterSecret,
    me: u64,
    admits: &dyn Fn(u64) -> bool,
    timeout: Duration,
) -> Result<u64, HandshakeError> {
    let deadline = Instant::now() + timeout;
    let mut b = [0u8; HELLO_BYTES];
    read_by(conn, &mut b, deadline, KIND_HELLO)?;
    let hello = decode_hello(&b)?;
    if hello.listener != me {
        return Err(HandshakeError::NotForMe {
            listener: hello.listener,
        });
    }
    if hello.dialer == 0 || hello.dialer == me || !admits(hello.dialer) {
        return Err(HandshakeError::Dialer { id: hello.dialer });
    }
    let own = nonce()?;
    let challenge = Challenge {
        nonce: own,
        mac: prove(secret, KIND_CHALLENGE, &hello, &own),
    };
    write_by(conn, &encode_challenge(&challenge), deadline)?;
    let mut b = [0u8; PROOF_BYTES];
    read_by(conn, &mut b, deadline, KIND_PROOF)?;
    verify(secret, KIND_PROOF, &hello, &own, &decode_proof(&b)?)?;
    Ok(hello.dialer)
}

fn remaining(deadline: Instant) -> Result<Duration, HandshakeError> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(HandshakeError::Timeout),
    }
}

/// Fills `buf` with a message of `kind` by `deadline`, checking its header
/// after every read (the first wrong byte ends it).
fn read_by(
    conn: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    kind: u8,
) -> Result<(), HandshakeError> {
    let mut at = 0;
    while at < buf.len() {
        conn.set_read_timeout(Some(remaining(deadline)?))
            .map_err(HandshakeError::Io)?;
        match conn.read(&mut buf[at..]) {
            Ok(0) => return Err(HandshakeError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => {
                at += n;
                check_header(kind, &buf[..at])?;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HandshakeError::Io(e)),
        }
    }
    Ok(())
}

fn write_by(conn: &mut TcpStream, bytes: &[u8], deadline: Instant) -> Result<(), HandshakeError> {
    conn.set_write_timeout(Some(remaining(deadline)?))
        .map_err(HandshakeError::Io)?;
    conn.write_all(bytes).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => HandshakeError::Timeout,
        _ => HandshakeError::Io(e),
    })
}
