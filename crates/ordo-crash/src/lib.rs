//! Crash explorer (skeleton).
