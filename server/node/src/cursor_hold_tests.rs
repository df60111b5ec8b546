//! Tests of the cursor hold of a replica set member
//! (`Connection::hold_for_cursors`, format-spec/cluster.md section 5): an
//! answer that moved or shows a cursor is sent only once a committed
//! Cursors round holds it; a single node answers at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tidemark_engine::{Config, Engine, JoinStart, RoundGate};
use tidemark_protocol::{decode_response, Frame, Request, Response};

use crate::config::{ClusterView, Leadership, Limits, NotLeader};
use crate::connection::Connection;
use crate::handlers::{Action, Ctx, Parked};
use crate::receipts::Receipts;
use crate::subscriptions::Subscriptions;

/// The leader of a replica set, accepting writes.
struct Leader;

impl Leadership for Leader {
    fn refusal(&self) -> Option<NotLeader> {
        None
    }
    // Every read confirmed: these tests are about the cursor hold.
    fn read_ticket(&self) -> u64 {
        1
    }
    fn read_outcome(&self, _ticket: u64) -> Option<bool> {
        Some(true)
    }
    fn on_reads(&self, _wake: std::sync::Arc<dyn Fn() + Send + Sync>) {}
    fn raft_figures(&self) -> Option<crate::config::RaftFigures> {
        None
    }
    // No membership change in these tests.
    fn change(&self, _: crate::config::ChangeRequest, done: crate::config::ChangeDone) {
        done(crate::config::ChangeOutcome::Refused {
            detail: 4,
            message: "not in these tests".into(),
        })
    }
    fn map(&self) -> ClusterView {
        ClusterView {
            node_id: 1,
            leader_id: 1,
            members: vec![(1, "127.0.0.1:7001".into())],
        }
    }
}

/// A round gate the test holds shut: `replicate` waits while `held`, then
/// answers `answer`. Counts the payloads it was given.
#[derive(Default)]
struct HeldGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    held: bool,
    refuse: bool,
    /// Payloads given to `replicate`, including one waiting now.
    seen: usize,
}

impl RoundGate for HeldGate {
    fn replicate(&self, _payload: &[u8]) -> Result<(), String> {
        let mut st = self.state.lock();
        st.seen += 1;
        self.cv.notify_all();
        while st.held {
            self.cv.wait(&mut st);
        }
        if st.refuse {
            return Err("leadership lost".into());
        }
        Ok(())
    }
}

/// Opens the gate when dropped, so that a failed assertion does not leave
/// the engine's commit thread waiting in it (the engine's drop waits for
/// that thread).
struct Hold<'a>(&'a HeldGate);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.held = false;
        self.0.cv.notify_all();
    }
}

impl HeldGate {
    fn hold(&self) -> Hold<'_> {
        self.state.lock().held = true;
        Hold(self)
    }
    fn release(&self, refuse: bool) {
        let mut st = self.state.lock();
        st.held = false;
        st.refuse = refuse;
        self.cv.notify_all();
    }
    fn seen(&self) -> usize {
        self.state.lock().seen
    }
    /// Waits until `n` payloads reached the gate.
    fn wait_seen(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut st = self.state.lock();
        while st.seen < n {
            assert!(
                !self.cv.wait_until(&mut st, deadline).timed_out(),
                "the Cursors round never reached the gate"
            );
        }
    }
}

/// What a replica set member holds its answer for: the work parked once its
/// read ticket is confirmed (`Action::Confirm`; the [`Leader`] here
/// confirms every ticket), or `None` when it is answered at once.
fn held(action: Action) -> Option<Parked> {
    match action {
        Action::Confirm { work, .. } | Action::Park(work) => Some(work),
        _ => None,
    }
}

/// Handles `req` on a READY connection with the given leader gate.
fn handle(
    e: &Engine,
    conn: &mut Connection,
    leadership: Option<&dyn Leadership>,
    req: Request<'_>,
) -> Action {
    let limits = Limits::default();
    let mut subs = Subscriptions::default();
    let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, limits.frame_bytes_max);
    let mut ctx = Ctx {
        leadership,
        ..Ctx::for_tests(e, &limits, &mut subs, &mut receipts)
    };
    match conn.handle_request(&mut ctx, 9, req) {
        Ok(action) => action,
        Err(_) => panic!("the request was not handled"),
    }
}

