//! A send's payload: the MESSAGE argument's text, standard input (`-`), or
//! a file (`--payload-file`). Arguments are limited by the OS (a 2 MiB
//! argument fails with "Argument list too long"); standard input and files
//! are not, so these two carry any payload a node accepts.
//!
//! Payloads from standard input and files are taken as bytes, unchanged (a
//! trailing newline is part of the message). Reading stops one byte past
//! [`PAYLOAD_READ_BYTES_MAX`], so a runaway input (`cat /dev/zero`) costs
//! at most that much memory before it is refused; the node's own
//! `payload_bytes_max`, usually far lower, is checked by the client before
//! anything is sent.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Args;

use super::CliError;

/// The payload arguments of `send` and `edit`, one definition for both.
#[derive(Args, Debug)]
pub struct PayloadArgs {
    /// The message text: every word after the options, joined by single
    /// spaces (`see you at 6`; quote it to keep other spacing). `-` alone
    /// reads the payload from standard input instead, as bytes (a
    /// trailing newline is part of it); to send a literal `-`, pipe it
    /// (`printf -- - | tidemark send ... -`) or use --payload-file.
    #[arg(
        value_name = "MESSAGE",
        num_args = 1..,
        required_unless_present = "payload_file"
    )]
    message: Vec<String>,
    /// This file's bytes as the payload, in place of MESSAGE (up to the
    /// node's --payload-bytes-max).
    #[arg(long, value_name = "PATH", conflicts_with = "message")]
    payload_file: Option<PathBuf>,
}

impl PayloadArgs {
    /// The payload the arguments name.
    pub fn read(&self) -> Result<Vec<u8>, CliError> {
        let text = (!self.message.is_empty()).then(|| self.message.join(" "));
        read(text.as_deref(), self.payload_file.as_deref())
    }
}

/// The largest payload any node accepts: `payload_bytes_max` is at most
/// 1 GiB less the 44-byte record header (format-spec/storage.md, the
/// limits table).
pub const PAYLOAD_READ_BYTES_MAX: usize = (1 << 30) - 44;

/// The payload `send` sends: `message` as text, unless it is `-` (standard
/// input), or `file`'s bytes (clap makes the two exclusive).
pub fn read(message: Option<&str>, file: Option<&Path>) -> Result<Vec<u8>, CliError> {
    match (message, file) {
        (_, Some(path)) => {
            let f = std::fs::File::open(path).map_err(|e| {
                CliError::new("input", format!("cannot open {}: {e}", path.display()))
            })?;
            read_bounded(f, &path.display().to_string(), PAYLOAD_READ_BYTES_MAX)
        }
        (Some("-"), None) => read_bounded(
            std::io::stdin().lock(),
            "standard input",
            PAYLOAD_READ_BYTES_MAX,
        ),
        (Some(text), None) => Ok(text.as_bytes().to_vec()),
        (None, None) => Err(CliError::new(
            "usage",
            "give the message, `-` for standard input, or --payload-file",
        )),
    }
}

/// Everything `r` holds, refused past `limit` bytes.
fn read_bounded(r: impl Read, what: &str, limit: usize) -> Result<Vec<u8>, CliError> {
    let mut payload = Vec::new();
    r.take(limit as u64 + 1)
        .read_to_end(&mut payload)
        .map_err(|e| CliError::new("input", format!("reading {what}: {e}")))?;
    if payload.len() > limit {
        return Err(CliError::new(
            "input",
            format!(
                "{what} holds more than {limit} bytes, more than any node accepts as a payload"
            ),
        ));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_taken_as_bytes_and_bounded() {
        assert_eq!(read(Some("hi"), None).unwrap(), b"hi");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, b"a\nb\n\xff").unwrap();
        assert_eq!(read(None, Some(&path)).unwrap(), b"a\nb\n\xff");
        let e = read(None, Some(&dir.path().join("missing"))).unwrap_err();
        assert_eq!(e.code, "input");
        // Up to the bound is read; one byte past it is refused without
        // reading further (the input here never ends).
        assert_eq!(read_bounded(&b"12345"[..], "t", 5).unwrap(), b"12345");
        let e = read_bounded(std::io::repeat(b'x'), "test input", 5).unwrap_err();
        assert!(e.message.contains("more than any node accepts"), "{e}");
    }
}
