//! The token file of `tidemark serve --token-file` and of the client
//! commands and the demo (`--token-file`): one reader, so that a node and
//! its clients read the same file the same way.

use std::path::Path;

/// Reads a token file as `tidemark serve` does: trailing newlines ignored.
pub fn read_token_file(path: &Path) -> Result<Vec<u8>, String> {
    let mut token = std::fs::read(path)
        .map_err(|e| format!("cannot read token file {}: {e}", path.display()))?;
    while token.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        token.pop();
    }
    if token.is_empty() {
        return Err(format!("token file {} is empty", path.display()));
    }
    Ok(token)
}
