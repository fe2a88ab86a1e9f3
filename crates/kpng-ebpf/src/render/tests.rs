//! Tests of the render.
