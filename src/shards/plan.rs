//! The pure part of sharding: a replica's fair share, which shard Leases it takes, renews and
//! gives up, and the Lease names.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

/// Longest Lease name (a DNS subdomain).
const NAME_MAX: usize = 253;

/// What a Lease says, as listed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holding {
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    pub duration: Duration,
}

impl Holding {
    /// Whether someone holds it at `now`: a holder, renewed less than its duration ago.
    pub fn live(&self, now: Timestamp) -> bool {
        let until =
            |r: Timestamp| r.checked_add(SignedDuration::try_from(self.duration).unwrap_or(SignedDuration::MAX));
        self.holder.as_deref().is_some_and(|h| !h.is_empty())
            && self.renewed.and_then(|r| until(r).ok()).is_some_and(|end| now < end)
    }
}

/// How many shards one replica holds at most: `shards / replicas`, rounded up, so the live
/// replicas together can hold every shard.
pub fn share(shards: usize, replicas: usize) -> usize {
    shards.div_ceil(replicas.max(1))
}

/// What one replica sees on one round.
#[derive(Debug)]
pub struct View<'a> {
    /// This replica's identity.
    pub me: &'a str,
    pub now: Timestamp,
    /// The shards that exist (objects or AwsAccounts in the caches).
    pub shards: &'a BTreeSet<String>,
    /// The shard Leases, by shard.
    pub leases: &'a BTreeMap<String, Holding>,
    /// Live replicas, this one included.
    pub replicas: usize,
    /// Shards this replica holds but no longer acts on, waiting to release them.
    pub draining: &'a BTreeSet<String>,
}

/// What to do with the shard Leases this round.
#[derive(Debug, Default, PartialEq)]
pub struct Steps {
    /// Held: renew (draining ones too, until they are released).
    pub renew: Vec<String>,
    /// Free or expired: take.
    pub take: Vec<String>,
    /// Held beyond the fair share, or of a shard that no longer exists: stop acting, release
    /// after the in-flight reconciles had time to end.
    pub drain: Vec<String>,
}

/// Renews what this replica holds; gives up what exceeds its share (the last by name) or no
/// longer exists; takes free or expired shards while under its share, starting at a point of
/// the shard list that depends on its identity, so replicas starting together try different
/// shards first.
pub fn plan(v: &View) -> Steps {
    let mine = |h: &Holding| h.holder.as_deref() == Some(v.me);
    let held: BTreeSet<&String> = v.leases.iter().filter(|(_, h)| mine(h)).map(|(s, _)| s).collect();
    let share = share(v.shards.len(), v.replicas);
    let acting = |s: &&&String| !v.draining.contains(**s);
    let (active, gone): (Vec<&String>, Vec<&String>) = held.iter().filter(acting).partition(|s| v.shards.contains(**s));
    let mut drain: Vec<String> = gone.into_iter().cloned().collect();
    drain.extend(active.iter().skip(share).map(|s| s.to_string()));
    let free: Vec<&String> = v.shards.iter().filter(|s| v.leases.get(*s).is_none_or(|h| !h.live(v.now))).collect();
    let start = if free.is_empty() { 0 } else { spread(v.me) % free.len() };
    let room = share.saturating_sub(held.len());
    let take = free.iter().cycle().skip(start).take(free.len().min(room)).map(|s| s.to_string()).collect();
    Steps { renew: held.into_iter().cloned().collect(), take, drain }
}

/// A number from the identity, the same on every call.
fn spread(identity: &str) -> usize {
    let digest = Sha256::digest(identity.as_bytes());
    usize::from(digest[0]) << 8 | usize::from(digest[1])
}

/// Live replicas among the replica Leases listed, this one counted whether listed or not.
pub fn live_replicas<'a>(me: &str, leases: impl IntoIterator<Item = &'a Holding>, now: Timestamp) -> usize {
    1 + leases.into_iter().filter(|h| h.live(now) && h.holder.as_deref() != Some(me)).count()
}

