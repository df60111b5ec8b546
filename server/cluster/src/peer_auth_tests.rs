//! Tests of the peer authentication handshake (`peer_auth.rs`, cluster.md
//! section 7.1): the messages and proofs against the spec's vectors
//! (computed outside this code, with Python's `hmac`), and over loopback
//! sockets: a good handshake, a wrong secret refused by either side, a
//! replayed and a reflected proof refused, a Hello for another node or
//! from a non-member refused, a wrong byte refused at once.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::peer_auth::{
    self, accept, decode_challenge, decode_hello, dial, encode_challenge, encode_hello,
    encode_proof, prove, verify, Challenge, ClusterSecret, HandshakeError, Hello, CHALLENGE_BYTES,
    KIND_CHALLENGE, KIND_PROOF,
};

const SECRET: &[u8] = b"an example cluster secret";
const TIMEOUT: Duration = Duration::from_secs(5);

fn secret() -> ClusterSecret {
    ClusterSecret::new(SECRET.to_vec()).unwrap()
}

fn other_secret() -> ClusterSecret {
    ClusterSecret::new(b"another cluster's secret".to_vec()).unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// cluster.md section 7.1's vectors: dialer 1, listener 2, the dialer's
/// nonce 32 bytes 0x11, the listener's 32 bytes 0x22, the secret "an
/// example cluster secret".
#[test]
fn the_messages_and_proofs_are_the_spec_vectors() {
    let hello = Hello {
        dialer: 1,
        listener: 2,
        nonce: [0x11; 32],
    };
    let listener_nonce = [0x22; 32];
    assert_eq!(
        hex(&encode_hello(&hello)),
        "544d504545520101010000000000000002000000000000001111111111111111\
         111111111111111111111111111111111111111111111111"
    );
    let challenge = Challenge {
        nonce: listener_nonce,
        mac: prove(&secret(), KIND_CHALLENGE, &hello, &listener_nonce),
    };
    assert_eq!(
        hex(&encode_challenge(&challenge)),
        "544d5045455201022222222222222222222222222222222222222222222222222222222222222222\
         51e05552c77922f6708ab2eb0b164d75a261e37546e0338443ea81a0079d4c22"
    );
    let proof = prove(&secret(), KIND_PROOF, &hello, &listener_nonce);
    assert_eq!(
        hex(&encode_proof(&proof)),
        "544d5045455201037d82816f9fbdc7028d8e5dca6d4a417438d7d74383b1954ce58ccd97fc0e1d1f"
    );
    assert_eq!(decode_hello(&encode_hello(&hello)).unwrap(), hello);
    assert_eq!(
        decode_challenge(&encode_challenge(&challenge)).unwrap(),
        challenge
    );
    // A proof of one kind is no proof of the other (no reflection), and
    // none under another secret.
    verify(&secret(), KIND_PROOF, &hello, &listener_nonce, &proof).unwrap();
    assert!(verify(&secret(), KIND_CHALLENGE, &hello, &listener_nonce, &proof).is_err());
    assert!(verify(&other_secret(), KIND_PROOF, &hello, &listener_nonce, &proof).is_err());
    // A wrong header byte is named with its offset.
    let mut bad = encode_hello(&hello);
    bad[6] = 2;
    assert!(matches!(
        decode_hello(&bad),
        Err(HandshakeError::Header {
            offset: 6,
            expected: 1,
            got: 2
        })
    ));
}

#[test]
fn a_short_secret_is_refused_and_none_is_ever_formatted() {
    assert!(ClusterSecret::new(b"short".to_vec()).is_err());
    let shown = format!("{:?}", secret());
    assert!(!shown.contains("example"), "{shown}");
    assert!(ClusterSecret::insecure().is_insecure() && !secret().is_insecure());
}

/// A connected pair of loopback sockets: (dialer's end, listener's end).
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let d = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (a, _) = l.accept().unwrap();
    (d, a)
}

/// Node 2's side of a handshake on `conn`, on a thread; members 1 and 3.
fn listen(
    mut conn: TcpStream,
    secret: ClusterSecret,
) -> thread::JoinHandle<Result<u64, HandshakeError>> {
    thread::spawn(move || accept(&mut conn, &secret, 2, &|p| p == 1 || p == 3, TIMEOUT))
}

#[test]
fn a_handshake_with_the_same_secret_names_the_dialer() {
    let (mut d, a) = pair();
    let listener = listen(a, secret());
    dial(&mut d, &secret(), 1, 2, TIMEOUT).unwrap();
    assert_eq!(listener.join().unwrap().unwrap(), 1);
}

