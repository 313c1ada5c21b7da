//! Sharding: several host replicas share the primaries of every WasmReconciler (`wasmop run
//! --shards auto`), instead of one leader doing all the work.
//!
//! Its parts, one concept each:
//! - [`hash`]: the shard key of an object (FNV-1a 64 of its namespace, uid or owner's uid), the
//!   same function the API server uses for `shardRange()`;
//! - [`ranges`]: sets of ranges of the hash space, their text and selector forms;
//! - [`ring`]: who should hold what: consistent hashing over the live members;
//! - [`membership`]: the member Leases (announce, renew, read, judge expired);
//! - [`handover`]: the protocol that moves ranges between members without two of them ever
//!   reconciling one primary at once, and the fencing of a member that cannot renew;
//! - [`assignment`]: the ranges this replica reconciles now, shared with the controllers, which
//!   admit a reconcile only in them and report what runs for the drain;
//! - [`watch`]: watches that list and watch only this replica's slice: with the API server's
//!   `shardSelector` when it honours it (detected, never assumed), else filtered here;
//! - [`listed`]: what every watch of one reconciler has listed: a gained primary is reconciled
//!   only once all its caches hold it, and only gained primaries are;
//! - [`serving`]: which reconcilers each replica serves or fails to set up; a replica that cannot
//!   serve what a healthy member serves withdraws its share.
//!
//! Admission is not sharded: every replica serves the webhook for every WasmReconciler.
//! See docs/operating.md, section "Sharding", for the protocol, its timings and failure cases.
//!
//! # Guarantees
//! See [`handover`] (never two reconcilers on one primary) and [`watch`] (each replica caches
//! only its slice).
//!
//! # Errors
//! [`ShardError`].

pub mod assignment;
pub mod handover;
pub mod hash;
pub mod listed;
pub mod membership;
pub mod ranges;
pub mod ring;
pub mod serving;
pub mod watch;

pub use assignment::{Admitted, Refused, Shards};
pub use handover::Handover;
pub use listed::{Listed, Lister};
pub use membership::{MemberConfig, Membership};
pub use ranges::Ranges;
pub use serving::{Report, Serving};

/// A failure of the sharding machinery.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The API server refused or could not be reached.
    #[error("sharding: {what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// This replica lost its membership and must stop reconciling at once.
    #[error("sharding: membership lost: {0}")]
    Lost(String),
}

/// How a replica shards (`wasmop run --shards auto`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardConfig {
    /// Membership and its timings.
    pub member: MemberConfig,
    /// Whether to use the API server's shard selector when it honours it (`--shard-filter
    /// auto`); `false` filters on the client only (`--shard-filter client`).
    pub server_side: bool,
}