/// The Lease name `<group>-<kind>-<key>`, a valid DNS subdomain: characters other than
/// lowercase letters, digits, `-` and `.` become `-`, and a name that would be longer than 253
/// characters is cut and ends in a hash of the whole key instead, so two keys never share one.
pub fn lease_name(group: &str, kind: &str, key: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
                _ => '-',
            })
            .collect()
    };
    let name = format!("{}-{kind}-{}", clean(group), clean(key));
    if name.len() <= NAME_MAX && name == format!("{group}-{kind}-{key}") {
        return name;
    }
    let hash: String = Sha256::digest(key.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let cut: String = name.chars().take(NAME_MAX - hash.len() - 1).collect();
    format!("{}-{hash}", cut.trim_end_matches(['-', '.']))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn held(by: &str, secs: i64) -> Holding {
        Holding { holder: Some(by.into()), renewed: Some(at(secs)), duration: D }
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn view<'a>(
        me: &'a str,
        shards: &'a BTreeSet<String>,
        leases: &'a BTreeMap<String, Holding>,
        replicas: usize,
        draining: &'a BTreeSet<String>,
    ) -> View<'a> {
        View { me, now: at(100), shards, leases, replicas, draining }
    }

    #[test]
    fn the_share_is_the_shards_over_the_live_replicas_rounded_up() {
        assert_eq!(share(5, 2), 3);
        assert_eq!(share(4, 2), 2);
        assert_eq!(share(5, 3), 2);
        assert_eq!(share(1, 3), 1);
        assert_eq!(share(0, 3), 0);
        assert_eq!(share(5, 0), 5, "no replica listed yet: this one");
    }

    #[test]
    fn a_lease_is_live_until_its_duration_after_the_last_renewal() {
        assert!(held("a", 90).live(at(100)));
        assert!(!held("a", 85).live(at(100)), "expired at 100");
        assert!(!Holding { holder: None, ..held("a", 99) }.live(at(100)), "released");
        assert!(!Holding { holder: Some(String::new()), ..held("a", 99) }.live(at(100)));
        assert!(!Holding { renewed: None, ..held("a", 99) }.live(at(100)));
    }

    #[test]
    fn a_lone_replica_takes_every_free_or_expired_shard_and_nothing_live() {
        let shards = set(&["a", "b", "c", "d"]);
        let leases = BTreeMap::from([("b".to_string(), held("other", 95)), ("c".to_string(), held("dead", 80))]);
        let none = BTreeSet::new();
        let steps = plan(&view("me", &shards, &leases, 1, &none));
        let mut take = steps.take.clone();
        take.sort();
        assert_eq!(take, ["a", "c", "d"], "b is held by a live replica");
        assert!(steps.renew.is_empty() && steps.drain.is_empty());
    }

    #[test]
    fn a_replica_takes_only_up_to_its_share_counting_what_it_holds() {
        let shards = set(&["a", "b", "c", "d", "e"]);
        let leases = BTreeMap::from([("a".to_string(), held("me", 95))]);
        let none = BTreeSet::new();
        let steps = plan(&view("me", &shards, &leases, 2, &none));
        assert_eq!(steps.renew, ["a"]);
        assert_eq!(steps.take.len(), 2, "share 3, holds 1: {steps:?}");
        assert!(!steps.take.contains(&"a".to_string()));
        // Replicas starting together try different shards first.
        let firsts: BTreeSet<String> = (0..8)
            .map(|i| plan(&view(&format!("r{i}"), &shards, &BTreeMap::new(), 2, &none)).take[0].clone())
            .collect();
        assert!(firsts.len() > 1, "{firsts:?}");
    }

    #[test]
    fn a_replica_over_its_share_drains_the_extras_and_what_no_longer_exists() {
        let shards = set(&["a", "b", "c", "d"]);
        let mut leases: BTreeMap<String, Holding> =
            ["a", "b", "c", "d", "gone"].iter().map(|s| (s.to_string(), held("me", 95))).collect();
        let none = BTreeSet::new();
        // A second replica appeared: share 2 of 4.
        let steps = plan(&view("me", &shards, &leases, 2, &none));
        assert_eq!(steps.drain, ["gone", "c", "d"]);
        assert!(steps.take.is_empty());
        assert_eq!(steps.renew.len(), 5, "draining shards are renewed until released");
        // While they drain, nothing more is drained or taken.
        let draining = set(&["c", "d", "gone"]);
        let steps = plan(&view("me", &shards, &leases, 2, &draining));
        assert!(steps.drain.is_empty() && steps.take.is_empty(), "{steps:?}");
        // Released, and the other replica took them: steady.
        for s in ["c", "d"] {
            leases.insert(s.to_string(), held("other", 99));
        }
        leases.remove("gone");
        let steps = plan(&view("me", &shards, &leases, 2, &none));
        assert_eq!(steps, Steps { renew: vec!["a".into(), "b".into()], take: vec![], drain: vec![] });
    }

    #[test]
    fn the_shards_of_a_dead_replica_are_taken_once_its_leases_expire() {
        let shards = set(&["a", "b", "c", "d"]);
        let leases: BTreeMap<String, Holding> = BTreeMap::from([
            ("a".to_string(), held("me", 99)),
            ("b".to_string(), held("me", 99)),
            ("c".to_string(), held("dead", 84)),
            ("d".to_string(), held("dead", 84)),
        ]);
        let none = BTreeSet::new();
        let replicas = live_replicas("me", [&held("me", 99), &held("dead", 84)], at(100));
        assert_eq!(replicas, 1);
        let mut take = plan(&view("me", &shards, &leases, replicas, &none)).take;
        take.sort();
        assert_eq!(take, ["c", "d"]);
    }

    #[test]
    fn lease_names_are_valid_and_long_or_odd_keys_are_hashed() {
        assert_eq!(lease_name("skyport", "shard", "account.team.prod"), "skyport-shard-account.team.prod");
        let odd = lease_name("skyport", "replica", "Pod_1a2b3c4d");
        assert!(odd.starts_with("skyport-replica-pod-1a2b3c4d-"), "{odd}");
        assert_ne!(odd, lease_name("skyport", "replica", "pod-1a2b3c4d"), "cleaning never merges two keys");
        let long = lease_name("skyport", "shard", &format!("account.{}.{}", "n".repeat(63), "a".repeat(253)));
        let other = lease_name("skyport", "shard", &format!("account.{}.{}b", "n".repeat(63), "a".repeat(252)));
        assert!(long.len() <= NAME_MAX && other.len() <= NAME_MAX);
        assert_ne!(long, other);
        for name in [&odd, &long] {
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
            assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }
}
