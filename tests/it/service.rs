//! Running the node as a service, with the real binary: the systemd unit
//! in `packaging/` passes `systemd-analyze verify` and gives the node the
//! descriptors it needs, `tidemark completions` and `tidemark man` are
//! what a shell and `man` take, `--log-level` and `--log-format json`
//! shape the log, and SIGHUP applies a changed config file's live
//! settings and names those that need a restart.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig};

use crate::harness::{listening_addr, tidemark_bin};

/// The unit file as shipped.
fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/tidemark.service")
}

/// `tidemark ARGS`: (status success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(tidemark_bin())
        .args(args)
        .output()
        .expect("run tidemark");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The subcommands `tidemark --help` lists (clap's own `help` left out).
fn subcommands() -> Vec<String> {
    let (ok, help, err) = run(&["--help"]);
    assert!(ok, "tidemark --help: {err}");
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| n != "help")
        .collect();
    assert!(names.len() > 10, "subcommands in --help: {names:?}");
    names
}

#[test]
fn completions_for_bash_parse_and_offer_the_subcommands() {
    let (ok, script, err) = run(&["completions", "bash"]);
    assert!(ok, "tidemark completions bash: {err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tidemark.bash");
    std::fs::write(&file, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for name in subcommands() {
        assert!(script.contains(&name), "completions lack `{name}`");
    }
    assert!(script.contains("--slowlog-threshold-us"), "serve's flags");
    let (ok, _, err) = run(&["completions", "tcsh"]);
    assert!(
        !ok && err.contains("tcsh"),
        "an unknown shell is refused: {err}"
    );
}

#[test]
fn the_man_page_is_roff_naming_every_subcommand() {
    let (ok, page, err) = run(&["man"]);
    assert!(ok, "tidemark man: {err}");
    // roff: requests only up to the title (clap_mangen defines a string
    // for the apostrophe first), then the title of section 1.
    let head: Vec<&str> = page.lines().take_while(|l| !l.starts_with(".TH")).collect();
    assert!(
        head.iter().all(|l| l.starts_with('.')) && page.contains("\n.TH tidemark 1 "),
        "not a roff page: {:?}",
        page.chars().take(200).collect::<String>()
    );
    for name in subcommands() {
        // roff writes a hyphen as `\-`.
        let roff = name.replace('-', "\\-");
        assert!(page.contains(&roff), "the man page lacks `{roff}`");
    }
    let (ok, serve, err) = run(&["man", "serve"]);
    assert!(ok, "tidemark man serve: {err}");
    assert!(
        serve.contains("\n.TH tidemark-serve 1 ") && serve.contains("slowlog\\-threshold\\-us"),
        "{serve}"
    );
    let (ok, _, err) = run(&["man", "nope"]);
    assert!(!ok && err.contains("no command `nope`"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tidemark.1");
    std::fs::write(&file, &page).unwrap();
    // `man` itself renders it, where it is installed.
    match Command::new("man")
        .arg("-l")
        .arg(&file)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
    {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("serve"),
                "man -l: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Err(e) => eprintln!("SKIPPED: rendering with man -l: {e}"),
    }
}

/// The unit gives the node at least the descriptors the default
/// configuration needs (else the node lowers its connection and segment
/// limits at start and warns), and `systemd-analyze verify` finds nothing
/// to say about it (run on a copy whose ExecStart is the built binary:
/// verify checks that the binary exists).
#[test]
fn the_systemd_unit_verifies_and_raises_the_descriptor_limit() {
    let unit = std::fs::read_to_string(unit_path()).expect("packaging/tidemark.service");
    let nofile: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .expect("LimitNOFILE=")
        .trim()
        .parse()
        .expect("a number");
    let need = tidemark_node::NodeConfig::new("/var/lib/tidemark").descriptors_needed();
    assert!(nofile >= need, "LimitNOFILE={nofile} < {need} needed");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart=");
    let installed = exec.split_whitespace().next().expect("a binary");
    let Ok(verify) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("SKIPPED: the_systemd_unit_verifies: systemd-analyze not installed (apt-get install systemd)");
        return;
    };
    assert!(verify.status.success());
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("tidemark.service");
    let bin = tidemark_bin().to_str().expect("a UTF-8 path");
    std::fs::write(&copy, unit.replace(installed, bin)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let about_unit: Vec<&str> = err.lines().filter(|l| l.contains("tidemark")).collect();
    assert!(
        out.status.success() && about_unit.is_empty(),
        "systemd-analyze verify: {err}"
    );
}

/// Waits until the file at `log` has a line for which `pick` says yes.
fn wait_for_line(log: &Path, what: &str, pick: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| pick(l)) {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "no {what} in the log:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `tidemark serve ARGS` with its log in `log`, once it listens.
fn start(args: &[&str], log: &Path, rust_log: Option<&str>) -> (Child, String) {
    let mut command = Command::new(tidemark_bin());
    command.arg("serve").args(args);
    match rust_log {
        Some(v) => command.env("RUST_LOG", v),
        None => command.env_remove("RUST_LOG"),
    };
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn tidemark");
    let addr = listening_addr(&mut child);
    (child, addr)
}

fn stat(client: &mut Client, name: &str) -> u64 {
    let stats = client.stats().expect("STATS");
    stats
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("STATS has no {name}"))
        .1
}

fn stop(mut child: Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().expect("wait");
    assert!(status.success(), "exit {status}");
}

#[test]
fn sighup_applies_live_settings_and_names_the_ones_that_need_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tidemark.toml");
    let log = dir.path().join("node.log");
    let data = dir.path().join("data");
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:0\"\nslowlog_threshold_us = 10000\n",
    )
    .unwrap();
    let args = [
        "--config",
        config.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ];
    let (mut child, addr) = start(&args, &log, None);
    let mut client = Client::connect(&ClientConfig::new(addr.clone())).expect("connect");
    assert_eq!(stat(&mut client, "limits.slowlog_threshold_us"), 10_000);
    let long_poll_default = u64::from(tidemark_node::defaults::LONG_POLL_MS_MAX);
    assert_eq!(
        stat(&mut client, "limits.long_poll_ms_max"),
        long_poll_default
    );

    // Live: the slow-log threshold, the longest long poll, the log level;
    // restart-only: the listen address.
    std::fs::write(
        &config,
        "listen = \"127.0.0.1:1\"\nslowlog_threshold_us = 7\nlong_poll_ms_max = 1234\nlog_level = \"debug\"\n",
    )
    .unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let line = wait_for_line(&log, "reload line", |l| l.contains("reloaded"));
    assert!(child.try_wait().unwrap().is_none(), "SIGHUP ended the node");
    let (applied, restart) = line
        .split_once("need a restart")
        .unwrap_or_else(|| panic!("the line names no restart-only change: {line}"));
    for change in [
        "slowlog_threshold_us 10000 -> 7",
        &format!("long_poll_ms_max {long_poll_default} -> 1234"),
        "log_level info -> debug",
    ] {
        assert!(applied.contains(change), "`{change}` not applied: {line}");
    }
    assert!(
        restart.contains("listen 127.0.0.1:0 -> 127.0.0.1:1") && !restart.contains("slowlog"),
        "{line}"
    );
    // The live changes took effect; the node still listens where it did.
    assert_eq!(stat(&mut client, "limits.slowlog_threshold_us"), 7);
    assert_eq!(stat(&mut client, "limits.long_poll_ms_max"), 1234);
    let mut again = Client::connect(&ClientConfig::new(addr)).expect("same address");
    assert_eq!(stat(&mut again, "limits.slowlog_threshold_us"), 7);

    // A file that does not parse changes nothing, and says so.
    std::fs::write(&config, "slowlog_threshold_us = \"soon\"\n").unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let refused = wait_for_line(&log, "refusal", |l| l.contains("not reloaded"));
    assert!(refused.contains("slowlog_threshold_us"), "{refused}");
    assert_eq!(stat(&mut client, "limits.slowlog_threshold_us"), 7);
    stop(child);
}

#[test]
fn log_format_json_writes_one_object_per_line_at_the_level_asked() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node.log");
    let data = dir.path().join("data");
    // `--log-level` wins over RUST_LOG.
    let (child, _) = start(
        &[
            "--data",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--log-level",
            "info",
        ],
        &log,
        Some("error"),
    );
    wait_for_line(&log, "the recovery line", |l| l.contains("recovered:"));
    stop(child);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut levels = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let obj = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {line}"));
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4, "{line}");
        for key in ["ts", "level", "target", "message"] {
            assert!(obj[key].is_string(), "`{key}` in {line}");
        }
        levels.push(obj["level"].as_str().unwrap_or_default().to_string());
    }
    assert!(text.contains("\"starting tidemark"), "{text}");
    assert!(levels.iter().any(|l| l == "INFO"), "{levels:?}");
    // `--log-level warn` leaves the INFO lines out.
    let (child, _) = start(
        &[
            "--data",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "warn",
        ],
        &log,
        Some("info"),
    );
    stop(child);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("INFO"), "{text}");
    let (ok, help, _) = run(&["serve", "--help"]);
    assert!(
        ok && help.contains("--log-level") && help.contains("RUST_LOG"),
        "{help}"
    );
}
