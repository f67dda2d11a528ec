//! dsplan's CUDA C kernels, embedded as sources for run-time compilation with NVRTC.
//!
//! No kernels exist yet: the CUDA backend is tracked as its own issue. This crate holds the
//! place in the workspace so the layout matches the design from the start.