/// The answer of a parked request once its round settled.
fn settle(e: &Engine, parked: &Parked) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(out) = parked.answer(e, 9) {
            return out.head;
        }
        assert!(Instant::now() < deadline, "the parked answer never settled");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn ack_cursor(frame: &[u8]) -> u64 {
    match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
        Response::Ack { cursor } => cursor,
        other => panic!("not an ACK answer: {other:?}"),
    }
}

/// Group 1 with users 5 and 6, and three messages of user 6.
fn setup(e: &Engine) {
    e.create_group(1).unwrap();
    e.join(1, 5, JoinStart::Earliest).unwrap();
    e.join(1, 6, JoinStart::Earliest).unwrap();
    for c in 1..=3 {
        e.append(1, 6, c, b"m").unwrap();
    }
}

#[test]
fn an_ack_on_a_replica_set_is_answered_only_once_its_cursors_round_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(HeldGate::default());
    let e = Engine::open_gated(Config::new(dir.path()), gate.clone()).unwrap();
    setup(&e);
    let mut conn = Connection::ready(Limits::default().frame_bytes_max);
    let ack = |msg_id| Request::Ack {
        group: 1,
        user: 5,
        msg_id,
    };

    // The gate held: the ACK's answer parks on the round that carries the
    // moved cursor, and is not answered while that round waits.
    let _hold = gate.hold();
    let before = gate.seen();
    let Some(parked) = held(handle(&e, &mut conn, Some(&Leader), ack(2))) else {
        panic!("an ACK on a replica set was answered before its Cursors round");
    };
    assert!(parked.round() > 0, "not held for a Cursors round");
    gate.wait_seen(before + 1);
    assert!(parked.answer(&e, 9).is_none(), "answered before the commit");
    // A read on another connection shows the moved cursor too: it waits
    // for the same round.
    let mut other = Connection::ready(Limits::default().frame_bytes_max);
    let Some(read) = held(handle(
        &e,
        &mut other,
        Some(&Leader),
        Request::Unread { user: 5 },
    )) else {
        panic!("a read showing an uncommitted cursor was answered at once");
    };
    assert_eq!(read.round(), parked.round());
    assert!(read.answer(&e, 9).is_none());
    gate.release(false);
    assert_eq!(ack_cursor(&settle(&e, &parked)), 2);
    settle(&e, &read);
    // No Cursors round in flight now: a read waits for nothing but its
    // read ticket.
    let read = held(handle(
        &e,
        &mut other,
        Some(&Leader),
        Request::Unread { user: 5 },
    ))
    .expect("a leader's read waits for its read ticket");
    assert_eq!(read.round(), 0);
    assert!(read.answer(&e, 9).is_some());

    // A single node answers an ACK from memory (storage.md 15.5).
    let single_dir = tempfile::tempdir().unwrap();
    let single = Engine::open(Config::new(single_dir.path())).unwrap();
    setup(&single);
    let mut conn = Connection::ready(Limits::default().frame_bytes_max);
    match handle(&single, &mut conn, None, ack(2)) {
        Action::Answer(out) => assert_eq!(ack_cursor(&out.head), 2),
        _ => panic!("a single node parked an ACK"),
    }
}

#[test]
fn an_ack_whose_cursors_round_is_refused_is_answered_with_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let gate = Arc::new(HeldGate::default());
    let e = Engine::open_gated(Config::new(dir.path()), gate.clone()).unwrap();
    setup(&e);
    let mut conn = Connection::ready(Limits::default().frame_bytes_max);
    let _hold = gate.hold();
    let before = gate.seen();
    let Some(parked) = held(handle(
        &e,
        &mut conn,
        Some(&Leader),
        Request::Pull {
            group: 1,
            user: 5,
            ack_up_to: 3,
            max_count: 10,
            max_bytes: 1 << 20,
            wait_ms: 0,
        },
    )) else {
        panic!("a PULL that moved a cursor was answered before its Cursors round");
    };
    gate.wait_seen(before + 1);
    gate.release(true);
    match decode_response(&Frame::parse(&settle(&e, &parked)).unwrap()).unwrap() {
        Response::Error(err) => {
            assert_eq!(err.code, tidemark_protocol::ErrorCode::WritesStopped)
        }
        other => panic!("a refused Cursors round answered {other:?}"),
    }
}
