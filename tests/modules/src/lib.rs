//! Paths of the example and test guest modules, built for `wasm32-wasip2` by this crate's build
//! script (so a bare `cargo test` has them).
//!
//! - [`IMAGE_UPDATER`], [`IMAGE_UPDATER_V2`]: the image-updater example, and a build of it that
//!   annotates its children (for hot swaps).
//! - [`PRIMARY_REPLICA`]: the primary-replica example (a Database as an ordered StatefulSet).
//! - [`CONFIGMAP_PROPAGATOR`]: the configmap-propagator example (a cluster-scoped
//!   ConfigMapPropagation copying a ConfigMap into matching Namespaces).
//! - [`MISBEHAVE`]: a guest whose config picks a misbehaviour; [`MISBEHAVE_FRAGILE`] a build of
//!   it that fails for Widgets labelled `test.wasmop.dev/fragile`; [`MISBEHAVE_HUGE_METADATA`]
//!   a build whose `metadata()` returns a 2 MiB name.
//! - [`WRONG_VERSION`]: a module for `wasmop:reconciler@0.2.0`.
//! - [`HOSTILE`]: a guest that tries to touch what it does not own (see tests/guests/hostile).
//!
//! [`variant`] gives a module its own digest (benchmarks that load many distinct modules).

include!(concat!(env!("OUT_DIR"), "/modules.rs"));

/// Reads a module's bytes.
///
/// # Panics
/// If the file is missing (the build script failed to produce it): this is test support.
pub fn bytes(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read the test module {path}: {e}"))
}

/// Appends `n` to `out` as an unsigned LEB128 number (how a Wasm binary writes sizes and
/// counts), for benchmarks that build variants of a module.
pub fn leb(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// `component` with a custom section `wasmop-bench-variant` holding `index` appended: a valid
/// component with its own digest.
pub fn variant(component: &[u8], index: usize) -> Vec<u8> {
    let name = b"wasmop-bench-variant";
    let payload = index.to_string().into_bytes();
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name);
    body.extend_from_slice(&payload);
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_differ_and_keep_the_original_bytes_first() {
        let base = b"\0asm\x0d\0\x01\0".to_vec();
        let (a, b) = (variant(&base, 1), variant(&base, 2));
        assert_ne!(a, b);
        assert!(a.starts_with(&base));
        // id 0, size, name length 20, the name, the payload "1".
        assert_eq!(a[base.len()], 0);
        assert_eq!(usize::from(a[base.len() + 1]), 1 + 20 + 1);
        assert_eq!(a.len(), base.len() + 2 + 22);
    }
}
