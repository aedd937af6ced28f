//! Workspace root package: owns the cross-crate `tests/` and `examples/`.
