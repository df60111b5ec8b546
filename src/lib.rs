//! Workspace root: owns the integration tests and benchmarks.
