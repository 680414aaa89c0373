//! The ExitServerPool controller: one shared exit server carrying the Services of several
//! namespaces, each on its own ports. [`admit`] decides which member gets which ports.

pub mod admit;
pub mod desired;
