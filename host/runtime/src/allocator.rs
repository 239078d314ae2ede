//! The host process's allocator, tuned so plugin calls cause no page-table
//! work on the host side either.
//!
//! glibc's malloc grows each thread arena's heap with `mprotect` and trims
//! it again when its top frees up; a call's host-side buffers (the store,
//! wasi:http's bodies and header maps, hyper's) rise and fall by tens of
//! KiB per call, so every few calls paid a grow and a trim. Measured with
//! `capstan-bench-plugin --breakdown` (`per_call_create_mprotect`): 0.3 to
//! 0.8 `mprotect` per `create`, 0 with 16 MiB of top padding. The padding
//! is address space; only pages written become resident, and the trim
//! threshold still hands back anything over 64 MiB.

/// Keep headroom at the top of glibc's arenas (`M_TOP_PAD` 16 MiB,
/// `M_TRIM_THRESHOLD` 64 MiB). Call once at start-up, before the threads
/// that make calls exist. Does nothing on other C libraries (the musl
/// image's allocator has no such setting).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn keep_allocator_headroom() {
    use std::ffi::c_int;
    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_TOP_PAD: c_int = -2;
    // SAFETY: mallopt only sets malloc's tunables; both values are in
    // range, and it is safe to call at any time.
    unsafe {
        mallopt(M_TOP_PAD, 16 << 20);
        mallopt(M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// Nothing to tune outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_allocator_headroom() {}