#[test]
fn the_dialer_refuses_a_listener_with_another_secret() {
    let (mut d, a) = pair();
    let listener = listen(a, other_secret());
    assert!(matches!(
        dial(&mut d, &secret(), 1, 2, TIMEOUT),
        Err(HandshakeError::Proof)
    ));
    // The dialer sent no proof: the listener never authenticates it.
    drop(d);
    assert!(listener.join().unwrap().is_err());
}

/// A stranger's dialer that follows the protocol but proves with
/// `secret`, or sends `proof` as it is: what the listener answers.
fn stranger(hello: &Hello, proof: impl FnOnce(&Challenge) -> [u8; 32]) -> HandshakeError {
    let (mut d, a) = pair();
    let listener = listen(a, secret());
    d.write_all(&encode_hello(hello)).unwrap();
    let mut b = [0u8; CHALLENGE_BYTES];
    d.read_exact(&mut b).unwrap();
    let challenge = decode_challenge(&b).unwrap();
    d.write_all(&encode_proof(&proof(&challenge))).unwrap();
    listener.join().unwrap().unwrap_err()
}

#[test]
fn the_listener_refuses_a_dialer_with_another_secret() {
    let hello = Hello {
        dialer: 1,
        listener: 2,
        nonce: [7; 32],
    };
    let e = stranger(&hello, |c| {
        prove(&other_secret(), KIND_PROOF, &hello, &c.nonce)
    });
    assert!(matches!(e, HandshakeError::Proof), "{e}");
}

#[test]
fn a_replayed_or_reflected_proof_is_refused() {
    // A good handshake, recorded by an eavesdropper: its Hello and Proof.
    let hello = Hello {
        dialer: 1,
        listener: 2,
        nonce: [9; 32],
    };
    let (mut d, a) = pair();
    let listener = listen(a, secret());
    d.write_all(&encode_hello(&hello)).unwrap();
    let mut b = [0u8; CHALLENGE_BYTES];
    d.read_exact(&mut b).unwrap();
    let first = decode_challenge(&b).unwrap();
    let recorded = prove(&secret(), KIND_PROOF, &hello, &first.nonce);
    d.write_all(&encode_proof(&recorded)).unwrap();
    assert_eq!(listener.join().unwrap().unwrap(), 1);
    // Replayed on a new connection: the listener's nonce is new.
    let e = stranger(&hello, |c| {
        assert_ne!(c.nonce, first.nonce, "a listener nonce came twice");
        recorded
    });
    assert!(matches!(e, HandshakeError::Proof), "replay: {e}");
    // Reflected: the listener's own proof sent back as the dialer's.
    let e = stranger(&hello, |c| c.mac);
    assert!(matches!(e, HandshakeError::Proof), "reflection: {e}");
}

#[test]
fn a_hello_for_another_node_or_from_a_non_member_is_refused() {
    for (dialer, listener) in [(1, 3), (4, 2), (0, 2), (2, 2)] {
        let (mut d, a) = pair();
        let l = listen(a, secret());
        let hello = Hello {
            dialer,
            listener,
            nonce: [1; 32],
        };
        d.write_all(&encode_hello(&hello)).unwrap();
        let e = l.join().unwrap().unwrap_err();
        assert!(
            matches!(
                e,
                HandshakeError::NotForMe { .. } | HandshakeError::Dialer { .. }
            ),
            "{dialer} to {listener}: {e}"
        );
        // Refused without a challenge: the connection just closes.
        let mut rest = Vec::new();
        let _ = d.read_to_end(&mut rest);
        assert!(rest.is_empty(), "{dialer} to {listener} got an answer");
    }
}

#[test]
fn a_wrong_first_byte_ends_the_handshake_at_once() {
    let (mut d, a) = pair();
    let l = listen(a, secret());
    let started = Instant::now();
    // A Raft frame's length where the magic belongs; the rest never comes.
    d.write_all(&[0x1e]).unwrap();
    let e = l.join().unwrap().unwrap_err();
    assert!(matches!(e, HandshakeError::Header { offset: 0, .. }), "{e}");
    assert!(started.elapsed() < TIMEOUT, "it waited for the deadline");
}

#[test]
fn a_silent_peer_fails_at_the_deadline() {
    let (_d, mut a) = pair();
    let short = Duration::from_millis(200);
    let e = accept(&mut a, &secret(), 2, &|_| true, short).unwrap_err();
    assert!(matches!(e, HandshakeError::Timeout), "{e}");
    assert_eq!(peer_auth::HELLO_BYTES, 56);
}
