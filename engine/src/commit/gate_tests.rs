//! Tests of the round gate (`gate.rs`): a gated round is neither written,
//! applied nor acknowledged before the gate passes it; the payloads the
//! gate sees are the rounds a follower needs for identical logs; a refused
//! round stops writes and leaves nothing behind.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::tests::{payload, small_config};
use crate::{Engine, Error, RoundGate};

/// A gate the test drives: each payload is sent to the test, which answers.
struct TestGate {
    payloads: Mutex<Sender<Vec<u8>>>,
    answers: Mutex<Receiver<Result<(), String>>>,
}

/// The gate, where its payloads arrive, where the test answers.
type TestGateParts = (Arc<TestGate>, Receiver<Vec<u8>>, Sender<Result<(), String>>);

fn test_gate() -> TestGateParts {
    let (ptx, prx) = channel();
    let (atx, arx) = channel();
    let gate = Arc::new(TestGate {
        payloads: Mutex::new(ptx),
        answers: Mutex::new(arx),
    });
    (gate, prx, atx)
}

impl RoundGate for TestGate {
    fn replicate(&self, payload: &[u8]) -> Result<(), String> {
        self.payloads
            .lock()
            .send(payload.to_vec())
            .map_err(|_| "test gone".to_string())?;
        self.answers
            .lock()
            .recv()
            .map_err(|_| "test gone".to_string())?
    }
}

/// Every record of the group, byte for byte as a read returns them.
fn log_bytes(e: &Engine, g: u64) -> Vec<u8> {
    let batch = e.read(g, 0, usize::MAX, usize::MAX).unwrap();
    batch
        .chunks
        .iter()
        .flat_map(|c| c.bytes().to_vec())
        .collect()
}

#[test]
fn a_gated_round_is_written_only_after_the_gate_passes_it_and_its_payload_is_what_a_follower_needs()
{
    let da = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let (gate, payloads, answers) = test_gate();
    let a = Arc::new(Engine::open_gated(small_config(da.path()), gate).unwrap());
    let b = Engine::open(small_config(db.path())).unwrap();

    let a2 = a.clone();
    let create = std::thread::spawn(move || a2.create_group(7));
    let p1 = payloads.recv().unwrap();
    assert_eq!(Engine::round_index_of(&p1), Some(1));
    // Held at the gate: nothing journaled. (A group is registered in
    // memory at submit, empty, as on a single node: cluster.md section 5.)
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(a.last_round(), 0);
    assert!(!create.is_finished());
    answers.send(Ok(())).unwrap();
    create.join().unwrap().unwrap();
    assert_eq!(a.last_round(), 1);

    let a2 = a.clone();
    let send = std::thread::spawn(move || a2.append(7, 100, 1, &payload(7, 1)));
    let p2 = payloads.recv().unwrap();
    assert_eq!(Engine::round_index_of(&p2), Some(2));
    std::thread::sleep(Duration::from_millis(20));
    // Not visible to a reader, not acknowledged.
    assert_eq!(a.head(7).unwrap(), 0);
    assert!(!send.is_finished());
    answers.send(Ok(())).unwrap();
    assert_eq!(send.join().unwrap().unwrap().msg_id, 1);

    // The gate's payloads are the journal's rounds, and a follower fed
    // them holds the same log.
    let journal: Vec<Vec<u8>> = a
        .read_rounds(1, 2, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|r| r.bytes)
        .collect();
    assert_eq!(journal, vec![p1.clone(), p2.clone()]);
    assert_eq!(b.append_replicated(&p1).unwrap(), 1);
    assert_eq!(b.append_replicated(&p2).unwrap(), 2);
    assert_eq!(log_bytes(&a, 7), log_bytes(&b, 7));
    assert!(!log_bytes(&b, 7).is_empty());
    drop(answers);
}

#[test]
fn a_refused_round_fails_stops_writes_and_leaves_nothing_after_reopen() {
    let da = tempfile::tempdir().unwrap();
    let (gate, payloads, answers) = test_gate();
    let a = Arc::new(Engine::open_gated(small_config(da.path()), gate).unwrap());
    let a2 = a.clone();
    let create = std::thread::spawn(move || a2.create_group(7));
    payloads.recv().unwrap();
    answers.send(Ok(())).unwrap();
    create.join().unwrap().unwrap();

    let a2 = a.clone();
    let send = std::thread::spawn(move || a2.append(7, 100, 1, &payload(7, 1)));
    payloads.recv().unwrap();
    answers.send(Err("leadership lost".into())).unwrap();
    let e = send.join().unwrap().unwrap_err();
    assert!(matches!(e, Error::WritesStopped { .. }), "{e:?}");
    assert_eq!(a.head(7).unwrap(), 0, "a refused round is never applied");
    assert!(a.append(7, 100, 2, b"x").is_err(), "writes stopped");
    drop(answers);
    drop(payloads);
    let a = Arc::into_inner(a).expect("the test holds the only handle");
    let _ = a.close();

    // Reopened: the group exists (committed), the refused send does not,
    // and the next send takes the id the refused one had.
    let a = Engine::open(small_config(da.path())).unwrap();
    assert_eq!(a.last_round(), 1);
    assert_eq!(a.head(7).unwrap(), 0);
    assert_eq!(a.append(7, 100, 1, &payload(7, 1)).unwrap().msg_id, 1);
}
