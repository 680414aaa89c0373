//! Every reason skyport reports, defined once: the `reason` of a condition and of an Event, the
//! kinds of object it appears on, whether it is a Warning, and what it means and what to do.
//! docs/troubleshooting.md is checked against this table (`docs_tests.rs`), and no reason is
//! spelled as a string literal anywhere else in `src/` (`literals_tests.rs`).

mod table;

pub use table::Reason;

/// The kinds of object a reason appears on: in a condition, or in an Event about the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Queue,
    Tunnel,
    AwsAccount,
    /// A LoadBalancer Service served by a Tunnel (Events only).
    Service,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Queue, Kind::Tunnel, Kind::AwsAccount, Kind::Service];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Queue => "Queue",
            Kind::Tunnel => "Tunnel",
            Kind::AwsAccount => "AwsAccount",
            Kind::Service => "Service",
        }
    }
}

/// How a reason is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something the user (or the platform team) must look at: a Warning Event, and where it is a
    /// condition's reason, `Ready=False`.
    Warning,
    /// Progress or a change made as asked: a Normal Event, or `Ready=False` while work goes on.
    Normal,
    /// The reason of a condition that holds (`Ready=True`, `Synced=True`); never an Event.
    Ready,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "Warning",
            Severity::Normal => "Normal",
            Severity::Ready => "Ready",
        }
    }
}

/// What the table says about one reason.
#[derive(Clone, Copy, Debug)]
pub struct Definition {
    pub kinds: &'static [Kind],
    pub severity: Severity,
    /// One line: what happened.
    pub meaning: &'static str,
    /// One line: what to do about it ("nothing" for progress and success).
    pub action: &'static str,
}

/// Defines [`Reason`] from the table in `table.rs`: the variant's name is the reason's string,
/// so the string cannot drift from the name code uses.
macro_rules! reasons {
    ($($name:ident: [$($kind:ident),+] $severity:ident, $meaning:literal, $action:literal;)+) => {
        /// A condition or Event reason. Its string ([`Reason::as_str`]) is the variant's name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reason {
            $(#[doc = $meaning] $name,)+
        }

        impl Reason {
            /// Every reason, in the table's order.
            pub const ALL: &[Reason] = &[$(Reason::$name,)+];

            /// The reason as conditions and Events carry it (PascalCase).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$name => stringify!($name),)+
                }
            }

            pub const fn definition(self) -> super::Definition {
                match self {
                    $(Reason::$name => super::Definition {
                        kinds: &[$(super::Kind::$kind,)+],
                        severity: super::Severity::$severity,
                        meaning: $meaning,
                        action: $action,
                    },)+
                }
            }
        }
    };
}
use reasons;

impl Reason {
    pub fn severity(self) -> Severity {
        self.definition().severity
    }

    pub fn applies_to(self, kind: Kind) -> bool {
        self.definition().kinds.contains(&kind)
    }

    /// The reason named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Reason> {
        Reason::ALL.iter().copied().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Reason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Reason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod literals_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_defined_once_with_a_kind_a_meaning_and_an_action() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in Reason::ALL {
            let d = reason.definition();
            assert!(seen.insert(reason.as_str()), "{reason} twice");
            assert!(!d.kinds.is_empty(), "{reason} applies to no kind");
            assert!(!d.meaning.is_empty() && !d.action.is_empty(), "{reason} lacks its text");
            assert!(!d.meaning.contains('|') && !d.action.contains('|'), "{reason}: a table cell cannot hold '|'");
            assert_eq!(Reason::parse(reason.as_str()), Some(*reason));
        }
    }

    #[test]
    fn strings_are_the_variants_names() {
        assert_eq!(Reason::InvalidSpec.as_str(), "InvalidSpec");
        assert_eq!(Reason::ExitServerUnreachable.to_string(), "ExitServerUnreachable");
        assert!(Reason::AccountNotAllowed == "AccountNotAllowed");
        assert_eq!(Reason::parse("NoSuchReason"), None);
    }

    #[test]
    fn only_ready_reasons_are_ready_and_they_are_never_warnings() {
        let ready: Vec<&str> =
            Reason::ALL.iter().filter(|r| r.severity() == Severity::Ready).map(|r| r.as_str()).collect();
        assert_eq!(ready, ["Active", "Available", "ReconcileSuccess", "Usable"]);
        assert_eq!(Reason::ProviderQuotaExceeded.severity(), Severity::Warning);
        assert!(Reason::Failover.applies_to(Kind::Service) && !Reason::Failover.applies_to(Kind::Queue));
    }
}
