//! SIGINT, SIGTERM and SIGHUP for `tidemark serve` (protocol.md
//! "Shutdown"; format-spec/cluster.md section 5.1): a graceful shutdown,
//! none lost when a replica set member restarts itself in place, and a
//! reload of the config file.
//!
//! Representation: the three signals are blocked in the main thread before
//! any other thread starts ([`Signals::start`]), so every thread inherits
//! the block and none is ever delivered to a handler; one thread of this
//! module takes them from a `signalfd` (Linux). The first SIGINT or
//! SIGTERM shuts the node down (at once if it serves, else as soon as it
//! does: [`Signals::serving`]); a second one ends the process at once.
//!
//! SIGHUP runs the reload given to [`Signals::start`] on this thread: the
//! config file is read and parsed here, never on the event loop, which
//! only takes the resulting limits at its next pass
//! ([`tidemark_node::Shutdown::apply_live`]); limits from a SIGHUP that
//! came before the node served are handed over when it does.
//!
//! Invariants: a signal is either taken by the thread (and the node shuts
//! down, or does not re-execute itself: [`Signals::stop`] says so) or
//! stays pending on the process. `execve` keeps the blocked mask and the
//! pending set, and [`exec_self`] execs with the mask as it is (Rust's
//! `Command::exec` would clear it, delivering a pending SIGTERM to its
//! default action first), so the new run finds a signal that arrived
//! during the restart at once and shuts down: a supervisor's stop is never
//! lost across the re-exec (a pending SIGHUP makes the new run read its
//! config file again, which it has just read).
//!
//! Costs: one thread asleep in `poll` until a signal or [`Signals::stop`];
//! a reload reads one small file and parses it as at start.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tidemark_node::{LiveLimits, Shutdown};

/// What SIGHUP runs (on the signal thread): reads the configuration again,
/// hands the node's live limits to the given function if they changed,
/// then logs what changed. The line comes after the hand-over, so a
/// request sent once the line is seen is handled with the new limits.
pub type Reload = Box<dyn FnMut(&mut dyn FnMut(LiveLimits)) + Send>;

/// What the signal thread and the node share.
#[derive(Default)]
struct State {
    /// The first signal taken, if any.
    taken: Option<i32>,
    /// Set once the node serves.
    shutdown: Option<Shutdown>,
    /// Live limits of a reload before the node served.
    live: Option<LiveLimits>,
}

/// The signal thread (module docs).
pub struct Signals {
    state: Arc<Mutex<State>>,
    /// Written to stop the thread.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// The three signals, as a set.
fn taken_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

fn last_os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl Signals {
    /// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (to be
    /// called before any other thread starts: threads inherit it) and
    /// starts the thread that takes them. `abrupt` is what a second
    /// stopping signal logs before the process ends; `reload` is what
    /// SIGHUP runs.
    pub fn start(abrupt: String, reload: Reload) -> Result<Signals, String> {
        let set = taken_signals();
        // SAFETY: a valid set; the old mask is not wanted.
        let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(format!(
                "block SIGINT, SIGTERM and SIGHUP: {}",
                std::io::Error::from_raw_os_error(rc)
            ));
        }
        // SAFETY: a valid set; a new descriptor, owned below.
        let sfd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if sfd < 0 {
            return Err(last_os_error("signalfd"));
        }
        // SAFETY: just created, owned by nothing else.
        let sfd = unsafe { OwnedFd::from_raw_fd(sfd) };
        let mut pipe = [0; 2];
        // SAFETY: a two-element array for the two descriptors.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(last_os_error("pipe"));
        }
        // SAFETY: just created, owned by nothing else.
        let (wake, stop) =
            unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-signals".into())
            .spawn(move || take_signals(&sfd, &wake, &shared, &abrupt, reload))
            .map_err(|e| format!("signal thread: {e}"))?;
        Ok(Signals {
            state,
            stop,
            thread: Some(thread),
        })
    }

    /// The node serves: a signal shuts it down through `shutdown` (at once
    /// if one came already).
    pub fn serving(&self, shutdown: Shutdown) {
        let mut st = lock(&self.state);
        if st.taken.is_some() {
            shutdown.request();
        }
        if let Some(live) = st.live.take() {
            shutdown.apply_live(live);
        }
        st.shutdown = Some(shutdown);
    }

    /// Stops the thread (signals from now on stay pending, and survive an
    /// `exec`); the signal it took, if any: then the node was asked to
    /// stop, and must not restart.
    pub fn stop(mut self) -> Option<i32> {
        let one = [1u8];
        // SAFETY: a write of one byte from a live buffer to our pipe.
        unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), 1) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        lock(&self.state).taken
    }
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The thread: waits for a signal or the stop pipe.
fn take_signals(
    sfd: &OwnedFd,
    wake: &OwnedFd,
    state: &Mutex<State>,
    abrupt: &str,
    mut reload: Reload,
) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds, no timeout.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            log::error!("{}", last_os_error("poll for signals"));
            return;
        }
        // A signal first: one that came with the stop is taken, and said.
        if fds[0].revents & libc::POLLIN != 0 {
            // SAFETY: signalfd_siginfo is plain data; the read fills at
            // most its size.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reads at most `size` bytes into `info`.
            let got = unsafe {
                libc::read(
                    sfd.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if got == size as isize {
                let sig = info.ssi_signo as i32;
                if sig == libc::SIGHUP {
                    // Outside the lock: the reload reads a file.
                    reload(&mut |live| {
                        let mut st = lock(state);
                        match &st.shutdown {
                            Some(s) => s.apply_live(live),
                            None => st.live = Some(live),
                        }
                    });
                    continue;
                }
                let mut st = lock(state);
                if st.taken.is_some() {
                    // A graceful shutdown waits for held work (a full disk
                    // holds a round until space returns); an operator who
                    // signals again wants out now.
                    log::error!("signal {sig} again: {abrupt}");
                    std::process::exit(128 + sig);
                }
                log::info!("signal {sig}: shutting down (a second signal stops at once)");
                st.taken = Some(sig);
                if let Some(s) = &st.shutdown {
                    s.request();
                }
            }
            continue;
        }
        if fds[1].revents != 0 {
            return;
        }
    }
}

/// Replaces this process by a new run of the same executable with the
/// same arguments and environment (same pid), keeping the signal mask and
/// the pending signals (module docs). Returns only if the exec failed.
pub fn exec_self() -> std::io::Error {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return e,
    };
    let cstr = |b: &[u8]| {
        CString::new(b).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a NUL byte in an argument",
            )
        })
    };
    let path = match cstr(exe.as_os_str().as_bytes()) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let mut args = vec![path.clone()];
    for a in std::env::args_os().skip(1) {
        match cstr(a.as_bytes()) {
            Ok(c) => args.push(c),
            Err(e) => return e,
        }
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // SAFETY: a NUL-terminated path and a NULL-terminated array of
    // NUL-terminated strings, all alive across the call; execv returns
    // only on failure.
    unsafe { libc::execv(path.as_ptr(), argv.as_ptr()) };
    std::io::Error::last_os_error()
}
