//! Tests of the backend.
