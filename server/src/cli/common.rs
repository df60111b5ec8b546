//! What the client commands share: their error ([`CliError`]), how they
//! reach the node ([`ConnArgs`], [`connect`]), how they print (`emit`,
//! [`message_line`], [`message_json`], [`utc`]) and the exit status of the
//! `ctl` commands. Below every command module and `cli.rs`, which only
//! re-exports it, so that no command imports the module that dispatches
//! to it.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use tidemark_client::reliable::{Error, ReliableClient, ReliableConfig};
use tidemark_client::{ClientConfig, Kind, Message};

use crate::token_file::read_token_file;

/// Why a client subcommand failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CliError {
    /// Stable: a node's refusal is its wire error name (`GROUP_NOT_FOUND`,
    /// `OVERLOADED`, ...; format-spec/protocol.md §6.2), what the client
    /// found itself is lowercase (`unavailable`, `invalid_address`,
    /// `crc_mismatch`, `token_file`, `input`, `output`, `signal`, `usage`,
    /// `demo`).
    pub code: &'static str,
    pub message: String,
}

impl CliError {
    pub fn new(code: &'static str, message: impl Into<String>) -> CliError {
        CliError {
            code,
            message: message.into(),
        }
    }

    /// `{"error":{"code":..,"message":..}}`, what `--json` prints.
    pub fn to_json(&self) -> Value {
        json!({ "error": { "code": self.code, "message": self.message } })
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Error> for CliError {
    fn from(e: Error) -> CliError {
        CliError::new(e.kind(), e.to_string())
    }
}

/// How to reach the node.
#[derive(Args, Debug, Clone)]
pub struct ConnArgs {
    /// Address of the node.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub addr: String,
    /// File holding the node's token (a trailing newline is ignored).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Give up after this many milliseconds of failing to reach the node.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

pub(crate) fn nonzero(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(0) => Err("0 is reserved; ids start at 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) fn reliable_config(conn: &ConnArgs) -> Result<ReliableConfig, CliError> {
    let mut client = ClientConfig::new(conn.addr.clone());
    client.client_name = "tidemark-cli".into();
    if let Some(path) = &conn.token_file {
        client.token = Some(read_token_file(path).map_err(|m| CliError::new("token_file", m))?);
    }
    let timeout_ms = conn.timeout_ms.max(1);
    client.io_timeout = Duration::from_millis(timeout_ms.clamp(1000, 10_000));
    let mut config = ReliableConfig::with_client(client);
    config.give_up_after_ms = timeout_ms;
    config.send_timeout_ms = timeout_ms.clamp(1000, 5000);
    config.backoff_max_ms = 500;
    Ok(config)
}

pub(crate) fn connect(conn: &ConnArgs) -> Result<ReliableClient, CliError> {
    let config = reliable_config(conn)?;
    ReliableClient::connect(config).map_err(|e| match e {
        // Names the address already.
        Error::Address { .. } => CliError::from(e),
        e => CliError::new(e.kind(), format!("{}: {e}", conn.addr)),
    })
}

pub(crate) fn output_error(e: std::io::Error) -> CliError {
    CliError::new("output", format!("writing output: {e}"))
}

/// Writes the output; a closed stdout (`| head`) is not a panic.
pub(crate) fn emit(conn_json: bool, human: String, json: Value) -> Result<(), CliError> {
    let text = if conn_json {
        format!("{json}\n")
    } else {
        human
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(output_error)
}

/// One message as a line of text; an edit, a recall, a recalled or lost
/// message says so.
pub fn message_line(m: &Message) -> String {
    let what = match m.kind {
        Kind::Message => payload_text(&m.payload),
        Kind::Edit { target } => format!("(edit of #{target}) {}", payload_text(&m.payload)),
        Kind::Recall { target } => format!("(recall of #{target})"),
        Kind::Recalled => "(recalled)".to_string(),
        Kind::Edited => format!("(edited) {}", payload_text(&m.payload)),
        Kind::Gap => "(lost to damage)".to_string(),
    };
    format!(
        "[group {} #{}] {} from {}: {what}\n",
        m.group,
        m.msg_id,
        utc(m.timestamp_ms),
        m.sender_id,
    )
}

pub(crate) fn payload_text(p: &[u8]) -> String {
    match std::str::from_utf8(p) {
        // Debug-escape control characters so a message cannot rewrite the
        // terminal; plain text prints as is.
        Ok(s) if s.chars().any(char::is_control) => format!("{s:?}"),
        Ok(s) => s.to_string(),
        Err(_) => format!("<{} bytes: {}>", p.len(), hex(p)),
    }
}

pub(crate) fn hex(p: &[u8]) -> String {
    p.iter().map(|b| format!("{b:02x}")).collect()
}

/// One message as JSON: `payload` when it is UTF-8, else `payload_hex`.
pub fn message_json(m: &Message) -> Value {
    let mut v = json!({
        "group": m.group,
        "msg_id": m.msg_id,
        "timestamp_ms": m.timestamp_ms,
        "sender": m.sender_id,
        "client_msg_id": m.client_msg_id,
    });
    // Only what is not a plain message says its kind (the output of a
    // version 1 session stays as it was).
    match m.kind {
        Kind::Message => {}
        Kind::Edit { target } => {
            v["kind"] = json!("edit");
            v["target"] = json!(target);
        }
        Kind::Recall { target } => {
            v["kind"] = json!("recall");
            v["target"] = json!(target);
        }
        Kind::Recalled => v["kind"] = json!("recalled"),
        Kind::Edited => v["kind"] = json!("edited"),
        Kind::Gap => v["kind"] = json!("gap"),
    }
    match std::str::from_utf8(&m.payload) {
        Ok(s) => v["payload"] = json!(s),
        Err(_) => v["payload_hex"] = json!(hex(&m.payload)),
    }
    v
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm` UTC.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// The exit status of a `ctl` command: nothing damaged (verify), or the
/// command did what was asked.
pub const EXIT_CLEAN: u8 = 0;
/// Damage found, or a repair not done (refused, unrepairable, no `--yes`).
pub const EXIT_DAMAGE: u8 = 1;
/// The command could not run.
pub const EXIT_ERROR: u8 = 2;

/// Writes a `ctl` command's text to stdout.
pub(crate) fn out(text: &str) {
    // A closed pipe (`| head`) ends the output; nothing to report.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}
