//! Module bytes with their sha256, hashed once when read.
//!
//! A module's sha256 names it everywhere: the digest pinned by a spec or an OCI layer, the
//! rolled-back module, the compiled cache's key. Hashing an 18 MB Python module takes ~10 ms, and
//! a swap used to hash it three times (the registry's digest check, the swap, the engine's cache
//! key). [`Digested`] carries the digest with the bytes from where they are read to the engine.
//!
//! A download hashes its chunks as they arrive ([`Hashing`]), so the digest is ready when the
//! last byte is, instead of ~10 ms later.
//!
//! # Guarantees
//! - [`Digested::sha256`] is the sha256 of [`Digested::bytes`]: [`Digested::new`] hashes the
//!   bytes it takes, [`Hashing`] hashes every chunk it appends, and the bytes cannot be changed
//!   afterwards (only read, or taken back whole with [`Digested::into_bytes`]).
//! - The bytes are held once: a clone, [`Digested::shared`] and [`Digested::into_shared`] share
//!   them (an 18 MB Python module is not copied for the background compile or the rollback
//!   target the host keeps).

use std::ops::Deref;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// Module bytes and their sha256 (see the module docs).
#[derive(Clone, PartialEq, Eq)]
pub struct Digested {
    bytes: Arc<Vec<u8>>,
    sha256: String,
}

impl Digested {
    /// Hashes `bytes` and keeps them with their digest.
    pub fn new(bytes: Vec<u8>) -> Self {
        let sha256 = crate::sha256_hex(&bytes);
        Digested {
            bytes: Arc::new(bytes),
            sha256,
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The sha256 of the bytes, in lowercase hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The bytes, shared (not copied).
    pub fn shared(&self) -> Arc<Vec<u8>> {
        self.bytes.clone()
    }

    /// The bytes, shared (not copied), without the digest.
    pub fn into_shared(self) -> Arc<Vec<u8>> {
        self.bytes
    }

    /// The bytes, given back: copied only if a clone still shares them.
    pub fn into_bytes(self) -> Vec<u8> {
        Arc::unwrap_or_clone(self.bytes)
    }
}

/// Bytes being received, hashed chunk by chunk; [`Hashing::finish`] makes them a [`Digested`].
#[derive(Default)]
pub struct Hashing {
    bytes: Vec<u8>,
    hasher: Sha256,
}

impl Hashing {
    /// Room for `capacity` bytes before the buffer grows.
    pub fn with_capacity(capacity: usize) -> Self {
        Hashing {
            bytes: Vec::with_capacity(capacity),
            hasher: Sha256::new(),
        }
    }

    /// Appends `chunk` and hashes it.
    pub fn extend(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.bytes.extend_from_slice(chunk);
    }

    /// How many bytes were appended.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether nothing was appended.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes appended, with their digest.
    pub fn finish(self) -> Digested {
        Digested {
            bytes: Arc::new(self.bytes),
            sha256: hex::encode(self.hasher.finalize()),
        }
    }
}

impl std::fmt::Debug for Hashing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hashing")
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl Default for Digested {
    /// No bytes (and the sha256 of no bytes).
    fn default() -> Self {
        Digested::new(Vec::new())
    }
}

impl Deref for Digested {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::fmt::Debug for Digested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digested")
            .field("sha256", &self.sha256)
            .field("len", &self.bytes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_the_sha256_of_the_bytes_it_holds() {
        let d = Digested::new(b"abc".to_vec());
        assert_eq!(
            d.sha256(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.bytes(), b"abc");
        assert_eq!(
            Digested::default().sha256(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.into_bytes(), b"abc".to_vec());
    }

    #[test]
    fn clones_and_shares_hold_the_bytes_once() {
        let d = Digested::new(vec![7; 1 << 20]);
        let held = d.bytes().as_ptr();
        let clone = d.clone();
        assert_eq!(clone.bytes().as_ptr(), held, "a clone copied the bytes");
        assert_eq!(d.shared().as_ptr(), held, "shared() copied the bytes");
        assert_eq!(clone.into_shared().as_ptr(), held, "into_shared() copied");
        let last = d.into_bytes();
        assert_eq!(last.as_ptr(), held, "the last holder's bytes were copied");
    }

    #[test]
    fn bytes_hashed_in_chunks_have_the_digest_of_the_whole() {
        let whole: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut hashing = Hashing::with_capacity(10);
        for chunk in whole.chunks(4097) {
            hashing.extend(chunk);
        }
        assert_eq!(hashing.len(), whole.len());
        assert_eq!(hashing.finish(), Digested::new(whole));
        assert_eq!(Hashing::default().finish(), Digested::default());
    }
}
