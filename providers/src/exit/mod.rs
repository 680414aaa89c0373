//! The exit server's protocol: what the operator hands a new VM ([`userdata`]: cloud-init, the
//! tunnel server's and client's configuration) and how it changes a running one afterwards
//! ([`push`]). Both sides use it: the operator's host adapters and the `skyport tunnel` binary
//! on the VM. It knows nothing of providers; `hosts` and the adapters depend on it, never the
//! other way round.

pub mod push;
pub mod userdata;
