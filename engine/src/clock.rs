//! The wall clock, as every layer reads it.

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before
/// it): record timestamps, checkpoint and segment creation times.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
